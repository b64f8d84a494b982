// `exitscope inspect`: the in-kernel KVM counters per vCPU, on a real dump from the kvm-pvm
// host (testdata/kvm-host/blk-kvm-stats.esdump, README there) and on the older real dumps
// that have none.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exitscope/dump.h"
#include "support/run.h"

namespace {

using Output = exitscope::test::Ran;
using exitscope::test::RunExitscope;

const std::string kDir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host";
const std::string kBlk = kDir + "/blk-kvm-stats.esdump";

// The exit counters in the order the report must list them.
const std::vector<std::string> kExitOrder = {
    "kvm.exits",      "kvm.halt_exits", "kvm.irq_exits", "kvm.insn_emulation",
    "kvm.mmio_exits", "kvm.io_exits",   "kvm.pf_taken"};

// The counter section of the table: name -> the values of its row, one per vCPU column, and
// the row names in order.
struct CounterSection {
  std::vector<std::string> header;  // "vCPU 0", "vCPU 1"
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> rows;
  std::string tail;  // the "... N more counters" line
  bool found = false;
};

CounterSection ParseSection(const std::string& out) {
  CounterSection s;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line) && line.rfind("Per-vCPU counters from the VMM", 0) != 0) {
  }
  if (!in) return s;
  s.found = true;
  while (std::getline(in, line) && !line.empty()) {
    std::istringstream f(line);
    std::string name;
    f >> name;
    if (name == "counter") {
      std::string a, b;
      while (f >> a >> b) s.header.push_back(a + " " + b);
      continue;
    }
    if (name == "...") {
      s.tail = line;
      continue;
    }
    if (name == "(other") continue;
    s.order.push_back(name);
    std::string v;
    while (f >> v) s.rows[name].push_back(v);
  }
  return s;
}

exitscope::Dump ReadBlk() {
  auto d = exitscope::ReadDump(kBlk);
  EXPECT_TRUE(d) << kBlk << ": " << (d ? "" : d.error().message);
  return d ? std::move(*d) : exitscope::Dump{};
}

TEST(InspectKvmCounters, RealDumpHasCountersPerVcpu) {
  const exitscope::Dump d = ReadBlk();
  ASSERT_EQ(d.vcpus.size(), 2u);
  for (const auto& v : d.vcpus) {
    EXPECT_GT(v.named_counters.size(), 30u) << "vCPU " << v.vcpu;
    ASSERT_TRUE(v.named_counters.count("kvm.exits")) << "vCPU " << v.vcpu;
    EXPECT_GT(v.named_counters.at("kvm.exits"), 0u);
  }
  // Two vCPUs that did different work: a per-vCPU view shows something a sum hides.
  EXPECT_NE(d.vcpus[0].named_counters.at("kvm.exits"), d.vcpus[1].named_counters.at("kvm.exits"));
}

TEST(InspectKvmCounters, TableHasOneColumnPerVcpuWithExitCountersFirst) {
  const exitscope::Dump d = ReadBlk();
  ASSERT_EQ(d.vcpus.size(), 2u);
  const Output o = RunExitscope("inspect " + kBlk);
  ASSERT_EQ(o.status, 0) << o.out;
  const CounterSection s = ParseSection(o.out);
  ASSERT_TRUE(s.found) << o.out;
  EXPECT_EQ(s.header, (std::vector<std::string>{"vCPU 0", "vCPU 1"})) << o.out;
  // Every value is the vCPU's own, not a sum.
  for (const auto& [name, values] : s.rows) {
    ASSERT_EQ(values.size(), 2u) << name;
    for (uint32_t c = 0; c < 2; ++c)
      EXPECT_EQ(values[c], std::to_string(d.vcpus[c].named_counters.at(name))) << name;
  }
  // The exit counters lead, in order, zeros included (io_exits is 0 on kvm-pvm).
  ASSERT_GE(s.order.size(), kExitOrder.size()) << o.out;
  std::vector<std::string> got;
  for (const std::string& n : s.order)
    if (std::find(kExitOrder.begin(), kExitOrder.end(), n) != kExitOrder.end()) got.push_back(n);
  EXPECT_EQ(got, kExitOrder) << o.out;
  EXPECT_EQ(s.order[0], "kvm.exits");
  EXPECT_EQ(s.rows.at("kvm.io_exits"), (std::vector<std::string>{"0", "0"}));
  // Not all ~47: counters that are 0 on every vCPU and are not exit counters are left out,
  // and the table says how many.
  size_t all_zero = 0;
  for (const auto& [name, v0] : d.vcpus[0].named_counters)
    if (v0 == 0 && d.vcpus[1].named_counters.at(name) == 0) ++all_zero;
  EXPECT_LT(s.order.size(), d.vcpus[0].named_counters.size()) << o.out;
  EXPECT_NE(s.tail.find("0 on every vCPU (--all lists them)"), std::string::npos) << o.out;
  EXPECT_GT(all_zero, 0u);
  const auto exit_counters =
      nlohmann::json::parse(RunExitscope("inspect --format json " + kBlk).out)["kvm_exit_counters"]
          .get<std::vector<std::string>>();
  for (const auto& [name, values] : s.rows) {
    const bool exit_counter =
        std::find(exit_counters.begin(), exit_counters.end(), name) != exit_counters.end();
    if (!exit_counter && values == std::vector<std::string>{"0", "0"})
      ADD_FAILURE() << name << " is 0 on both vCPUs and listed without --all";
  }
}

TEST(InspectKvmCounters, AllListsEveryCounterOnce) {
  const exitscope::Dump d = ReadBlk();
  ASSERT_EQ(d.vcpus.size(), 2u);
  const Output o = RunExitscope("inspect --all " + kBlk);
  ASSERT_EQ(o.status, 0) << o.out;
  const CounterSection s = ParseSection(o.out);
  ASSERT_TRUE(s.found) << o.out;
  EXPECT_EQ(s.order.size(), d.vcpus[0].named_counters.size()) << o.out;
  EXPECT_EQ(s.rows.size(), s.order.size()) << "a counter listed twice";
  EXPECT_TRUE(s.tail.empty()) << s.tail;
}

TEST(InspectKvmCounters, VcpuFilterShowsOnlyThatVcpu) {
  const exitscope::Dump d = ReadBlk();
  ASSERT_EQ(d.vcpus.size(), 2u);
  const Output o = RunExitscope("inspect --vcpu 1 " + kBlk);
  ASSERT_EQ(o.status, 0) << o.out;
  const CounterSection s = ParseSection(o.out);
  EXPECT_EQ(s.header, (std::vector<std::string>{"vCPU 1"})) << o.out;
  ASSERT_TRUE(s.rows.count("kvm.exits")) << o.out;
  EXPECT_EQ(s.rows.at("kvm.exits"),
            (std::vector<std::string>{std::to_string(d.vcpus[1].named_counters.at("kvm.exits"))}));
}

TEST(InspectKvmCounters, JsonHasEveryCounterPerVcpuAndTheExitOrder) {
  const exitscope::Dump d = ReadBlk();
  ASSERT_EQ(d.vcpus.size(), 2u);
  const Output o = RunExitscope("inspect --format json " + kBlk);
  ASSERT_EQ(o.status, 0) << o.out;
  const auto j = nlohmann::json::parse(o.out);
  ASSERT_TRUE(j["counters_by_vcpu"].is_array()) << o.out.substr(0, 400);
  ASSERT_EQ(j["counters_by_vcpu"].size(), 2u);
  for (uint32_t c = 0; c < 2; ++c) {
    const auto& e = j["counters_by_vcpu"][c];
    EXPECT_EQ(e["vcpu"], c);
    EXPECT_EQ(e["counters"].size(), d.vcpus[c].named_counters.size());
    for (const auto& [name, value] : d.vcpus[c].named_counters)
      EXPECT_EQ(e["counters"][name], value) << name;
  }
  const auto order = j["kvm_exit_counters"].get<std::vector<std::string>>();
  ASSERT_GE(order.size(), kExitOrder.size());
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 6),
            std::vector<std::string>(kExitOrder.begin(), kExitOrder.begin() + 6));
  // The summed view stays for existing readers.
  EXPECT_EQ(j["vcpu_counters"]["kvm.exits"],
            d.vcpus[0].named_counters.at("kvm.exits") + d.vcpus[1].named_counters.at("kvm.exits"));
  const Output f = RunExitscope("inspect --format json --vcpu 0 " + kBlk);
  const auto jf = nlohmann::json::parse(f.out);
  ASSERT_EQ(jf["counters_by_vcpu"].size(), 1u);
  EXPECT_EQ(jf["counters_by_vcpu"][0]["vcpu"], 0);
}

// The dumps made at c18d6d4, when the stats parse failed on kvm-pvm, hold no kvm.* counters:
// no section, an empty array, no error.
TEST(InspectKvmCounters, OlderRealDumpsWithoutCountersHaveNoSection) {
  for (const char* f : {"blk-backend-delay.esdump", "hello-lsr-delay.esdump", "mmio-storm.esdump",
                        "joint-blk.esdump"}) {
    const std::string path = kDir + "/" + f;
    auto d = exitscope::ReadDump(path);
    ASSERT_TRUE(d) << path;
    for (const auto& v : d->vcpus) EXPECT_TRUE(v.named_counters.empty()) << f;
    const Output t = RunExitscope("inspect " + path);
    ASSERT_EQ(t.status, 0) << f;
    EXPECT_FALSE(ParseSection(t.out).found) << f;
    const Output o = RunExitscope("inspect --format json " + path);
    ASSERT_EQ(o.status, 0) << f;
    const auto j = nlohmann::json::parse(o.out);
    EXPECT_TRUE(j["counters_by_vcpu"].is_array()) << f;
    EXPECT_TRUE(j["counters_by_vcpu"].empty()) << f;
  }
}

}  // namespace
