#include "cli/parse_args.h"

#include <cstdio>

namespace exitscope::cli {

std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argc > 0 ? argv[0] : "exitscope", e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace exitscope::cli
