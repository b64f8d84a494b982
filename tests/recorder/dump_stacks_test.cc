// Dump format version 4: the `stacks` section (each vCPU's thread id, the stack capture
// counters, the findings' stacks) round trips; the version-3 dumps in testdata, which have no
// such section, still read with the same content; a corrupt or truncated `stacks` section is
// refused with one line naming it.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exitscope/dump.h"
#include "support/dump_bytes.h"
#include "support/stack_dump.h"

namespace exitscope {
namespace {

namespace fs = std::filesystem;
using test::Crc32;
using test::DumpWithStacks;
using test::Le32;
using test::Le64;
using test::Put32;
using test::Put64;

// The sections of a dump file by id, in table order.
std::vector<std::pair<uint32_t, std::string>> Sections(const std::string& b) {
  std::vector<std::pair<uint32_t, std::string>> out;
  for (uint32_t i = 0; i < Le32(b, 20); ++i) {
    const size_t e = 64 + 32 * i;
    out.emplace_back(Le32(b, e), b.substr(Le64(b, e + 8), Le64(b, e + 16)));
  }
  return out;
}

// A file of `sections` laid out back to back, with `version`, every size and checksum right.
std::string Build(const std::vector<std::pair<uint32_t, std::string>>& sections, uint32_t version) {
  std::string b(64 + 32 * sections.size(), '\0');
  std::memcpy(b.data(), kDumpMagic, 8);
  Put32(b, 8, version);
  Put32(b, 12, 64);
  Put32(b, 20, static_cast<uint32_t>(sections.size()));
  for (size_t i = 0; i < sections.size(); ++i) {
    const size_t e = 64 + 32 * i;
    Put32(b, e, sections[i].first);
    Put64(b, e + 8, b.size());
    Put64(b, e + 16, sections[i].second.size());
    Put32(b, e + 24, Crc32(sections[i].second));
    b += sections[i].second;
  }
  Put64(b, 24, b.size());
  Put32(b, 32, Crc32(std::string_view(b).substr(64, 32 * sections.size())));
  Put32(b, 36, Crc32(std::string_view(b).substr(0, 64)));
  return b;
}

void ExpectSameStacks(const Dump& a, const Dump& b) {
  ASSERT_EQ(a.vcpus.size(), b.vcpus.size());
  for (size_t v = 0; v < a.vcpus.size(); ++v) EXPECT_EQ(a.vcpus[v].tid, b.vcpus[v].tid) << v;
  EXPECT_EQ(a.stack_counters.captures, b.stack_counters.captures);
  EXPECT_EQ(a.stack_counters.signal_timeouts, b.stack_counters.signal_timeouts);
  EXPECT_EQ(a.stack_counters.exit_changed, b.stack_counters.exit_changed);
  EXPECT_EQ(a.stack_counters.frames_dropped, b.stack_counters.frames_dropped);
  EXPECT_EQ(a.stack_counters.captures_skipped, b.stack_counters.captures_skipped);
  ASSERT_EQ(a.findings.size(), b.findings.size());
  for (size_t i = 0; i < a.findings.size(); ++i) {
    EXPECT_EQ(a.findings[i].type, b.findings[i].type) << i;
    EXPECT_EQ(a.findings[i].text, b.findings[i].text) << i;
    EXPECT_EQ(a.findings[i].stack, b.findings[i].stack) << i;
  }
}

// The `stacks` section of a file, rebuilt with `edit` applied to its bytes.
std::string WithStacks(const std::string& file, auto edit) {
  auto secs = Sections(file);
  for (auto& [id, bytes] : secs) {
    if (id == 10) edit(bytes);
  }
  return Build(secs, Le32(file, 8));
}

TEST(DumpStacks, RoundTripThroughAFile) {
  const Dump d = DumpWithStacks();
  const std::string path =
      (fs::path(testing::TempDir()) / ("stacks-" + std::to_string(getpid()) + ".esdump")).string();
  ASSERT_TRUE(WriteDumpFile(d, path));
  auto r = ReadDump(path);
  fs::remove(path);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->version, 4u);
  EXPECT_TRUE(r->warnings.empty()) << r->warnings[0];
  ExpectSameStacks(d, *r);
  EXPECT_TRUE(r->findings[0].stack.empty());
  EXPECT_EQ(r->findings[1].stack.user.size(), 3u);
  EXPECT_EQ(r->findings[1].stack.kernel[0].function, "anon_pipe_read");
  EXPECT_EQ(r->findings[2].stack.note.rfind("user stack unavailable", 0), 0u);
  EXPECT_EQ(r->findings[2].type, FindingType::kStuckExitStack);
  // The same bytes once more, and the file's sections: ten, `stacks` among them.
  const std::string bytes = SerializeDump(d);
  EXPECT_EQ(SerializeDump(*r), bytes);
  EXPECT_EQ(Le32(bytes, 20), 10u);
  bool has = false;
  for (const auto& [id, sec] : Sections(bytes)) has = has || id == 10;
  EXPECT_TRUE(has);
}

// A finding of a type this reader does not know (above kStuckExitStack) is skipped with its
// stack; the stacks of the findings after it still land on their own findings.
TEST(DumpStacks, AStackOfASkippedFindingGoesWithIt) {
  Dump d = DumpWithStacks();
  d.findings[1].type = static_cast<FindingType>(5);
  auto r = ParseDump(SerializeDump(d), "x");
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->findings.size(), 3u);
  EXPECT_EQ(r->findings[1].type, FindingType::kStuckExitStack);
  EXPECT_EQ(r->findings[1].stack, d.findings[2].stack);
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_EQ(r->warnings[0], "1 finding has an unknown type; skipped");
}

// The version-3 dumps of testdata (no `stacks` section) read as before, and rewritten as
// version 4 hold the same vCPUs, exits and findings, with no thread ids and no stacks.
TEST(DumpStacks, Version3DumpsStillReadWithTheSameContent) {
  const fs::path dir = EXITSCOPE_TESTDATA_DIR;
  size_t v3 = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".esdump") continue;
    SCOPED_TRACE(entry.path().string());
    auto old = ReadDump(entry.path().string());
    ASSERT_TRUE(old) << old.error().message;
    if (old->version >= 4) continue;  // RealCaptureReads
    v3 += old->version == 3;
    for (const DumpVcpu& c : old->vcpus) EXPECT_EQ(c.tid, 0);
    EXPECT_EQ(old->stack_counters.captures, 0u);
    for (const FindingRecord& f : old->findings) EXPECT_TRUE(f.stack.empty());
    const std::string bytes = SerializeDump(*old, {.include_guest_data = true});
    auto v4 = ParseDump(bytes, "rewritten");
    ASSERT_TRUE(v4) << v4.error().message;
    EXPECT_EQ(v4->version, 4u);
    EXPECT_EQ(v4->warnings, old->warnings);
    ExpectSameStacks(*old, *v4);
    for (size_t v = 0; v < old->vcpus.size(); ++v) {
      const auto& a = old->vcpus[v].exits;
      const auto& b = v4->vcpus[v].exits;
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(std::memcmp(&a[i], &b[i], offsetof(DumpExit, map) + sizeof(uint32_t)), 0)
            << "vCPU " << v << " exit " << i;
      }
      EXPECT_EQ(old->vcpus[v].named_counters, v4->vcpus[v].named_counters);
    }
    EXPECT_EQ(old->devices.size(), v4->devices.size());
    EXPECT_EQ(old->attributes, v4->attributes);
  }
  EXPECT_GT(v3, 0u) << "no version-3 dump in " << dir;
}

// The dump of examples/c_example with the stack signal installed (testdata/dumps/README.md):
// a real capture of its vCPU 1 thread stuck in a 30 ms nanosleep, read back as it was written.
TEST(DumpStacks, RealCaptureReads) {
  auto d = ReadDump(std::string(EXITSCOPE_TESTDATA_DIR) + "/dumps/v4-c-example-stacks.esdump");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->version, 4u);
  EXPECT_TRUE(d->warnings.empty());
  EXPECT_NE(d->vcpus[1].tid, 0);
  EXPECT_EQ(d->stack_counters.captures, 1u);
  const FindingRecord* stuck = nullptr;
  for (const FindingRecord& f : d->findings) {
    if (f.type == FindingType::kStuckExitBegin) stuck = &f;
  }
  ASSERT_NE(stuck, nullptr);
  EXPECT_EQ(stuck->stack.tid, d->vcpus[1].tid);
  EXPECT_EQ(stuck->stack.state, 'S');
  ASSERT_FALSE(stuck->stack.user.empty());
  bool main_seen = false;
  for (const StackFrame& f : stuck->stack.user) main_seen = main_seen || f.function == "main";
  EXPECT_TRUE(main_seen) << FormatFrame(stuck->stack.user[0]);
  ASSERT_FALSE(stuck->stack.kernel.empty());
  auto again = ParseDump(SerializeDump(*d), "again");
  ASSERT_TRUE(again) << again.error().message;
  ExpectSameStacks(*d, *again);
}

// A version-4 file must have the section; a version-3 file may lack it.
TEST(DumpStacks, MissingOnlyBeforeVersion4) {
  const std::string b = SerializeDump(DumpWithStacks());
  auto secs = Sections(b);
  std::erase_if(secs, [](const auto& s) { return s.first == 10; });
  auto v4 = ParseDump(Build(secs, 4), "no-stacks.esdump");
  ASSERT_FALSE(v4);
  EXPECT_EQ(v4.error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(v4.error().message, "no-stacks.esdump: missing section 'stacks'");
  auto v3 = ParseDump(Build(secs, 3), "v3.esdump");
  ASSERT_TRUE(v3) << v3.error().message;
  EXPECT_EQ(v3->findings.size(), 4u);
  EXPECT_TRUE(v3->findings[1].stack.empty());
  EXPECT_EQ(v3->vcpus[1].tid, 0);
}

// Whatever is wrong in the section (checksums right): one kCorrupt line naming it.
TEST(DumpStacks, ACorruptStacksSectionIsOneLine) {
  const std::string good = SerializeDump(DumpWithStacks());
  // Offsets inside the section: u32 nvcpus, 2 x u32 tid, 5 x u64 counters, u32 n, then the
  // first entry: u32 finding index, u32 tid, u8 state, u8, u16, u32 capture, u32 dropped,
  // ref note (8), u32 n_user, u32 n_kernel, frames.
  constexpr size_t kN = 4 + 8 + 40;
  constexpr size_t kEntry = kN + 4;
  const std::map<std::string, std::string> cases = {
      {"truncated", WithStacks(good, [](std::string& s) { s.resize(s.size() - 10); })},
      {"cut in the header", WithStacks(good, [](std::string& s) { s.resize(6); })},
      {"empty", WithStacks(good, [](std::string& s) { s.clear(); })},
      {"vcpu count", WithStacks(good, [](std::string& s) { Put32(s, 0, 3); })},
      {"stack count", WithStacks(good, [&](std::string& s) { Put32(s, kN, 0x10000000); })},
      {"finding index", WithStacks(good, [&](std::string& s) { Put32(s, kEntry, 4); })},
      {"frame count",
       WithStacks(good, [&](std::string& s) { Put32(s, kEntry + 28, 0xffffffffu); })},
      {"note ref", WithStacks(good, [&](std::string& s) { Put32(s, kEntry + 20, 0x7fffffff); })},
      {"frame function ref",
       WithStacks(good, [&](std::string& s) { Put32(s, kEntry + 36 + 16, 0x7fffffff); })},
      {"order", WithStacks(good,
                           [&](std::string& s) {
                             // The second entry names the first one's finding again.
                             const uint32_t frames = Le32(s, kEntry + 28) + Le32(s, kEntry + 32);
                             Put32(s, kEntry + 36 + 44 * frames, Le32(s, kEntry));
                           })},
  };
  for (const auto& [what, bytes] : cases) {
    SCOPED_TRACE(what);
    auto r = ParseDump(bytes, "bad.esdump");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
    const std::string& m = r.error().message;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_EQ(m.rfind("bad.esdump: ", 0), 0u) << m;
    EXPECT_NE(m.find("section 'stacks'"), std::string::npos) << m;
  }
  EXPECT_NE(ParseDump(cases.at("finding index"), "b")
                .error()
                .message.find("stack 0 names finding 4 of 4"),
            std::string::npos);
  EXPECT_NE(ParseDump(cases.at("vcpu count"), "b")
                .error()
                .message.find("it holds 3 thread ids for 2 vCPUs"),
            std::string::npos);
  // Every truncation of the section, checksums right: never a crash, always one line.
  const auto secs = Sections(good);
  std::string stacks;
  for (const auto& [id, sec] : secs) {
    if (id == 10) stacks = sec;
  }
  for (size_t n = 0; n < stacks.size(); ++n) {
    auto r = ParseDump(WithStacks(good, [&](std::string& s) { s.resize(n); }), "t");
    ASSERT_FALSE(r) << n;
    ASSERT_EQ(r.error().code, ErrorCode::kCorrupt) << n;
    ASSERT_NE(r.error().message.find("section 'stacks'"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace exitscope
