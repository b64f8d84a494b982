// Fuzz target for the dump reader (ParseDump), the exit-health report over what it reads
// (table and JSON) and the writer (SerializeDump).
//
// Before parsing, the harness rewrites the file size and every CRC the format has (section
// CRCs, then the section-table CRC, then the header CRC; docs/dump-format.md), so a mutation
// reaches the section parsers instead of stopping at "CRC mismatch": 30x the paths of a plain
// harness (issue 12). The CRC checks themselves are covered by tests/recorder/dump_test.cc.
//
// A dump that parses must render both ways without throwing, re-serialise, and parse again
// with the same vCPUs and exits, field by field, and the same findings' stacks and thread ids.
#include <zlib.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

#include "exitscope/dump.h"
#include "fuzz_target.h"
#include "report/exit_health.h"

namespace {

constexpr size_t kHeaderBytes = 64;
constexpr size_t kEntryBytes = 32;

uint32_t Get32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}
uint64_t Get64(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}
void Put32(std::string& b, size_t at, uint32_t v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}
void Put64(std::string& b, size_t at, uint64_t v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}
uint32_t Crc(const std::string& b, size_t at, size_t len) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(b.data() + at), static_cast<uInt>(len)));
}

// Makes the size and checksums of `b` consistent with its bytes, as far as the layout allows.
void FixChecksums(std::string& b) {
  if (b.size() < kHeaderBytes || std::memcmp(b.data(), "EXSCDUMP", 8) != 0) return;
  Put64(b, 24, b.size());
  const uint64_t count = Get32(b, 20);
  if (count <= (b.size() - kHeaderBytes) / kEntryBytes) {
    for (uint64_t i = 0; i < count; ++i) {
      const size_t e = kHeaderBytes + i * kEntryBytes;
      const uint64_t off = Get64(b, e + 8);
      const uint64_t len = Get64(b, e + 16);
      if (off <= b.size() && len <= b.size() - off) Put32(b, e + 24, Crc(b, off, len));
    }
    Put32(b, 32, Crc(b, kHeaderBytes, count * kEntryBytes));
  }
  Put32(b, 36, 0);
  Put32(b, 36, Crc(b, 0, kHeaderBytes));
}

void Render(const exitscope::Dump& d) {
  exitscope::report::ExitHealthOptions opts;
  opts.source = "fuzz";
  (void)exitscope::report::ExitHealthReport(d, opts);
  opts.format = exitscope::report::OutputFormat::kJson;
  opts.max_rows = 0;
  (void)exitscope::report::ExitHealthReport(d, opts);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  FixChecksums(bytes);
  auto d = exitscope::ParseDump(bytes, "fuzz.esdump");
  if (!d) return 0;
  for (const auto& v : d->vcpus) {
    for (const auto& e : v.exits) (void)d->DescribeExit(e);
  }
  Render(*d);
  const std::string again = exitscope::SerializeDump(*d, {.include_guest_data = true});
  auto d2 = exitscope::ParseDump(again, "fuzz-reserialised.esdump");
  if (!d2) exitscope::fuzz::InvariantFailed("a dump that parsed does not parse once re-serialised");
  if (d2->vcpus.size() != d->vcpus.size()) exitscope::fuzz::InvariantFailed("vCPU count changed");
  for (size_t i = 0; i < d->vcpus.size(); ++i) {
    const auto& a = d->vcpus[i].exits;
    const auto& b = d2->vcpus[i].exits;
    if (a.size() != b.size()) {
      exitscope::fuzz::InvariantFailed("exit count changed in a re-serialised dump");
    }
    // What the reader gave back is already repaired: the writer's coding (version 3, each
    // record against the one before) must give every field back as it was.
    for (size_t k = 0; k < a.size(); ++k) {
      if (std::memcmp(&a[k], &b[k], offsetof(exitscope::DumpExit, map) + sizeof(uint32_t)) != 0) {
        exitscope::fuzz::InvariantFailed("an exit changed in a re-serialised dump");
      }
    }
  }
  // Thread ids, stack counters and the findings' stacks (version 4) come back as they were.
  if (d2->findings.size() != d->findings.size()) {
    exitscope::fuzz::InvariantFailed("finding count changed in a re-serialised dump");
  }
  for (size_t i = 0; i < d->findings.size(); ++i) {
    if (!(d2->findings[i].stack == d->findings[i].stack)) {
      exitscope::fuzz::InvariantFailed("a finding's stack changed in a re-serialised dump");
    }
  }
  for (size_t i = 0; i < d->vcpus.size(); ++i) {
    if (d2->vcpus[i].tid != d->vcpus[i].tid) {
      exitscope::fuzz::InvariantFailed("a vCPU's thread id changed in a re-serialised dump");
    }
  }
  return 0;
}
