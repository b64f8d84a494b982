// Placeholder until the owner of `exitscope inspect` lands it; replaced, never shipped.
#include <cstdio>

#include "cli/commands.h"

int exitscope::cli::InspectMain(int, char**) {
  std::fprintf(stderr, "exitscope inspect: not built yet\n");
  return 1;
}
