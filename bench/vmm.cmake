# bench/vmm.cmake: the recording-overhead benchmark of the reference VMM (owned with src/vmm).
#   build/bench/vmm_overhead [--rounds N] [--iterations N] [--vcpus N] [--with-tracepoints]
add_executable(vmm_overhead ${CMAKE_CURRENT_LIST_DIR}/vmm_overhead.cc)
target_link_libraries(vmm_overhead PRIVATE exitscope_vmm)
add_dependencies(vmm_overhead exitscope_guests)
