// Tests of `--stacks` (sources/bpf/bpf_offcpu_stacks.h, offcpu_stacks.bpf.c): the program
// loaded for real, a thread of this test marked as inside an exit through the program's map
// (no kvm tracepoint fires on a host without KVM), blocked in read() on a pipe; then its
// kernel and user stacks, its off-CPU time, the drops and the symbolizer's marks. Needs root
// and BPF (skips with the reason otherwise). This file is built with frame pointers: the
// kernel unwinds user stacks by them. The end-to-end KVM and QEMU runs skip without KVM.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "analysis/kvm_stats.h"
#include "analysis/offcpu_exits.h"
#include "cli/offcpu_output.h"
#include "report/html_report.h"
#include "report/offcpu_report.h"
#include "report/renderer.h"
#include "sources/bpf/bpf_offcpu_stacks.h"
#include "support/run.h"

namespace exitscope::sources::bpf {
namespace {

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The user frames the test looks for: a reader two calls deep (the kernel's frame-pointer
// walk misses the direct caller of libc's read, which keeps no frame: docs/host-facts.md section
// 3).
__attribute__((noinline)) ssize_t OffCpuReadOnce(int fd, char* c) {
  const ssize_t n = ::read(fd, c, 1);
  asm volatile("" ::: "memory");
  return n;
}
__attribute__((noinline)) void OffCpuBlockedReader(int fd) {
  char c = 0;
  OffCpuReadOnce(fd, &c);
  asm volatile("" ::: "memory");
}

char ThreadState(pid_t tid) {
  const std::string s = test::ReadFile("/proc/self/task/" + std::to_string(tid) + "/stat");
  const size_t p = s.rfind(')');
  return p == std::string::npos || p + 2 >= s.size() ? 0 : s[p + 2];
}

std::unique_ptr<BpfOffCpuStacks> OpenOrWhy(const BpfOffCpuOptions& o, std::string* why) {
  if (!BpfOffCpuStacksBuilt()) {
    *why = "--bpf not possible here: built without the BPF program";
    return nullptr;
  }
  auto s = BpfOffCpuStacks::Open(o);
  if (!s) {
    *why = "--bpf not possible here: " + s.error().message;
    return nullptr;
  }
  return std::move(*s);
}

// One marked exit: the worker blocks in read() until the test writes; then it calls
// ioctl(KVM_RUN) on the pipe (ENOTTY, but sys_enter_ioctl sees it) and so ends its exit.
struct Blocked {
  uint64_t blocked_from = 0, written_at = 0;  // the lower bound of its time off the CPU
  uint32_t tid = 0;
  std::vector<OffCpuExit> in_flight;  // read while it was blocked
};

Blocked RunBlockedExit(BpfOffCpuStacks& s) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  std::atomic<pid_t> tid{0};
  std::atomic<bool> go{false};
  std::thread worker([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    while (!go) std::this_thread::yield();
    OffCpuBlockedReader(p[0]);
    ::ioctl(p[0], OS_KVM_RUN, 0);  // the next KVM_RUN: the exit ends
  });
  while (tid == 0) std::this_thread::yield();
  Blocked b;
  b.tid = static_cast<uint32_t>(tid.load());
  EXPECT_TRUE(s.MarkInside(static_cast<uint32_t>(::getpid()), b.tid));
  go = true;
  while (ThreadState(tid) != 'S') std::this_thread::sleep_for(std::chrono::microseconds(200));
  b.blocked_from = NowNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (auto f = s.InFlight(); f) b.in_flight = std::move(*f);
  b.written_at = NowNs();
  EXPECT_EQ(::write(p[1], "x", 1), 1);
  worker.join();
  ::close(p[0]);
  ::close(p[1]);
  return b;
}

bool HasFunction(const std::vector<StackFrame>& frames, const std::string& part) {
  return std::any_of(frames.begin(), frames.end(), [&](const StackFrame& f) {
    return f.function.find(part) != std::string::npos;
  });
}

bool HasText(const nlohmann::json& frames, const std::string& part) {
  return std::any_of(frames.begin(), frames.end(), [&](const nlohmann::json& f) {
    return f.get<std::string>().find(part) != std::string::npos;
  });
}

std::string Dump(const ThreadStack& st) {
  std::string s = "kernel:\n";
  for (const StackFrame& f : st.kernel) s += "  " + FormatFrame(f) + "\n";
  s += "user:\n";
  for (const StackFrame& f : st.user) s += "  " + FormatFrame(f) + "\n";
  return s + "note: " + st.note + "\n";
}

// `x` (a captured exit of the blocked reader) in kvm stat's final report: the table's section,
// the JSON array, the HTML section and the timeline's nested slices each have its frames.
void RenderedThroughEveryRenderer(const analysis::OffCpuSlowExit& x, const OffCpuSymbolizer& sym) {
  analysis::OffCpuSlowExits kept({.max_exits = 1000, .slow_ns = 1'000'000});
  kept.Add(x);
  kept.SetNotes(sym.notes());
  analysis::KvmAggregator agg({});
  agg.Finish();
  report::KvmModel k{.analysis = &agg.analysis()};
  k.context.input = "live";
  k.context.offcpu = &kept;
  const analysis::Diagnosis diagnosis{};  // no exits in the maps: only the line below
  k.context.diagnosis = &diagnosis;
  k.context.diagnosis_text.seen_from_kernel = report::OffCpuDiagnosisLine(kept);
  const report::ReportModel m{.kvm = &k};

  // The diagnosis's line: where it blocked in the kernel, and this test's own frame.
  const std::string line = report::OffCpuDiagnosisLine(kept);
  EXPECT_NE(line.find("tid " + std::to_string(x.exit.tid)), std::string::npos) << line;
  EXPECT_NE(line.find("blocked"), std::string::npos) << line;
  EXPECT_NE(line.find("pipe_read"), std::string::npos) << line;
  EXPECT_NE(line.find("bpf_offcpu_stacks_test.cc"), std::string::npos) << line;

  auto table = report::RenderText(report::kTableRenderer, m);
  ASSERT_TRUE(table) << table.error().message;
  EXPECT_NE(table->find("\n  " + line + "\n"), std::string::npos) << *table;  // the diagnosis
  const size_t sec = table->find("Slow exits seen from the kernel, with their stacks");
  ASSERT_NE(sec, std::string::npos) << *table;
  EXPECT_NE(table->find("Slow exit: tid " + std::to_string(x.exit.tid), sec), std::string::npos);
  EXPECT_NE(table->find("pipe_read+", sec), std::string::npos) << *table;
  EXPECT_NE(table->find("OffCpuBlockedReader", sec), std::string::npos) << *table;

  auto json = report::RenderText(report::kJsonRenderer, m);
  ASSERT_TRUE(json) << json.error().message;
  const nlohmann::json j = nlohmann::json::parse(*json);
  EXPECT_EQ(j["diagnosis"]["seen_from_kernel"], line);
  ASSERT_EQ(j["kernel_slow_exits"].size(), 1u) << *json;
  const nlohmann::json& je = j["kernel_slow_exits"][0];
  EXPECT_EQ(je, report::OffCpuExitJson(x));  // the live line's object
  EXPECT_EQ(je["tid"], x.exit.tid);
  EXPECT_FALSE(je["stuck"].get<bool>());
  EXPECT_EQ(j["kernel_slow_exits_left_out"], 0);
  const auto texts = [](const nlohmann::json& frames) {
    nlohmann::json t = nlohmann::json::array();
    for (const auto& f : frames) t.push_back(f["text"]);
    return t;
  };
  EXPECT_TRUE(HasText(texts(je["sites"][0]["kernel"]), "pipe_read")) << je.dump();
  EXPECT_TRUE(HasText(texts(je["sites"][0]["user"]), "OffCpuBlockedReader")) << je.dump();

  const std::string dir = ::testing::TempDir();
  const std::string html_path = dir + "offcpu_stacks_test.html";
  Status hs = report::WriteReport(report::kHtmlRenderer, m, html_path);
  if (std::string_view why = report::HtmlUnavailable(); !why.empty()) {
    EXPECT_FALSE(hs);  // this build has no plotting library: said so, not a page without it
  } else {
    ASSERT_TRUE(hs) << hs.error().message;
    const std::string html = test::ReadFile(html_path);
    EXPECT_NE(html.find("Slow exits seen from the kernel, with their stacks"), std::string::npos);
    EXPECT_NE(html.find("id=\"s-kernel-slow-exits\""), std::string::npos);
    EXPECT_NE(html.find("slowest exit seen from the kernel: tid "), std::string::npos);
    EXPECT_NE(html.find("pipe_read+"), std::string::npos);
    EXPECT_NE(html.find("OffCpuBlockedReader"), std::string::npos);
    std::printf("HTML page: %s\n", html_path.c_str());
  }

  const std::string tl_path = dir + "offcpu_stacks_test.json";
  Status ts = report::WriteReport(report::kTimelineRenderer, m, tl_path);
  ASSERT_TRUE(ts) << ts.error().message;
  const nlohmann::json tl = nlohmann::json::parse(test::ReadFile(tl_path));
  const nlohmann::json* parent = nullptr;
  std::vector<const nlohmann::json*> children;
  bool named = false;
  for (const nlohmann::json& ev : tl["traceEvents"]) {
    if (ev["pid"] != x.exit.tgid || ev["tid"] != x.exit.tid) continue;
    if (ev["ph"] == "M" && ev["name"] == "thread_name")
      named = ev["args"]["name"] == "thread " + std::to_string(x.exit.tid);
    if (ev["ph"] != "X") continue;
    if (ev["cat"] == "kernel-seen") parent = &ev;
    if (ev["cat"] == "off-cpu") children.push_back(&ev);
  }
  EXPECT_TRUE(named);
  ASSERT_NE(parent, nullptr) << tl.dump();
  EXPECT_EQ((*parent)["args"]["inside_ns"], x.inside_ns());
  ASSERT_EQ(children.size(), x.exit.sites.size());
  const double p0 = (*parent)["ts"].get<double>(), p1 = p0 + (*parent)["dur"].get<double>();
  for (const nlohmann::json* c : children) {  // nested: inside the exit's slice
    const double c0 = (*c)["ts"].get<double>(), c1 = c0 + (*c)["dur"].get<double>();
    EXPECT_GE(c0, p0);
    EXPECT_LE(c1, p1 + 1e-9);
  }
  const nlohmann::json& first = (*children.front())["args"];
  EXPECT_EQ(first["off_cpu_ns"], x.exit.sites.front().off_ns);
  EXPECT_TRUE(HasText(first["kernel"], "pipe_read")) << first.dump();
  EXPECT_TRUE(HasText(first["user"], "OffCpuBlockedReader")) << first.dump();
  EXPECT_NE((*children.front())["name"].get<std::string>().find("pipe_read"), std::string::npos);
}

TEST(BpfOffCpuStacks, BlockedReadHasPipeReadAndTheCallersFrames) {
  if (::geteuid() != 0) GTEST_SKIP() << "--bpf not possible here: needs root";
  std::string why;
  auto s = OpenOrWhy({.tgid = static_cast<uint32_t>(::getpid()), .slow_ns = 1}, &why);
  if (!s) GTEST_SKIP() << why;
  const Blocked b = RunBlockedExit(*s);

  auto ended = s->TakeEnded();
  ASSERT_TRUE(ended) << ended.error().message;
  auto it = std::find_if(ended->begin(), ended->end(),
                         [&](const OffCpuExit& e) { return e.tid == b.tid; });
  ASSERT_NE(it, ended->end()) << "the marked exit did not end at ioctl(KVM_RUN)";
  EXPECT_EQ(it->tgid, static_cast<uint32_t>(::getpid()));
  EXPECT_EQ(it->kind, OS_KIND_MARKED);
  EXPECT_GE(it->off_ns, b.written_at - b.blocked_from);
  EXPECT_GE(it->duration_ns(), it->off_ns);
  ASSERT_FALSE(it->sites.empty());

  // The longest site is the read: kernel frames of a pipe read, user frames of this test.
  OffCpuSymbolizer sym;
  const OffCpuSite& site = it->sites.front();
  EXPECT_GE(site.off_ns, b.written_at - b.blocked_from);
  const ThreadStack st = sym.Resolve(it->tgid, it->tid, site);
  std::printf("off the CPU %.3f ms of %.3f ms inside, %u switches; longest site:\n%s",
              static_cast<double>(it->off_ns) / 1e6, static_cast<double>(it->duration_ns()) / 1e6,
              it->switches, Dump(st).c_str());
  for (const std::string& n : sym.notes()) std::printf("symbolizer note: %s\n", n.c_str());
  EXPECT_TRUE(HasFunction(st.kernel, "pipe_read")) << Dump(st);
  EXPECT_TRUE(HasFunction(st.kernel, "schedule")) << Dump(st);
  EXPECT_TRUE(HasFunction(st.user, "OffCpuBlockedReader")) << Dump(st);
  EXPECT_EQ(st.tid, static_cast<int32_t>(b.tid));

  // What `kvm stat --bpf --stacks` prints for it: text, and one JSON object.
  const analysis::OffCpuSlowExit x = analysis::SymbolizeOffCpuExit(*it, sym, false);
  const std::string text = cli::OffCpuLive(x, false);
  EXPECT_EQ(text.rfind("Slow exit: tid " + std::to_string(b.tid) + " (pid ", 0), 0u) << text;
  EXPECT_NE(text.find("(marked)"), std::string::npos) << text;
  EXPECT_NE(text.find("blocked:"), std::string::npos) << text;
  EXPECT_NE(text.find("    kernel  __schedule+"), std::string::npos) << text;
  EXPECT_NE(text.find("pipe_read+"), std::string::npos) << text;
  EXPECT_NE(text.find("    user    "), std::string::npos) << text;
  EXPECT_NE(text.find("OffCpuBlockedReader"), std::string::npos) << text;
  const nlohmann::json j = nlohmann::json::parse(cli::OffCpuLive(x, true));
  ASSERT_TRUE(j.contains("slow_exit")) << j.dump();
  const nlohmann::json& je = j["slow_exit"];
  EXPECT_EQ(je["tid"], b.tid);
  EXPECT_EQ(je["off_cpu_ns"], it->off_ns);
  EXPECT_EQ(je["end_ns"], it->end_ns);
  ASSERT_FALSE(je["sites"].empty());
  const nlohmann::json& js = je["sites"][0];
  EXPECT_EQ(js["kernel"].size(), st.kernel.size());
  EXPECT_EQ(js["user"].size(), st.user.size());
  EXPECT_EQ(js["kernel"][0]["text"], FormatFrame(st.kernel[0]));
  EXPECT_FALSE(js["in_progress"].get<bool>());

  // While it was blocked, the in-flight view showed it off the CPU in the read.
  auto f = std::find_if(b.in_flight.begin(), b.in_flight.end(),
                        [&](const OffCpuExit& e) { return e.tid == b.tid; });
  ASSERT_NE(f, b.in_flight.end());
  EXPECT_EQ(f->end_ns, 0u);
  ASSERT_FALSE(f->sites.empty());
  EXPECT_TRUE(f->sites.front().in_progress);
  EXPECT_TRUE(HasFunction(sym.Resolve(f->tgid, f->tid, f->sites.front()).kernel, "pipe_read"));
  const analysis::OffCpuSlowExit fx = analysis::SymbolizeOffCpuExit(*f, sym, true);
  const std::string stuck = cli::OffCpuLive(fx, false);
  EXPECT_EQ(stuck.rfind("Stuck now: tid ", 0), 0u) << stuck;
  EXPECT_NE(stuck.find("still off the CPU there now"), std::string::npos) << stuck;
  EXPECT_TRUE(nlohmann::json::parse(cli::OffCpuLive(fx, true)).contains("stuck"));

  // The final report of `kvm stat --bpf --stacks`: the same exit through every renderer.
  RenderedThroughEveryRenderer(x, sym);

  const os_counters c = s->Counters();
  EXPECT_GE(c.captures, 1u);
  EXPECT_GE(c.slow, 1u);
}

TEST(BpfOffCpuStacks, FullStackMapCountsDrops) {
  if (::geteuid() != 0) GTEST_SKIP() << "--bpf not possible here: needs root";
  std::string why;
  // One stack map entry: the kernel stack takes it, the user stack finds its bucket taken.
  auto s = OpenOrWhy({.tgid = static_cast<uint32_t>(::getpid()), .slow_ns = 1, .stack_entries = 1},
                     &why);
  if (!s) GTEST_SKIP() << why;
  const Blocked b = RunBlockedExit(*s);
  auto ended = s->TakeEnded();
  ASSERT_TRUE(ended) << ended.error().message;
  auto it = std::find_if(ended->begin(), ended->end(),
                         [&](const OffCpuExit& e) { return e.tid == b.tid; });
  ASSERT_NE(it, ended->end());
  EXPECT_GE(it->stack_drops, 1u);
  EXPECT_GE(s->Counters().stack_drops, 1u);
  OffCpuSymbolizer sym;
  bool noted = false;
  for (const OffCpuSite& site : it->sites) {
    if (site.kstack_id < 0 || site.ustack_id < 0) {
      noted |= sym.Resolve(it->tgid, it->tid, site).note.find("not stored") != std::string::npos;
    }
  }
  EXPECT_TRUE(noted);
}

TEST(BpfOffCpuStacks, UnmarkedThreadsAreNotCaptured) {
  if (::geteuid() != 0) GTEST_SKIP() << "--bpf not possible here: needs root";
  std::string why;
  auto s = OpenOrWhy({.tgid = static_cast<uint32_t>(::getpid()), .slow_ns = 1}, &why);
  if (!s) GTEST_SKIP() << why;
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // switches of this test's threads
  auto ended = s->TakeEnded();
  ASSERT_TRUE(ended);
  EXPECT_TRUE(ended->empty());
  EXPECT_EQ(s->Counters().captures, 0u);
}

// `kvm stat --bpf --stacks` end to end (no KVM here: no exit is slow, the section is empty):
// the final report in each format has it, html and timeline go to -o FILE, stdout stays empty.
TEST(BpfOffCpuStacks, KvmStatWritesTheFinalReportInEveryFormat) {
  if (::geteuid() != 0) GTEST_SKIP() << "--bpf not possible here: needs root";
  const std::string bin = test::ExitscopeBinary();
  if (::access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " not built";
  const std::string dir = ::testing::TempDir();
  test::Ran t = test::Run({bin, "kvm", "stat", "--bpf", "--stacks", "--duration", "0.2"});
  if (t.err.find("--bpf not possible here") != std::string::npos) GTEST_SKIP() << t.err;
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("Slow exits seen from the kernel, with their stacks (20 ms or longer"),
            std::string::npos)
      << t.out;
  test::Ran j =
      test::Run({bin, "kvm", "stat", "--bpf", "--stacks", "--duration", "0.2", "--format", "json"});
  ASSERT_EQ(j.status, 0) << j.err;
  const nlohmann::json doc = nlohmann::json::parse(j.out);  // the final document, one line
  EXPECT_TRUE(doc["kernel_slow_exits"].is_array()) << j.out;
  EXPECT_EQ(doc["kernel_slow_ns"], 20'000'000);
  for (const char* format : {"timeline", "html"}) {
    const std::string path = dir + "kvm_stat_stacks." + format;
    test::Ran f = test::Run({bin, "kvm", "stat", "--bpf", "--stacks", "--duration", "0.2",
                             "--format", format, "-o", path});
    if (std::string(format) == "html" && !report::HtmlUnavailable().empty()) {
      EXPECT_EQ(f.status, 1) << f.err;  // this build cannot write HTML, and says so
      continue;
    }
    ASSERT_EQ(f.status, 0) << f.err;
    EXPECT_EQ(f.out, "");
    EXPECT_NE(f.err.find("wrote " + path + " (" + format + "): 0 slow exits seen from the kernel"),
              std::string::npos)
        << f.err;
    const std::string body = test::ReadFile(path);
    if (std::string(format) == "timeline") {
      EXPECT_TRUE(nlohmann::json::parse(body).contains("traceEvents")) << body;
    } else {
      EXPECT_NE(body.find("Slow exits seen from the kernel"), std::string::npos);
    }
  }
}

// The symbolizer marks what it cannot resolve, and says why once.
TEST(OffCpuSymbolizer, UnresolvableFramesAreMarkedWithWhyOnce) {
  OffCpuSymbolizer sym("/nonexistent/kallsyms");
  OffCpuSite site;
  site.kstack_id = 1;
  site.ustack_id = 2;
  site.kernel = {0xffffffff81000010ull, 0xffffffff81000020ull};
  site.user = {0x10, 0x20, 0x30};  // in no mapping of this process
  site.switches = 1;
  const ThreadStack st = sym.Resolve(static_cast<uint32_t>(::getpid()), 1, site);
  ASSERT_EQ(st.kernel.size(), 2u);
  ASSERT_EQ(st.user.size(), 3u);
  for (const StackFrame& f : st.kernel) EXPECT_TRUE(f.function.empty());
  for (const StackFrame& f : st.user) EXPECT_TRUE(f.function.empty());
  EXPECT_EQ(FormatFrame(st.kernel[0]), "0xffffffff81000010 [kernel]");
  const auto& notes = sym.notes();
  EXPECT_EQ(
      std::count_if(notes.begin(), notes.end(),
                    [](const std::string& n) { return n.find("kallsyms") != std::string::npos; }),
      1);
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("no mapping") != std::string::npos;
  }));
  sym.Resolve(static_cast<uint32_t>(::getpid()), 1, site);  // the same causes: no new notes
  EXPECT_EQ(sym.notes(), notes);
}

// The child of SecondProcessReusesFramesByBuildId (disabled: only that test runs it): this
// test binary run again (its own address layout), writing where OffCpuBlockedReader is to
// fd 3 and waiting for its stdin to close.
TEST(OffCpuSymbolizerChild, DISABLED_WritesAnAddressAndWaits) {
  if (std::getenv("EXITSCOPE_OFFCPU_CHILD") == nullptr) GTEST_SKIP() << "run by the test below";
  ::dprintf(3, "%llx\n",
            static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(&OffCpuBlockedReader)));
  char c;
  while (::read(0, &c, 1) > 0) {
  }
}

// Two processes of one binary: the second one's frames come from the build-id cache, without
// a libdw session of its own, and are the same frames.
TEST(OffCpuSymbolizer, SecondProcessReusesFramesByBuildId) {
  int in[2], out[2];
  ASSERT_EQ(::pipe(in), 0);
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(in[1]);  // else its stdin never ends
    ::close(out[0]);
    ::dup2(in[0], 0);
    ::dup2(out[1], 3);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::setenv("EXITSCOPE_OFFCPU_CHILD", "1", 1);
    ::execl("/proc/self/exe", "child", "--gtest_filter=OffCpuSymbolizerChild.*",
            "--gtest_also_run_disabled_tests", nullptr);
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  std::string addr;
  char c;
  while (::read(out[0], &c, 1) == 1 && c != '\n') addr += c;
  const uint64_t theirs = std::strtoull(addr.c_str(), nullptr, 16);
  const uint64_t ours = reinterpret_cast<uintptr_t>(&OffCpuBlockedReader);

  OffCpuSymbolizer sym;
  OffCpuSite site;
  site.switches = 1;
  site.user = {ours + 4};
  const ThreadStack a = sym.Resolve(static_cast<uint32_t>(::getpid()), 1, site);
  site.user = {theirs + 4};
  const ThreadStack b = sym.Resolve(static_cast<uint32_t>(child), 1, site);
  ::close(in[1]);  // the child ends
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(out[0]);

  ASSERT_NE(theirs, 0u) << "the child printed no address: '" << addr << "'";
  ASSERT_EQ(a.user.size(), 1u);
  ASSERT_EQ(b.user.size(), 1u);
  EXPECT_NE(a.user[0].function.find("OffCpuBlockedReader"), std::string::npos)
      << FormatFrame(a.user[0]);
  const OffCpuSymbolizer::CacheStats& st = sym.cache_stats();
  EXPECT_EQ(st.build_id_misses, 1u);
  EXPECT_EQ(st.build_id_hits, 1u) << "does this test binary have a build-id?";
  EXPECT_EQ(st.libdw_sessions, 1u);  // only this process's: the child's frames were cached
  EXPECT_EQ(b.user[0].ip, theirs + 4);
  StackFrame same = b.user[0];
  same.ip = a.user[0].ip;
  EXPECT_EQ(same, a.user[0]) << FormatFrame(a.user[0]) << " vs " << FormatFrame(b.user[0]);
  std::printf("this process: %s\nthe child (0x%llx): %s\n", FormatFrame(a.user[0]).c_str(),
              static_cast<unsigned long long>(theirs), FormatFrame(b.user[0]).c_str());
}

// The bound of the final report: the slowest kept, slowest first, the others counted.
TEST(OffCpuSlowExits, KeepsTheSlowestAndCountsTheRest) {
  analysis::OffCpuSlowExits kept({.max_exits = 3, .slow_ns = 1'000'000});
  for (uint64_t ms : {5, 40, 2, 30, 7}) {
    analysis::OffCpuSlowExit e;
    e.exit.tid = static_cast<uint32_t>(ms);
    e.exit.start_ns = 1'000'000'000;
    e.exit.end_ns = e.exit.start_ns + ms * 1'000'000;
    kept.Add(e);
  }
  ASSERT_EQ(kept.exits().size(), 3u);
  EXPECT_EQ(kept.exits()[0].exit.tid, 40u);
  EXPECT_EQ(kept.exits()[1].exit.tid, 30u);
  EXPECT_EQ(kept.exits()[2].exit.tid, 7u);
  EXPECT_EQ(kept.seen(), 5u);
  EXPECT_EQ(kept.left_out(), 2u);
  const std::string text = report::OffCpuSectionText(kept, 2);
  EXPECT_NE(text.find(": 5, slowest first (the 3 slowest kept, 2 more counted)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("... 1 more kept"), std::string::npos) << text;
}

TEST(OffCpuSymbolizer, StacksNotStoredSayWhy) {
  OffCpuSymbolizer sym;
  OffCpuSite site;
  site.kstack_id = -EEXIST;
  site.ustack_id = -EFAULT;
  const ThreadStack st = sym.Resolve(static_cast<uint32_t>(::getpid()), 1, site);
  EXPECT_TRUE(st.kernel.empty());
  EXPECT_TRUE(st.user.empty());
  EXPECT_NE(st.note.find("kernel stack not stored (stack map bucket taken"), std::string::npos)
      << st.note;
  EXPECT_NE(st.note.find("user stack not stored"), std::string::npos) << st.note;
}

// Without BPF, --stacks is refused in one line, never ignored (the tracefs fallback of
// `kvm stat --bpf` has no stacks); without --bpf it is a usage error.
TEST(BpfOffCpuStacksCli, WithoutBpfStacksIsRefusedInOneLine) {
  const std::string bin = test::ExitscopeBinary();
  if (::access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " not built";
  test::Ran r = test::Run({"/usr/bin/env", "EXITSCOPE_KERNEL_BTF=/nonexistent/btf", bin, "kvm",
                           "stat", "--bpf", "--stacks", "--duration", "0.1"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--bpf not possible here: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--stacks needs it"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");  // nothing streamed from tracefs instead

  test::Ran live = test::Run({"/usr/bin/env", "EXITSCOPE_KERNEL_BTF=/nonexistent/btf", bin, "kvm",
                              "live", "--stacks", "--stop-after", "0.1"});
  EXPECT_EQ(live.status, 1) << live.err;
  EXPECT_EQ(live.err,
            "exitscope kvm live: --stacks not possible here: no kernel BTF (/nonexistent/btf: No "
            "such file or directory)\n");
  EXPECT_EQ(live.out, "");

  test::Ran rec = test::Run({bin, "kvm", "record", "-o", "/nonexistent/x.dat", "--stacks"});
  EXPECT_EQ(rec.status, 2) << rec.err;
  EXPECT_EQ(std::count(rec.err.begin(), rec.err.end(), '\n'), 1) << rec.err;
  EXPECT_NE(rec.err.find("kvm record cannot keep off-CPU stacks"), std::string::npos) << rec.err;

  test::Ran u = test::Run({bin, "kvm", "stat", "--stacks"});
  EXPECT_EQ(u.status, 2) << u.err;
  EXPECT_EQ(u.err, "exitscope kvm stat: --stacks needs --bpf\n");
  test::Ran slow = test::Run({bin, "kvm", "stat", "--bpf", "--stacks", "--slow", "0"});
  EXPECT_EQ(slow.status, 2) << slow.err;
  EXPECT_EQ(std::count(slow.err.begin(), slow.err.end(), '\n'), 1) << slow.err;
  // The file formats of the final report: with --stacks and -o FILE only.
  test::Ran html = test::Run({bin, "kvm", "stat", "--bpf", "--format", "html", "-o", "/tmp/x"});
  EXPECT_EQ(html.status, 2) << html.err;
  EXPECT_EQ(html.err,
            "exitscope kvm stat: --format html needs --bpf --stacks (the slow exits seen from the "
            "kernel are what it draws)\n");
  test::Ran tl = test::Run({bin, "kvm", "stat", "--bpf", "--stacks", "--format", "timeline"});
  EXPECT_EQ(tl.status, 2) << tl.err;
  EXPECT_EQ(tl.err, "exitscope kvm stat: --format timeline needs -o FILE\n");
  test::Ran o = test::Run({bin, "kvm", "stat", "--bpf", "--stacks", "-o", "/tmp/x"});
  EXPECT_EQ(o.status, 2) << o.err;
  EXPECT_EQ(o.err, "exitscope kvm stat: -o is for --format html or timeline\n");
}

// The reference VMM as a subject: 300 ms backend delays show with kernel and user frames.
TEST(BpfOffCpuStacksKvm, ReferenceVmmSlowExitsHaveStacks) {
  SKIP_WITHOUT_KVM();
  if (::geteuid() != 0) GTEST_SKIP() << "--bpf not possible here: needs root";
  test::Ran r = test::RunExitscope("kvm stat --bpf --stacks -- " + test::ExitscopeBinary() +
                                       " run --guest blk --inject backend-delay:nvme0:300:64",
                                   false);
  if (r.err.find("--bpf not possible here") != std::string::npos) GTEST_SKIP() << r.err;
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Slow exit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[kernel]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[exitscope]"), std::string::npos) << r.out;
}

// A real QEMU whose vCPU thread blocks in an isa-debugcon write to a pipe nobody reads
// (docs/host-facts.md section 3): its kernel stack where it blocked.
TEST(BpfOffCpuStacksKvm, QemuDebugconWriteBlocksWithKernelStack) {
  SKIP_WITHOUT_KVM();
  if (::geteuid() != 0) GTEST_SKIP() << "--bpf not possible here: needs root";
  if (test::RunShell("command -v qemu-system-x86_64").status != 0) {
    GTEST_SKIP() << "qemu-system-x86_64 not installed";
  }
  char dir_tmpl[] = "/tmp/exitscope-qemu-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_tmpl), nullptr);
  const std::string dir = dir_tmpl;
  // A real-mode guest looping on `out 0x402, al` (mov al,'x'; out 0x402; jmp): a boot sector.
  const std::string boot = dir + "/boot.img";
  ASSERT_EQ(test::RunShell("printf '\\260\\170\\272\\002\\004\\356\\353\\375' > " + boot +
                           " && truncate -s 510 " + boot + " && printf '\\125\\252' >> " + boot)
                .status,
            0);
  ASSERT_EQ(test::RunShell("mkfifo " + dir + "/d.in " + dir + "/d.out").status, 0);
  // P.out held open (so QEMU's writes do not fail) and never read.
  const std::string qemu =
      "exec 3<>" + dir + "/d.out; exec 4<>" + dir + "/d.in; exec qemu-system-x86_64 -accel kvm " +
      "-name q,debug-threads=on -display none -nodefaults -drive format=raw,file=" + boot +
      " -chardev pipe,id=d,path=" + dir + "/d -device isa-debugcon,iobase=0x402,chardev=d";
  test::Ran r =
      test::RunExitscope("kvm stat --bpf --stacks --duration 3 -- sh -c '" + qemu + "'", false);
  test::RunShell("rm -rf " + dir);
  if (r.err.find("--bpf not possible here") != std::string::npos) GTEST_SKIP() << r.err;
  EXPECT_NE(r.out.find("nanosleep"), std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace exitscope::sources::bpf
