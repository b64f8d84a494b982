// libFuzzer target for the dump reader (ParseDump) and the register-map parser: any input must
// give a clean result or error, never a crash, a sanitizer report or a hang.
//
// libFuzzer needs clang; std::expected (status.h) needs clang >= 16 with libstdc++ 12, so on
// this project's machines (clang 14) build the replay driver with g++ instead:
//
//   g++ -std=c++23 -g -O1 -fsanitize=address,undefined -DEXITSCOPE_FUZZ_REPLAY -Iinclude -Isrc \
//     fuzz/dump_fuzzer.cc src/recorder/*.cc build/src/recorder/builtin_maps.cc -o /tmp/dump_replay
//   /tmp/dump_replay some.esdump data/regmaps/nvme.map
//
// and, where clang >= 16 is available, the fuzzer:
//
//   clang++ -std=c++2b -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
//     fuzz/dump_fuzzer.cc src/recorder/*.cc build/src/recorder/builtin_maps.cc -o /tmp/dump_fuzzer
//   /tmp/dump_fuzzer -max_total_time=60 /tmp/corpus
//
// Seed the corpus with real dumps (e.g. `kill -USR1` a VMM using the recorder).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "exitscope/dump.h"
#include "exitscope/register_map.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto d = exitscope::ParseDump(bytes, "fuzz")) {
    // A dump that parses must also re-serialise and name every exit without trouble.
    for (const auto& v : d->vcpus) {
      for (const auto& e : v.exits) (void)d->DescribeExit(e);
    }
    (void)exitscope::SerializeDump(*d, {.include_guest_data = true});
  }
  if (auto m = exitscope::RegisterMap::Parse(bytes, "fuzz.map")) {
    for (uint64_t off = 0; off < 64; ++off) {
      (void)m->Format(m->Resolve(off, 4, exitscope::AccessDir::kRead), 4);
    }
  }
  return 0;
}

#ifdef EXITSCOPE_FUZZ_REPLAY
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

// Replays each file given on the command line through the fuzz target.
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    const std::string bytes = s.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::printf("%s: ok (%zu bytes)\n", argv[i], bytes.size());
  }
  return 0;
}
#endif
