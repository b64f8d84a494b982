// tests/support/tracefs.h: what the tests on the real tracefs share.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "sources/tracefs_session.h"

namespace exitscope::test {

// The real tracefs (EXITSCOPE_TRACEFS ignored), or "" with the reason in *why.
inline std::string RealTracefs(std::string* why) {
  ::unsetenv("EXITSCOPE_TRACEFS");
  auto dir = sources::FindTracefs();
  if (!dir) {
    *why = dir.error().message;
    return "";
  }
  return *dir;
}

// The names under TRACEFS/instances, sorted: a test compares them before and after.
inline std::vector<std::string> Instances(const std::string& tracefs) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir((tracefs + "/instances").c_str())) {
    while (dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace exitscope::test

// Declares `dir` as the real tracefs, or skips the test with the reason.
#define REQUIRE_TRACEFS(dir)                                            \
  std::string skip_reason;                                              \
  const std::string dir = ::exitscope::test::RealTracefs(&skip_reason); \
  if (dir.empty()) GTEST_SKIP() << "tracefs not usable: " << skip_reason
