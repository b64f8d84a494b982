# Recorder benchmarks -> build/bench/recorder_benchmark (bench/CMakeLists.txt sets the output dir).
add_executable(recorder_benchmark ${CMAKE_CURRENT_LIST_DIR}/recorder_benchmark.cc)
target_link_libraries(recorder_benchmark PRIVATE exitscope_recorder benchmark::benchmark)

# The recorder at scale (issue 12): 256 vCPU rings x 65536 records, writers on every core while
# a reader snapshots and dumps -> build/bench/recorder_scale [--help].
add_executable(recorder_scale ${CMAKE_CURRENT_LIST_DIR}/recorder_scale.cc)
target_link_libraries(recorder_scale PRIVATE exitscope_recorder)
