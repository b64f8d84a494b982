# tracefs reading pipeline benchmarks -> build/bench/tracefs_benchmark (needs root and tracefs;
# each benchmark reports why it skipped otherwise).
add_executable(tracefs_benchmark ${CMAKE_CURRENT_LIST_DIR}/tracefs_benchmark.cc)
target_link_libraries(tracefs_benchmark PRIVATE exitscope_sources benchmark::benchmark)
