# Recorder benchmarks -> build/bench/recorder_benchmark (bench/CMakeLists.txt sets the output dir).
add_executable(recorder_benchmark ${CMAKE_CURRENT_LIST_DIR}/recorder_benchmark.cc)
target_link_libraries(recorder_benchmark PRIVATE exitscope_recorder benchmark::benchmark)

# The recorder at scale (issue 12): 256 vCPU rings x 65536 records, writers on every core while
# a reader snapshots and dumps -> build/bench/recorder_scale [--help].
add_executable(recorder_scale ${CMAKE_CURRENT_LIST_DIR}/recorder_scale.cc)
target_link_libraries(recorder_scale PRIVATE exitscope_recorder)

# Stack captures (docs/stacks.md, "Cost"): one capture's cost on the watchdog and on the stuck
# thread, the per-exit hot path against two clock reads, and the hot path with and without frame
# pointers, all in one run -> build/bench/stack_capture_benchmark.
add_library(stack_loop_fp OBJECT ${CMAKE_CURRENT_LIST_DIR}/stack_capture_loop.cc)
target_compile_definitions(stack_loop_fp PRIVATE STACK_LOOP_NAME=RecordLoopFramePointers)
target_link_libraries(stack_loop_fp PRIVATE exitscope_recorder)
add_library(stack_loop_nofp OBJECT ${CMAKE_CURRENT_LIST_DIR}/stack_capture_loop.cc)
target_compile_definitions(stack_loop_nofp PRIVATE STACK_LOOP_NAME=RecordLoopNoFramePointers)
target_compile_options(stack_loop_nofp PRIVATE -fomit-frame-pointer -momit-leaf-frame-pointer)
target_link_libraries(stack_loop_nofp PRIVATE exitscope_recorder)
add_executable(stack_capture_benchmark ${CMAKE_CURRENT_LIST_DIR}/stack_capture_benchmark.cc
  $<TARGET_OBJECTS:stack_loop_fp> $<TARGET_OBJECTS:stack_loop_nofp>)
target_include_directories(stack_capture_benchmark PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(stack_capture_benchmark PRIVATE exitscope_recorder)
