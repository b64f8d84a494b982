// Placeholder until the owner of `exitscope kvm` lands it; replaced, never shipped.
#include <cstdio>

#include "cli/commands.h"

int exitscope::cli::KvmMain(int, char**) {
  std::fprintf(stderr, "exitscope kvm: not built yet\n");
  return 1;
}
