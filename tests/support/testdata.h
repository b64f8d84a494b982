// tests/support/testdata.h: the captures committed under testdata/, for the tests that run a
// reader over every one of them.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace exitscope::test {

// Every *.dat under testdata/, sorted.
inline std::vector<std::string> CommittedDats() {
  std::vector<std::string> out;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(std::string(EXITSCOPE_TESTDATA_DIR))) {
    if (e.is_regular_file() && e.path().extension() == ".dat") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace exitscope::test
