# bench/kvm_stacks.cmake: what `kvm stat --bpf --stacks` costs per context switch of a thread
# inside an exit, and per switch it filters out (owned with src/sources/bpf/offcpu_stacks.bpf.c).
#   build/bench/offcpu_stacks_switch_cost [--rounds N] [--iterations N]
add_executable(offcpu_stacks_switch_cost ${CMAKE_CURRENT_LIST_DIR}/offcpu_stacks_switch_cost.cc)
target_link_libraries(offcpu_stacks_switch_cost PRIVATE exitscope_bpf Threads::Threads)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/offcpu_stacks_switch_cost.cc PROPERTIES
  COMPILE_OPTIONS "-fno-omit-frame-pointer")
