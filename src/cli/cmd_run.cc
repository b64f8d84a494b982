// Placeholder until the owner of `exitscope run` lands it; replaced, never shipped.
#include <cstdio>

#include "cli/commands.h"

int exitscope::cli::RunMain(int, char**) {
  std::fprintf(stderr, "exitscope run: not built yet\n");
  return 1;
}
