// The `exitscope` command: dispatches to one subcommand per layer above the library.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "exitscope/version.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*main)(int, char**);
};

constexpr Command kCommands[] = {
    {"run", "boot a guest on /dev/kvm in the reference VMM, instrumented; print the report",
     exitscope::cli::RunMain},
    {"inspect", "summarise a recorder dump: exits per kind/device/register, slow exits, stalls",
     exitscope::cli::InspectMain},
    {"kvm", "kernel-side exit analysis from KVM tracepoints (record | report | live | stat)",
     exitscope::cli::KvmMain},
    {"timeline",
     "exit timeline of a dump and/or kernel trace for ui.perfetto.dev (Trace Event JSON)",
     exitscope::cli::TimelineMain},
};

void Usage(FILE* out) {
  std::fprintf(out,
               "exitscope: what was the VMM doing instead of running the vCPU?\n\n"
               "usage: exitscope <command> [options]\n"
               "       exitscope help <command>\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-9s %s\n", c.name, c.summary);
  std::fprintf(out, "\nexit status: 0 success, 1 runtime failure, 2 bad usage or bad input\n");
}

const Command* Find(const char* name) {
  for (const auto& c : kCommands)
    if (std::strcmp(c.name, name) == 0) return &c;
  return nullptr;
}

// Calls `cmd` with argv[0] = "exitscope <name>" followed by args.
int Dispatch(const Command& cmd, int argc, char** argv) {
  std::string self = std::string("exitscope ") + cmd.name;
  std::vector<char*> args;
  args.push_back(self.data());
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  return cmd.main(static_cast<int>(args.size()), args.data());
}

// Runs the command line. Nothing a command throws reaches the C++ runtime: it becomes one
// line and exit status 1 (a runtime failure: the command's own errors are reported before
// this, with their own status).
int Main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    std::printf("exitscope %s\n", ES_VERSION_STRING);  // the headers' version (version.h)
    return 0;
  }
  if (!std::strcmp(argv[1], "help")) {
    if (argc < 3) {
      Usage(stdout);
      return 0;
    }
    const Command* c = Find(argv[2]);
    if (!c) {
      std::fprintf(stderr, "exitscope: unknown command '%s' (see exitscope --help)\n", argv[2]);
      return 2;
    }
    // `help kvm stat`: the subcommand's own --help.
    char help[] = "--help";
    std::vector<char*> hargv(argv + 3, argv + argc);
    hargv.push_back(help);
    return Dispatch(*c, static_cast<int>(hargv.size()), hargv.data());
  }
  const Command* c = Find(argv[1]);
  if (!c) {
    std::fprintf(stderr, "exitscope: unknown command '%s' (see exitscope --help)\n", argv[1]);
    return 2;
  }
  return Dispatch(*c, argc - 2, argv + 2);
}

}  // namespace

int main(int argc, char** argv) {
  const char* self = argc > 1 ? argv[1] : "";
  try {
    return Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "exitscope %s: out of memory\n", self);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exitscope %s: internal error: %s\n", self, e.what());
  } catch (...) {
    std::fprintf(stderr, "exitscope %s: internal error: unknown exception\n", self);
  }
  return 1;
}
