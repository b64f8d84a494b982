# Recorder benchmarks -> build/bench/recorder_benchmark (bench/CMakeLists.txt sets the output dir).
add_executable(recorder_benchmark ${CMAKE_CURRENT_LIST_DIR}/recorder_benchmark.cc)
target_link_libraries(recorder_benchmark PRIVATE exitscope_recorder benchmark::benchmark)
