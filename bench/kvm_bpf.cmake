# bench/kvm_bpf.cmake: the cost per exit of watching KVM from the kernel (none / tracefs
# streaming / `kvm stat --bpf`), measured in one run (owned with src/sources/bpf).
#   build/bench/kvm_bpf_overhead [--rounds N] [--iterations N] | --interleave SECONDS
add_executable(kvm_bpf_overhead ${CMAKE_CURRENT_LIST_DIR}/kvm_bpf_overhead.cc)
target_link_libraries(kvm_bpf_overhead PRIVATE exitscope_vmm exitscope_bpf nlohmann_json::nlohmann_json)
target_compile_definitions(kvm_bpf_overhead PRIVATE EXITSCOPE_BINARY_DIR="${CMAKE_BINARY_DIR}")
add_dependencies(kvm_bpf_overhead exitscope_guests exitscope)
