// The Trace Event JSON timeline (report/timeline.h) on the real captures of testdata/kvm-host:
// every dump, the joint-blk trace alone, and the joint view of joint-blk and joint-sched.
// What is checked is meaning, not bytes: slices on a track never overlap, every exit slice
// lasts its exit's duration (as the source's ExitEvent gives it), names are resolved, async
// I/O begin/end pair up per id, instants where the dump has findings and queue-full events,
// and the joint view's parts sit inside their kernel exit.
#include "report/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/joint_view.h"
#include "exitscope/dump.h"
#include "sources/dump_source.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/source.h"

namespace exitscope::report {
namespace {

using nlohmann::json;

std::string Data(const std::string& rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + rel;
}

std::string TempPath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("timeline_test_") + std::to_string(getpid()) + "_" + name + ".json"))
      .string();
}

// Parses the file (and removes it); `bytes`: its size.
json ReadJson(const std::string& path, uint64_t* bytes = nullptr) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::remove(path.c_str());
  if (bytes != nullptr) *bytes = ss.str().size();
  return json::parse(ss.str());
}

// ts / dur in integer ns (they are written with exactly three decimals).
int64_t Ns(const json& v) {
  return std::llround(v.get<double>() * 1000.0);
}

struct Slice {
  int64_t start, end;
  const json* e;
};

std::map<std::pair<int64_t, int64_t>, std::vector<Slice>> SlicesByTrack(const json& doc) {
  std::map<std::pair<int64_t, int64_t>, std::vector<Slice>> tracks;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int64_t s = Ns(e["ts"]);
    tracks[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}].push_back({s, s + Ns(e["dur"]), &e});
  }
  // Sorted by ts alone, ties in file order: what Perfetto's JSON importer does (a parent must
  // come before a child that starts with it: google/perfetto#878).
  for (auto& [k, v] : tracks) {
    std::stable_sort(v.begin(), v.end(),
                     [](const Slice& a, const Slice& b) { return a.start < b.start; });
  }
  return tracks;
}

// Slices on one track either nest or are disjoint: never two overlapping siblings, and a
// slice starting with its parent comes after it in the file.
void ExpectProperlyNested(const json& doc) {
  for (const auto& [track, slices] : SlicesByTrack(doc)) {
    std::vector<int64_t> open;  // ends of the enclosing slices
    for (const Slice& s : slices) {
      while (!open.empty() && open.back() <= s.start) open.pop_back();
      ASSERT_TRUE(open.empty() || s.end <= open.back())
          << "track " << track.first << "/" << track.second << ": " << s.e->dump()
          << " overlaps a sibling ending at " << open.back();
      open.push_back(s.end);
    }
  }
}

// Every async begin has one end with the same id, name and category, not before it.
void ExpectAsyncPairs(const json& doc, size_t* pairs) {
  std::map<std::tuple<std::string, std::string, std::string>, int64_t> open;
  *pairs = 0;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "b" && e["ph"] != "e") continue;
    const auto key = std::make_tuple(e["cat"].get<std::string>(), e["name"].get<std::string>(),
                                     e["id"].get<std::string>());
    if (e["ph"] == "b") {
      ASSERT_FALSE(open.count(key)) << "second begin of " << e.dump();
      open[key] = Ns(e["ts"]);
    } else {
      ASSERT_TRUE(open.count(key)) << "end without begin " << e.dump();
      EXPECT_GE(Ns(e["ts"]), open[key]);
      open.erase(key);
      ++*pairs;
    }
  }
  EXPECT_TRUE(open.empty()) << open.size() << " async slices never end";
}

class Collect : public EventSink {
 public:
  void OnExit(const ExitEvent& e) override { exits.push_back(e); }
  void OnDeviceEvent(const DeviceEvent& d) override { devices.push_back(d); }
  void OnFinding(const Finding& f) override { findings.push_back(f); }
  std::vector<ExitEvent> exits;
  std::vector<DeviceEvent> devices;
  std::vector<Finding> findings;
};

std::string Lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

TimelineInputs In(const Dump* dump, const std::string& dump_path) {
  TimelineInputs in;
  in.dump = dump;
  in.dump_path = dump_path;
  return in;
}

// A trace alone, opened as `exitscope timeline` opens it.
std::unique_ptr<sources::Source> OpenTrace(const std::string& path) {
  auto t = sources::OpenKernelTrace(path, {});
  EXPECT_TRUE(t) << t.error().message;
  return t ? std::move(*t) : nullptr;
}

const char* kDumps[] = {"blk-backend-delay.esdump", "blk-kvm-stats.esdump",
                        "hello-lsr-delay.esdump",   "joint-blk.esdump",
                        "joint-sched.esdump",       "mmio-storm.esdump"};

TEST(Timeline, EveryRealDump) {
  for (const char* name : kDumps) {
    SCOPED_TRACE(name);
    const std::string path = Data(name);
    auto dump = ReadDump(path);
    ASSERT_TRUE(dump) << dump.error().message;
    const std::string out = TempPath("dump");
    auto st = WriteTimeline(In(&*dump, path), {}, out);
    ASSERT_TRUE(st) << st.error().message;
    uint64_t bytes = 0;
    const json doc = ReadJson(out, &bytes);
    EXPECT_EQ(st->bytes, bytes);
    ExpectProperlyNested(doc);

    // The dump's events as the one event stream gives them.
    Collect c;
    sources::DumpSource src(*dump);  // keeps the names the events view
    src.Emit(&c);
    const auto base =
        static_cast<int64_t>(std::stoull(doc["otherData"]["base_ns"].get<std::string>()));
    // Exit slices in the file, per vCPU in time order, against the source's exits.
    std::map<int64_t, std::vector<const json*>> by_vcpu;
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] == "X" && e["cat"] == "exit") by_vcpu[e["tid"].get<int64_t>()].push_back(&e);
    }
    std::map<int64_t, size_t> next;
    bool saw_sq1tdbl = false;
    for (const ExitEvent& x : c.exits) {
      auto& v = by_vcpu[x.vcpu];
      ASSERT_LT(next[x.vcpu], v.size());
      const json& e = *v[next[x.vcpu]++];
      EXPECT_EQ(e["pid"].get<int64_t>(), dump->process.pid);
      EXPECT_EQ(Ns(e["ts"]), static_cast<int64_t>(x.start_ns) - base) << e.dump();
      EXPECT_EQ(Ns(e["dur"]), static_cast<int64_t>(x.duration_ns)) << e.dump();
      EXPECT_EQ(e["args"]["duration_ns"].get<uint64_t>(), x.duration_ns);
      EXPECT_FALSE(e["args"].contains("clamped_ns")) << e.dump();
      std::string want = Lower(x.reason);
      if (!x.device.empty()) {
        want += " " + std::string(x.device);
        if (!x.reg.empty()) want += "." + std::string(x.reg);
      }
      if (!x.device.empty() && !x.reg.empty()) {
        EXPECT_EQ(e["name"], want);
      } else {
        EXPECT_EQ(e["name"].get<std::string>().rfind(want, 0), 0u) << e.dump();
      }
      saw_sq1tdbl = saw_sq1tdbl || e["name"] == "mmio nvme0.SQ1TDBL";
      EXPECT_EQ(e["args"].contains("value"), (x.flags & kExitFlagValue) != 0);
      if (x.subkey_kind == SubKeyKind::kMmio || x.subkey_kind == SubKeyKind::kPort) {
        EXPECT_EQ(e["args"]["size"].get<int>(), x.size);
        EXPECT_TRUE(e["args"].contains("address"));
      }
    }
    for (const auto& [vcpu, v] : by_vcpu) EXPECT_EQ(next[vcpu], v.size()) << "vCPU " << vcpu;
    if (std::string(name).starts_with("blk") || std::string(name).starts_with("joint")) {
      EXPECT_TRUE(saw_sq1tdbl) << "no exit named mmio nvme0.SQ1TDBL";
    }
    if (!dump->includes_guest_data) {
      for (const auto& [vcpu, v] : by_vcpu) {
        for (const json* e : v) EXPECT_FALSE((*e)["args"].contains("value"));
      }
    }

    // Device I/O: one async slice per submitted I/O, begin and end paired.
    size_t pairs = 0;
    ExpectAsyncPairs(doc, &pairs);
    size_t submits = 0, queue_full = 0, errors = 0;
    for (const DeviceEvent& d : c.devices) {
      submits += d.type == DeviceEventType::kIoSubmit;
      queue_full += d.type == DeviceEventType::kQueueFull;
      errors += d.type == DeviceEventType::kBackendError;
    }
    EXPECT_EQ(pairs, submits);
    // Instants: one per finding (on its vCPU's track unless an aged I/O) and queue-full.
    size_t findings = 0, qf = 0, be = 0;
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "i") continue;
      if (e["cat"] == "finding") ++findings;
      if (e["name"].get<std::string>().starts_with("queue-full ")) ++qf;
      if (e["name"].get<std::string>().starts_with("backend-error ")) ++be;
    }
    EXPECT_EQ(findings, c.findings.size());
    EXPECT_EQ(qf, queue_full);
    EXPECT_EQ(be, errors);
    if (std::string(name) == "blk-backend-delay.esdump") {
      EXPECT_GT(findings, 0u);
      EXPECT_GT(qf, 0u);
    }
    // Metadata: the VM named by the dump's process, each vCPU by its number.
    bool process_named = false;
    std::map<int64_t, std::string> threads;
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "M") continue;
      if (e["name"] == "process_name") {
        process_named = e["args"]["name"] ==
                        dump->process.comm + " (pid " + std::to_string(dump->process.pid) + ")";
      }
      if (e["name"] == "thread_name") threads[e["tid"]] = e["args"]["name"];
    }
    EXPECT_TRUE(process_named);
    for (const DumpVcpu& v : dump->vcpus) {
      if (!v.exits.empty()) {
        EXPECT_EQ(threads[v.vcpu], "vCPU " + std::to_string(v.vcpu));
      }
    }
    EXPECT_EQ(doc["displayTimeUnit"], "ns");
  }
}

TEST(Timeline, KernelTraceAlone) {
  const std::string trace = Data("joint-blk.dat");
  const std::string out = TempPath("trace");
  auto src = OpenTrace(trace);
  ASSERT_TRUE(src);
  TimelineInputs tin;
  tin.trace = src.get();
  auto st = WriteTimeline(tin, {}, out);
  ASSERT_TRUE(st) << st.error().message;
  const json doc = ReadJson(out);
  ExpectProperlyNested(doc);
  // The same trace through the same pairer: every exit with a known duration is one slice.
  auto in = sources::KvmInput::Open(trace, {});
  ASSERT_TRUE(in);
  Collect c;
  sources::KvmPairer pairer({.clock = (*in)->scale()}, &c);
  ASSERT_TRUE((*in)->ReadAll(&pairer));
  std::multiset<std::tuple<int64_t, int64_t, int64_t>> want, got;  // vCPU thread, start, dur
  for (const ExitEvent& e : c.exits) {
    if (e.kernel_access || e.end != ExitEnd::kSeen) continue;
    want.insert({e.tid, static_cast<int64_t>(e.start_ns), static_cast<int64_t>(e.duration_ns)});
  }
  const auto base =
      static_cast<int64_t>(std::stoull(doc["otherData"]["base_ns"].get<std::string>()));
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["cat"], "kernel");
    EXPECT_EQ(Ns(e["dur"]), e["args"]["duration_ns"].get<int64_t>());
    got.insert({e["args"]["thread"].get<int64_t>(), Ns(e["ts"]) + base, Ns(e["dur"])});
  }
  EXPECT_EQ(got.size(), 1442u);
  EXPECT_EQ(got, want);
}

// kvm report --format timeline -p PID|TID / --vcpu N: only those exits are drawn, the rest
// counted as left out. The capture runs three VMs, one vCPU 0 each.
TEST(Timeline, KernelTraceFilteredByVmThreadAndVcpu) {
  const std::string trace =
      std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";
  auto in = sources::KvmInput::Open(trace, {});
  ASSERT_TRUE(in);
  Collect c;
  sources::KvmPairer pairer({.clock = (*in)->scale()}, &c);
  ASSERT_TRUE((*in)->ReadAll(&pairer));
  std::map<uint32_t, uint64_t> per_vm;  // drawable exits per VM
  std::map<uint32_t, uint32_t> tid_of;  // the VM's vCPU thread
  uint64_t all = 0;
  for (const ExitEvent& e : c.exits) {
    if (e.kernel_access || e.end != ExitEnd::kSeen) continue;
    ++per_vm[e.vm];
    tid_of[e.vm] = e.tid;
    ++all;
  }
  ASSERT_EQ(per_vm.size(), 3u);
  const auto [vm, n] = *per_vm.rbegin();
  ASSERT_GT(n, 0u);
  ASSERT_LT(n, all);
  struct Case {
    const char* name;
    int64_t only_pid, only_vcpu;
    uint64_t want;
  };
  for (const Case& k : {Case{"-p PID", vm, -1, n}, Case{"-p TID", tid_of[vm], -1, n},
                        Case{"--vcpu 0", -1, 0, all}, Case{"--vcpu 1", -1, 1, 0}}) {
    SCOPED_TRACE(k.name);
    auto src = OpenTrace(trace);
    ASSERT_TRUE(src);
    TimelineInputs tin;
    tin.trace = src.get();
    TimelineOptions o;
    o.only_pid = k.only_pid;
    o.only_vcpu = k.only_vcpu;
    const std::string out = TempPath("filtered");
    auto st = WriteTimeline(tin, o, out);
    ASSERT_TRUE(st) << st.error().message;
    const json doc = ReadJson(out);
    uint64_t slices = 0;
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      ++slices;
      if (k.only_pid >= 0) {
        EXPECT_EQ(e["pid"].get<int64_t>(), vm);
        EXPECT_EQ(e["args"]["thread"].get<int64_t>(), tid_of[vm]);
      }
    }
    EXPECT_EQ(slices, k.want);
    EXPECT_EQ(st->kernel_exits, k.want);
    EXPECT_GE(st->left_out, all - k.want);
  }
}

struct JointCase {
  const char* dump;
  const char* trace;
  bool sched;
};

TEST(Timeline, JointViewNestsEachExitsSplit) {
  for (const JointCase jc : {JointCase{"joint-blk.esdump", "joint-blk.dat", false},
                             JointCase{"joint-sched.esdump", "joint-sched.dat", true}}) {
    SCOPED_TRACE(jc.dump);
    const std::string dpath = Data(jc.dump), tpath = Data(jc.trace);
    auto dump = ReadDump(dpath);
    ASSERT_TRUE(dump);
    auto view = analysis::BuildJointViewFromTrace(*dump, dpath, tpath);
    ASSERT_TRUE(view) << view.error().message;
    ASSERT_EQ(view->sched_recorded, jc.sched);
    const std::string out = TempPath("joint");
    auto devices = sources::KvmDeviceMap::LoadDump(dpath);
    ASSERT_TRUE(devices);
    auto replay =
        sources::OpenKernelTrace(tpath, analysis::JointTraceOptions(*dump, devices->get()));
    ASSERT_TRUE(replay);
    TimelineInputs in = In(&*dump, dpath);
    in.trace = replay->get();
    in.joint = &*view;
    auto st = WriteTimeline(in, {}, out);
    ASSERT_TRUE(st) << st.error().message;
    const json doc = ReadJson(out);
    ExpectProperlyNested(doc);
    const auto base =
        static_cast<int64_t>(std::stoull(doc["otherData"]["base_ns"].get<std::string>()));

    // Each matched exit: a kernel slice with its kernel duration; inside it "kernel before",
    // the VMM's exit and "kernel after", tiling it; off-CPU spans inside those.
    std::map<std::pair<int64_t, int64_t>, const analysis::JointExit*> by_start;  // vcpu, start
    for (const analysis::JointExit& j : view->matched) {
      by_start[{j.vcpu, static_cast<int64_t>(j.kernel_start_ns) - base}] = &j;
    }
    size_t parents = 0, off_cpu = 0;
    for (const auto& [track, slices] : SlicesByTrack(doc)) {
      for (size_t i = 0; i < slices.size(); ++i) {
        const Slice& p = slices[i];
        const json& pe = *p.e;
        if (pe["cat"] != "kernel" || !pe["args"].contains("before_ns")) continue;
        const auto it = by_start.find({track.second, p.start});
        ASSERT_NE(it, by_start.end()) << pe.dump();
        const analysis::JointExit& j = *it->second;
        ++parents;
        EXPECT_EQ(p.end - p.start, static_cast<int64_t>(j.kernel_ns));
        EXPECT_EQ(pe["args"]["handler_ns"].get<uint64_t>(), j.handler_ns);
        // The children: the slices after it that start before it ends.
        int64_t at = p.start, child_sum = 0, off_sum = 0;
        bool handler = false;
        for (size_t k = i + 1; k < slices.size() && slices[k].start < p.end; ++k) {
          const Slice& c = slices[k];
          EXPECT_GE(c.start, p.start);
          EXPECT_LE(c.end, p.end);
          const json& ce = *c.e;
          if (ce["cat"] == "sched") {
            off_sum += c.end - c.start;
            ++off_cpu;
            continue;
          }
          EXPECT_EQ(c.start, at) << "the parts tile the kernel exit: " << ce.dump();
          at = c.end;
          child_sum += c.end - c.start;
          if (ce["cat"] == "exit") {
            handler = true;
            EXPECT_EQ(c.start + base, static_cast<int64_t>(j.handler_start_ns));
            EXPECT_EQ(c.end - c.start, static_cast<int64_t>(j.handler_wall_ns));
            const std::string name = ce["name"];
            if (!j.device.empty() && !j.reg.empty()) {
              EXPECT_NE(name.find(j.device + "." + j.reg), std::string::npos) << name;
            }
          } else {
            EXPECT_TRUE(ce["name"] == "kernel before" || ce["name"] == "kernel after") << ce.dump();
          }
        }
        EXPECT_TRUE(handler) << pe.dump();
        EXPECT_EQ(child_sum, static_cast<int64_t>(j.kernel_ns));
        EXPECT_EQ(off_sum, static_cast<int64_t>(j.off_cpu_ns)) << pe.dump();
      }
    }
    EXPECT_EQ(parents, view->matched.size());
    EXPECT_EQ(st->joint_exits, view->matched.size());
    if (jc.sched) {
      EXPECT_GT(off_cpu, 0u);
    } else {
      EXPECT_EQ(off_cpu, 0u);
    }
    size_t pairs = 0;
    ExpectAsyncPairs(doc, &pairs);
    EXPECT_GT(pairs, 0u);
  }
}

TEST(Timeline, WindowAndCapKeepTheRest) {
  const std::string path = Data("mmio-storm.esdump");
  auto dump = ReadDump(path);
  ASSERT_TRUE(dump);
  size_t total = 0;
  for (const DumpVcpu& v : dump->vcpus) total += v.exits.size() + (v.in_progress ? 1 : 0);
  {
    TimelineOptions cap;
    cap.max_exits = 100;
    const std::string out = TempPath("cap");
    auto st = WriteTimeline(In(&*dump, path), cap, out);
    ASSERT_TRUE(st);
    const json doc = ReadJson(out);
    // Each vCPU its share of the 100, by its exits.
    std::map<uint32_t, uint64_t> share;
    for (const DumpVcpu& v : dump->vcpus) {
      share[v.vcpu] = 100 * (v.exits.size() + (v.in_progress ? 1 : 0)) / total;
    }
    uint64_t drawn = 0;
    for (const auto& [track, slices] : SlicesByTrack(doc)) {
      EXPECT_EQ(slices.size(), share[static_cast<uint32_t>(track.second)]);
      drawn += slices.size();
    }
    EXPECT_LE(drawn, 100u);
    EXPECT_GE(drawn, 100u - dump->vcpus.size());
    EXPECT_EQ(st->vmm_exits + st->capped, total);
    EXPECT_GT(st->capped, 0u);
  }
  {
    TimelineOptions window;
    window.from_ns = 1'000'000;
    window.to_ns = 2'000'000;
    const std::string out = TempPath("window");
    auto st = WriteTimeline(In(&*dump, path), window, out);
    ASSERT_TRUE(st);
    const json doc = ReadJson(out);
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      EXPECT_GE(Ns(e["ts"]), 1'000'000);
      EXPECT_LT(Ns(e["ts"]), 2'000'000);
    }
    EXPECT_EQ(st->vmm_exits + st->left_out, total);
    EXPECT_GT(st->vmm_exits, 0u);
  }
}

TEST(Timeline, JsonStringsEscapedAndInvalidUtf8Replaced) {
  std::string s;
  static const char kIn[] = "a\"b\\c\n\x01 \xff\xfe ok \xc3\xa9 \xe2\x82";
  AppendJsonString(s, std::string_view(kIn, sizeof kIn - 1));
  const json j = json::parse(s);
  EXPECT_EQ(j.get<std::string>(),
            "a\"b\\c\n\x01 \xef\xbf\xbd\xef\xbf\xbd ok \xc3\xa9 "
            "\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(Timeline, UnwritableOutputIsAnIoError) {
  const std::string path = Data("hello-lsr-delay.esdump");
  auto dump = ReadDump(path);
  ASSERT_TRUE(dump);
  auto st = WriteTimeline(In(&*dump, path), {}, "/nonexistent-dir/t.json");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kIo);
  EXPECT_NE(st.error().message.find("/nonexistent-dir/t.json"), std::string::npos);
}

}  // namespace
}  // namespace exitscope::report
