# The timeline at 1 M exits (issue 9) -> build/bench/timeline_benchmark [--help].
add_executable(timeline_benchmark ${CMAKE_CURRENT_LIST_DIR}/timeline_benchmark.cc)
target_link_libraries(timeline_benchmark PRIVATE exitscope_report exitscope_recorder)
