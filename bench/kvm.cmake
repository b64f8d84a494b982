# bench/kvm.cmake: `exitscope kvm report` reading speed against trace-cmd report and perf script.
#   build/bench/kvm_report_benchmark [--exits N] [--keep DIR]
add_executable(kvm_report_benchmark ${CMAKE_CURRENT_LIST_DIR}/kvm_report_benchmark.cc)
target_link_libraries(kvm_report_benchmark PRIVATE exitscope_analysis exitscope_sources fmt::fmt)
target_compile_definitions(kvm_report_benchmark PRIVATE
  EXITSCOPE_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  EXITSCOPE_BINARY_DIR="${CMAKE_BINARY_DIR}")

# kvm report at the decompression floor (issue 27): one capture, the floor (pages loaded,
# chunks decompressed), the report (fast path, checked path, threads), trace-cmd report and
# perf script, with the ratios.
#   build/bench/kvm_dat_floor_benchmark [CAPTURE.dat] [--record DIR [--iterations N] | --tile N]
#     [--keep DIR] [--runs N]
add_executable(kvm_dat_floor_benchmark ${CMAKE_CURRENT_LIST_DIR}/kvm_dat_floor_benchmark.cc)
target_link_libraries(kvm_dat_floor_benchmark PRIVATE exitscope_analysis exitscope_sources
  fmt::fmt)
target_compile_definitions(kvm_dat_floor_benchmark PRIVATE
  EXITSCOPE_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  EXITSCOPE_BINARY_DIR="${CMAKE_BINARY_DIR}")
