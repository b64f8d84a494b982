// Snapshot(options, Dump*) and SerializeDump(dump, options, string*) reuse storage: what they
// produce is exactly what Snapshot() and SerializeDump() produce, whether the dump grows,
// shrinks or keeps its size between calls.
#include <gtest/gtest.h>

#include <string>

#include "exitscope/dump.h"
#include "exitscope/recorder.h"

namespace exitscope {
namespace {

TEST(SnapshotReuseTest, KeptStorageGivesTheSameBytes) {
  RecorderOptions o;
  o.num_vcpus = 3;
  o.events_per_vcpu = 1024;
  o.start_watchdog = false;
  auto rec = std::move(*Recorder::Create(o));
  const uint32_t dev = *rec->address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
  ASSERT_TRUE(rec->address_space()
                  .AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, dev, *RegisterMap::Builtin("nvme"))
                  .has_value());
  rec->SetAttribute("vmm", "reuse-test");
  Dump kept;
  std::string bytes;
  // Grows (rings filling), then stays full, then shrinks (max_exits_per_vcpu).
  const uint64_t adds[] = {5, 200, 150, 3000, 0, 0};  // 205 -> 355: less than double
  const uint64_t maxes[] = {0, 0, 0, 0, 0, 10};
  uint64_t n = 0;
  for (int round = 0; round < 6; ++round) {
    for (uint64_t i = 0; i < adds[round]; ++i, ++n) {
      const uint32_t v = static_cast<uint32_t>(n % 3);
      rec->BeginExit(v, ExitKind::kMmio, 0xfebf1000 + 8 * (n % 16), 4, AccessDir::kWrite, n);
      rec->EndExit(v);
    }
    const DumpOptions opts{.include_guest_data = round % 2 == 0,
                           .max_exits_per_vcpu = maxes[round]};
    rec->Snapshot(opts, &kept);
    const Dump fresh = rec->Snapshot(opts);
    ASSERT_EQ(kept.vcpus.size(), fresh.vcpus.size());
    for (size_t v = 0; v < kept.vcpus.size(); ++v) {
      EXPECT_EQ(kept.vcpus[v].exits.size(), fresh.vcpus[v].exits.size()) << "round " << round;
    }
    SerializeDump(kept, opts, &bytes);
    // The two snapshots differ only in their times: compare each serialisation with a fresh
    // serialisation of the same Dump, and each Dump's exits with the other's.
    EXPECT_EQ(bytes, SerializeDump(kept, opts)) << "round " << round;
    auto back = ParseDump(bytes, "reuse");
    ASSERT_TRUE(back.has_value()) << back.error().message;
    for (size_t v = 0; v < kept.vcpus.size(); ++v) {
      ASSERT_EQ(back->vcpus[v].exits.size(), fresh.vcpus[v].exits.size());
      for (size_t k = 0; k < fresh.vcpus[v].exits.size(); ++k) {
        EXPECT_EQ(back->vcpus[v].exits[k].value, fresh.vcpus[v].exits[k].value);
        EXPECT_EQ(back->vcpus[v].exits[k].reg_element, fresh.vcpus[v].exits[k].reg_element);
      }
    }
    EXPECT_EQ(back->Attribute("vmm"), "reuse-test");
  }
}

}  // namespace
}  // namespace exitscope
