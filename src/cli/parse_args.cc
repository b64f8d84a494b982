#include "cli/parse_args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include "base/output_file.h"
#include "fmt/format.h"

namespace exitscope::cli {

namespace {

// An empty value never makes sense for a flag that takes one: a path, an address, a name.
const CLI::Validator kNonEmpty = CLI::Validator(
    [](std::string& s) -> std::string { return s.empty() ? "an empty value is not allowed" : ""; },
    "");

}  // namespace

std::string RephraseParseError(std::string_view what) {
  // ConversionError: "Could not convert: NAME = VALUE".
  static const std::regex kConvert(R"(^Could not convert: (\S+) = (.*)$)");
  // CLI::Range (and PositiveNumber / NonNegativeNumber), inside a ValidationError
  // "NAME: Value V not in range A to B", possibly within "(...) AND (...)".
  static const std::regex kRange(R"(^(\S+): .*Value (\S*) not in range .*$)");
  const std::string s(what);
  std::smatch m;
  if (std::regex_match(s, m, kConvert))
    return m[1].str() + ": '" + m[2].str() + "' is not a number this flag accepts";
  if (std::regex_match(s, m, kRange)) return m[1].str() + ": '" + m[2].str() + "' is out of range";
  return s;
}

std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv) {
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() > 0) opt->check(kNonEmpty);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argc > 0 ? argv[0] : "exitscope",
                 RephraseParseError(e.what()).c_str());
    return 2;
  }
  return std::nullopt;
}

int ExitStatusFor(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk:
      return 0;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kAlreadyExists:
    case ErrorCode::kNotFound:
    case ErrorCode::kCorrupt:
    case ErrorCode::kUnsupported:
      return 2;
    case ErrorCode::kIo:
    case ErrorCode::kUnavailable:
    case ErrorCode::kPermission:
    case ErrorCode::kInternal:
      return 1;
  }
  return 1;
}

Status WriteOutput(const std::string& path, std::string_view text) {
  const std::string p = path.empty() ? "-" : path;
  return base::WriteOutputFile(p, text, {.label = "-o " + p, .what = "a report"});
}

int ReportError(const char* self, const Error& e) {
  std::fprintf(stderr, "%s: %s\n", self, e.message.c_str());
  return ExitStatusFor(e.code);
}

int UsageError(const char* self, std::string_view what) {
  std::fprintf(stderr, "%s: %.*s\n", self, static_cast<int>(what.size()), what.data());
  return 2;
}

namespace {

// Parses the whole of `s` as a finite double; false on anything else ("nan", "inf", "1e999",
// "3x", "").
bool ParseFinite(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

CLI::Validator FiniteValidator(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& s) -> std::string {
        double v = 0;
        if (!ParseFinite(s, &v)) return "'" + s + "' is not a finite number";
        if (v < 0 || (!allow_zero && v == 0))
          return "'" + s + "' must be " + (allow_zero ? ">= 0" : "> 0");
        return {};
      },
      allow_zero ? "NUMBER>=0" : "NUMBER>0");
}

}  // namespace

const CLI::Validator kFiniteNonNegative = FiniteValidator(true);
const CLI::Validator kFinitePositive = FiniteValidator(false);
const CLI::Validator kNonNegativeInteger = CLI::Validator(
    [](std::string& s) -> std::string {
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
        return "'" + s + "' is not a non-negative integer";
      errno = 0;
      (void)std::strtoull(s.c_str(), nullptr, 10);
      if (errno == ERANGE) return "'" + s + "' is too large";
      return {};
    },
    "INTEGER>=0");

CLI::Validator NumberIn(double lo, double hi, std::string_view unit) {
  const std::string range = fmt::format("{}..{}{}{}", lo, hi, unit.empty() ? "" : " ", unit);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double v = 0;
        if (!ParseFinite(s, &v)) return "'" + s + "' is not a finite number (" + range + ")";
        if (v < lo || v > hi) return "'" + s + "' is out of range: " + range;
        return {};
      },
      "NUMBER in " + range);
}

CLI::Validator IntegerIn(uint64_t lo, uint64_t hi, std::string_view unit) {
  const std::string range = fmt::format("{}..{}{}{}", lo, hi, unit.empty() ? "" : " ", unit);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "'" + s + "' is not an integer (" + range + ")";
        errno = 0;
        const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
        if (errno == ERANGE || v < lo || v > hi) return "'" + s + "' is out of range: " + range;
        return {};
      },
      "INTEGER in " + range);
}

}  // namespace exitscope::cli
