// Text trace parsing: trace-cmd report lines (real, from the capture), ftrace `trace` lines
// with latency flags and tgid, `perf script` lines in perf's real layout
// ("%16s %5d [%03d] %12.6f: sys:event: fmt", checked against `perf script` output of sched
// tracepoints on this machine), kvm_exit print-fmt text for VMX / SVM / PVM, lost-event
// markers, and errors on malformed or truncated input.
#include "sources/trace_text.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

namespace exitscope::sources {
namespace {

struct Parsed {
  TextLineKind kind;
  KvmRecord rec;
  int64_t lost = 0;
  TextFlavor flavor = TextFlavor::kAuto;
};

Parsed Parse(std::string_view line, TextOptions o = {}) {
  Parsed p;
  p.kind = ParseTraceLine(line, o, &p.rec, &p.lost, &p.flavor);
  return p;
}

// sched:sched_switch (the joint view's off-CPU split), in trace-cmd report's plugin format
// (from `trace-cmd report testdata/kvm-host/joint-sched.dat`) and ftrace's key=value format.
TEST(TraceText, SchedSwitchInBothFormats) {
  Parsed p = Parse(
      "       exitscope-19450 [000]33499111837062: sched_switch:         exitscope:19450 [120] S "
      "==> exitscope:19451 [120]");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.type, KvmEventType::kSchedSwitch);
  EXPECT_EQ(p.rec.prev_tid, 19450);
  EXPECT_EQ(p.rec.next_tid, 19451);
  EXPECT_NE(p.rec.prev_state, 0u);  // S: sleeping
  p = Parse(
      "       exitscope-19451 [000]33498974389244: sched_switch:         exitscope:19451 [120] R "
      "==> cc1plus:19282 [139]");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.prev_tid, 19451);
  EXPECT_EQ(p.rec.next_tid, 19282);
  EXPECT_EQ(p.rec.prev_state, 0u);  // R: preempted
  p = Parse(
      "     exitscope-19451   [001] d..2.  5.000100: sched_switch: prev_comm=vcpu 0 prev_pid=19451 "
      "prev_prio=120 prev_state=R+ ==> next_comm=swapper/1 next_pid=0 next_prio=120");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.type, KvmEventType::kSchedSwitch);
  EXPECT_EQ(p.rec.prev_tid, 19451);
  EXPECT_EQ(p.rec.next_tid, 0);
  EXPECT_EQ(p.rec.prev_state, 0u);
}

TEST(TraceText, TraceCmdReportLinesFromTheCapture) {
  Parsed p = Parse(
      "            pvmx-16330 [000]4396959646611: kvm_userspace_exit:   reason KVM_EXIT_IO (2)");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.flavor, TextFlavor::kTraceCmdReport);
  EXPECT_EQ(p.rec.type, KvmEventType::kUserspaceExit);
  EXPECT_EQ(p.rec.tid, 16330);
  EXPECT_EQ(p.rec.cpu, 0u);
  EXPECT_EQ(p.rec.ts, 4396959646611u);
  EXPECT_EQ(p.rec.reason, 2u);

  p = Parse(
      "            pvmx-16330 [000]4396959623471: kvm_pio:              pio_write at 0x3f8 "
      "size 1 count 1 val 0x0 ");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.type, KvmEventType::kPio);
  EXPECT_EQ(p.rec.addr, 0x3f8u);
  EXPECT_EQ(p.rec.write, 1u);
  EXPECT_EQ(p.rec.size, 1u);

  p = Parse(
      "            pvmx-16332 [000]4397200537326: kvm_mmio:             mmio write len 4 "
      "gpa 0xd0000 val 0x0");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.type, KvmEventType::kMmio);
  EXPECT_EQ(p.rec.mmio_type, kKvmMmioWrite);
  EXPECT_EQ(p.rec.addr, 0xd0000u);
  EXPECT_EQ(p.rec.size, 4u);

  p = Parse("            pvmx-16330 [000]4396959617075: kvm_emulate_insn:     0:1000: ee");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.guest_rip, 0x1000u);
  ASSERT_EQ(p.rec.insn_len, 1);
  EXPECT_EQ(p.rec.insn[0], 0xee);

  p = Parse(
      "            pvmx-16330 [000]4397190021210: kvm_inj_exception:    [FAILED TO PARSE] "
      "exception=13 has_error=1 error_code=0 reinjected=0");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.exception, 13);
  EXPECT_EQ(p.rec.has_error, 1);

  p = Parse(
      "       kdamond.0-78    [001]4397278666884: kvm_age_hva:          mmu notifier age "
      "hva: 0x007f78dfd07000 -- 0x007f78dfd08000");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.type, KvmEventType::kOther);
  EXPECT_EQ(p.rec.tid, 78);
  EXPECT_EQ(p.rec.cpu, 1u);

  EXPECT_EQ(Parse("cpus=2").kind, TextLineKind::kSkip);
  EXPECT_EQ(Parse("").kind, TextLineKind::kSkip);
  EXPECT_EQ(Parse("# tracer: nop").kind, TextLineKind::kSkip);
}

TEST(TraceText, FtraceLinesWithFlagsTgidAndDecimalSeconds) {
  Parsed p = Parse("       CPU 0/KVM-4711    (   4700) [002] d..1.  1234.567890: kvm_fpu: load");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.flavor, TextFlavor::kFtrace);
  EXPECT_EQ(p.rec.tid, 4711);
  EXPECT_EQ(p.rec.tgid, 4700);
  EXPECT_EQ(p.rec.cpu, 2u);
  EXPECT_EQ(p.rec.ts, 1234567890000u);
  EXPECT_EQ(p.rec.type, KvmEventType::kFpu);
  EXPECT_EQ(p.rec.write, 1u);

  p = Parse(
      "  qemu-system-x86-4711 [002] .....  1234.567890123: kvm_entry: vcpu 3, rip 0x1000 "
      "intr_info 0x00000000 error_code 0x00000000");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.ts, 1234567890123u);
  EXPECT_EQ(p.rec.type, KvmEventType::kEntry);
  EXPECT_EQ(p.rec.vcpu_id, 3);
}

TEST(TraceText, PerfScriptLines) {
  // perf script: "%16s %5d [%03d] %12.6f: sys:event: fmt" (comm may contain spaces).
  Parsed p = Parse(
      "       CPU 0/KVM  4711 [002]  1154.938397: kvm:kvm_exit: vcpu 0 reason EPT_MISCONFIG rip "
      "0xffffffff8106e5d4 info1 0x0000000000000000 info2 0x0000000000000000 intr_info 0x00000000 "
      "error_code 0x00000000 requests 0x0000000000000000");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.flavor, TextFlavor::kPerfScript);
  EXPECT_EQ(p.rec.tid, 4711);
  EXPECT_EQ(p.rec.cpu, 2u);
  EXPECT_EQ(p.rec.ts, 1154938397000u);
  EXPECT_EQ(p.rec.type, KvmEventType::kExit);
  EXPECT_EQ(p.rec.exit_reason, 49u);
  EXPECT_EQ(p.rec.isa, 1u);
  EXPECT_EQ(p.rec.guest_rip, 0xffffffff8106e5d4u);
  EXPECT_EQ(p.rec.vcpu_id, 0);

  p = Parse(
      "  qemu-system-x86  4700/4711 [002]  1154.938399: kvm:kvm_pio: pio_read at 0x3fd "
      "size 1 count 1 val 0x60 ");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.tgid, 4700);
  EXPECT_EQ(p.rec.tid, 4711);
  EXPECT_EQ(p.rec.write, 0u);
  EXPECT_EQ(p.rec.data, 0x60u);

  p = Parse("            qemu  4711 [000]  1154.938400: kvm:kvm_msr: msr_write 6e0 = 0x2a7c5f3e1 ");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.type, KvmEventType::kMsr);
  EXPECT_EQ(p.rec.addr, 0x6e0u);
  EXPECT_EQ(p.rec.write, 1u);
  EXPECT_EQ(p.rec.data, 0x2a7c5f3e1u);

  p = Parse(
      "            qemu  4711 [000]  1154.938401: kvm:kvm_hypercall: nr 0x9 a0 0x1 a1 0x0 "
      "a2 0x0 a3 0x0");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.addr, 9u);
}

TEST(TraceText, ExitReasonsFromPrintFmtText) {
  auto exit_line = [](std::string_view reason) {
    return std::string("  qemu-4711 [001]  10.000001: kvm_exit: vcpu 1 reason ") +
           std::string(reason) +
           " rip 0x1000 info1 0x0000000000000000 info2 0x0000000017088208 intr_info 0x00000000 "
           "error_code 0x00000000 requests 0x0000000000000000";
  };
  Parsed p = Parse(exit_line("HLT"));
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.isa, 1u);
  EXPECT_EQ(p.rec.exit_reason, 12u);

  p = Parse(exit_line("INVALID_STATE FAILED_VMENTRY"));
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.exit_reason, 0x80000021u);

  p = Parse(exit_line("npf"));
  EXPECT_EQ(p.rec.isa, 2u);
  EXPECT_EQ(p.rec.exit_reason, 0x400u);

  // A PVM host prints reasons through the SVM table: 0x20000 has no name there.
  p = Parse(exit_line("0x20000"));
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.isa, 3u);
  EXPECT_EQ(p.rec.exit_reason, 0x20000u);
  EXPECT_EQ(p.rec.info2, 0x17088208u);

  // ... and PF excp (14 = 0x00e) has none either; with --isa pvm SVM names map back too.
  p = Parse(exit_line("read_cr0"), {.isa = Isa::kPvm});
  EXPECT_EQ(p.rec.isa, 3u);
  EXPECT_EQ(p.rec.exit_reason, 0u);

  EXPECT_EQ(Parse("  qemu-4711 [001]  10.000001: kvm_exit: vcpu 1 reason HLT").kind,
            TextLineKind::kBad);
}

TEST(TraceText, LostEventsMarkers) {
  Parsed p = Parse("CPU:3 [LOST 1234 EVENTS]");
  ASSERT_EQ(p.kind, TextLineKind::kLost);
  EXPECT_EQ(p.rec.cpu, 3u);
  EXPECT_EQ(p.lost, 1234);
  p = Parse("CPU:0 [LOST EVENTS]");
  ASSERT_EQ(p.kind, TextLineKind::kLost);
  EXPECT_EQ(p.lost, -1);
}

struct Count : EventSink {
  int n = 0;
  void OnExit(const ExitEvent&) override { ++n; }
};

TEST(TraceText, ReadAllPairsAndCountsLoss) {
  const std::string text =
      "cpus=1\n"
      "  vmm-10 [000]  1.000000000: kvm_fpu: load\n"
      "  vmm-10 [000]  1.000000100: kvm_pio: pio_write at 0x3f8 size 1 count 1 val 0x41 \n"
      "  vmm-10 [000]  1.000000200: kvm_fpu: unload\n"
      "  vmm-10 [000]  1.000000300: kvm_userspace_exit: reason KVM_EXIT_IO (2)\n"
      "  vmm-10 [000]  1.000025300: kvm_fpu: load\n"
      "CPU:0 [LOST 7 EVENTS]\n"
      "  vmm-10 [000]  1.000030000: kvm_userspace_exit: reason KVM_EXIT_HLT (5)\n";
  auto t = TraceText::FromString(text, "mem.txt");
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->clock(), "local");
  Count sink;
  KvmPairer p({}, &sink);
  ASSERT_TRUE((*t)->ReadAll(&p).has_value());
  EXPECT_EQ(sink.n, 2);  // the IO exit, and the HLT exit emitted open at end of trace
  EXPECT_EQ(p.stats().paired(), 1u);
  EXPECT_EQ(p.stats().lost_events, 7u);
  EXPECT_EQ(p.stats().unpaired_exits, 1u);  // the HLT exit never ended
  EXPECT_EQ(p.stats().open_at_end, 1u);
}

TEST(TraceText, MalformedLineIsAnErrorWithLineAndOffset) {
  const std::string good = "  vmm-10 [000]  1.000000000: kvm_fpu: load\n";
  auto t = TraceText::FromString(good + good + "  vmm-10 [000]  1.000000300: kvm_pio: garbage\n",
                                 "bad.txt");
  ASSERT_TRUE(t.has_value());
  KvmPairer p({}, nullptr);
  const Status s = (*t)->ReadAll(&p);
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(s.error().message.find("bad.txt: line 3 (offset " + std::to_string(2 * good.size())),
            std::string::npos)
      << s.error().message;

  // A file cut inside a line.
  auto cut = TraceText::FromString(good + "  vmm-10 [000]  1.00000", "cut.txt");
  ASSERT_TRUE(cut.has_value());
  const Status s2 = (*cut)->ReadAll(&p);
  ASSERT_FALSE(s2.has_value());
  EXPECT_NE(s2.error().message.find("truncated last line"), std::string::npos)
      << s2.error().message;

  auto junk = TraceText::FromString("hello world\n", "junk.txt");
  ASSERT_FALSE(junk.has_value());
  EXPECT_NE(junk.error().message.find("junk.txt: line 1 (offset 0)"), std::string::npos)
      << junk.error().message;
  auto empty = TraceText::FromString("", "empty.txt");
  ASSERT_FALSE(empty.has_value());
  EXPECT_NE(empty.error().message.find("empty.txt"), std::string::npos);
}

TEST(TraceText, RecordCutMidValueIsTruncatedAtTheExactOffset) {
  // The last record parses as a shorter one ("val 0x4" for "val 0x41"): it must be refused.
  const std::string good =
      "  vmm-10 [000]  1.000000000: kvm_fpu: load\n"
      "  vmm-10 [000]  1.000000100: kvm_pio: pio_write at 0x3f8 size 1 count 1 val 0x41 \n";
  const std::string cut =
      "  vmm-10 [000]  1.000000200: kvm_pio: pio_write at 0x3f8 size 1 count "
      "1 val 0x4";
  auto t = TraceText::FromString(good + cut, "cut.txt");
  ASSERT_TRUE(t.has_value()) << t.error().message;
  KvmPairer p({}, nullptr);
  const Status s = (*t)->ReadAll(&p);
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(s.error().message.find("cut.txt: offset " + std::to_string(good.size() + cut.size()) +
                                   ": truncated last line (line 3, from offset " +
                                   std::to_string(good.size())),
            std::string::npos)
      << s.error().message;
  EXPECT_EQ(p.stats().records[static_cast<size_t>(KvmEventType::kPio)], 1u);
  // A complete last line and a trailing partial comment are fine.
  auto whole = TraceText::FromString(good + "# end", "whole.txt");
  ASSERT_TRUE(whole.has_value());
  KvmPairer p2({}, nullptr);
  EXPECT_TRUE((*whole)->ReadAll(&p2).has_value());
}

struct Reasons : EventSink {
  std::vector<std::string> reasons;
  std::vector<ExitEnd> ends;
  void OnExit(const ExitEvent& e) override {
    reasons.emplace_back(e.reason);
    ends.push_back(e.end);
  }
};

TEST(TraceText, ExitsWithoutEntriesKeepTheirPrintedReasonsAndHaveNoTime) {
  // `trace-cmd report | grep kvm_exit`: exits and nothing else, a reason no table knows, and a
  // bare number that is no PVM reason.
  const std::string text =
      "  qemu-7 [000]  1.000000000: kvm_exit: vcpu 0 reason HLT rip 0x1000 info1 0x0 info2 0x0 "
      "intr_info 0x0 error_code 0x0\n"
      "  qemu-7 [000]  1.000001000: kvm_exit: vcpu 0 reason FANCY_NEW_EXIT rip 0x1002 info1 0x0 "
      "info2 0x0 intr_info 0x0 error_code 0x0\n"
      "  qemu-7 [000]  1.000002000: kvm_exit: vcpu 0 reason 4242 rip 0x1004 info1 0x0 info2 "
      "0x0 intr_info 0x0 error_code 0x0\n"
      "  qemu-7 [000]  1.000003000: kvm_exit: vcpu 0 reason HLT rip 0x1000 info1 0x0 info2 0x0 "
      "intr_info 0x0 error_code 0x0\n";
  auto t = TraceText::FromString(text, "grep.txt");
  ASSERT_TRUE(t.has_value()) << t.error().message;
  Reasons sink;
  KvmPairer p({}, &sink);
  ASSERT_TRUE((*t)->ReadAll(&p).has_value());
  ASSERT_EQ(sink.reasons.size(), 4u);
  EXPECT_EQ(sink.reasons[0], "HLT");
  EXPECT_EQ(sink.reasons[1], "FANCY_NEW_EXIT");
  EXPECT_EQ(sink.reasons[2], "4242");
  EXPECT_EQ(sink.reasons[3], "HLT");
  for (ExitEnd e : sink.ends) EXPECT_EQ(e, ExitEnd::kNotTraced);
  EXPECT_EQ(p.stats().exits_time_unknown, 4u);
  EXPECT_EQ(p.stats().paired(), 0u);
  EXPECT_EQ(p.stats().unpaired_exits, 0u);
}

// Lines trimmed to their timestamp, as traces are quoted in mails (the shape of issue 26:
// "220.696239: kvm_exit: vcpu 0 reason vintr rip 0x4004ae info1 ..."; SVM's print fmt).
TEST(TraceText, LinesTrimmedToATimestampAreReadWithTheVcpuAsThread) {
  constexpr std::string_view kExit =
      "220.696239: kvm_exit: vcpu 0 reason vintr rip 0x4004ae info1 0x0000000000000000 info2 "
      "0x0000000000000000 intr_info 0x00000000 error_code 0x00000000";
  Parsed p = Parse(kExit);
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.flavor, TextFlavor::kTimestampOnly);
  EXPECT_EQ(p.rec.type, KvmEventType::kExit);
  EXPECT_EQ(p.rec.ts, 220696239000u);
  EXPECT_EQ(p.rec.isa, 2u);  // SVM
  EXPECT_EQ(p.rec.exit_reason, 0x64u);
  EXPECT_EQ(p.rec.guest_rip, 0x4004aeu);
  EXPECT_EQ(p.rec.vcpu_id, 0);
  EXPECT_EQ(p.rec.tid, 0);                                           // the vCPU is the thread
  EXPECT_EQ(p.rec.tgid, 0);                                          // of VM 0
  p = Parse("    220.696240: kvm:kvm_entry: vcpu 3, rip 0x4004ae");  // perf's event name, indented
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.flavor, TextFlavor::kTimestampOnly);
  EXPECT_EQ(p.rec.tid, 3);
  p = Parse("4396959623471: kvm_pio:              pio_write at 0x3f8 size 1 count 1 val 0x0 ");
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.ts, 4396959623471u);  // an integer counter (x86-tsc)
  EXPECT_EQ(p.rec.addr, 0x3f8u);
  EXPECT_EQ(p.rec.tid, -1);  // names no vCPU: TraceText gives it the last one named
  // Still malformed: a payload that is not its event's, a fraction too long.
  EXPECT_EQ(Parse("220.696239: kvm_pio: garbage").kind, TextLineKind::kBad);
  EXPECT_EQ(Parse("220.1234567890: kvm_fpu: load").kind, TextLineKind::kBad);

  // Two vCPUs interleaved: each exit pairs with the next entry of its own vCPU, and the
  // kvm_pio between vCPU 0's exit and entry gives that exit its port.
  const std::string text =
      "220.696239: kvm_exit: vcpu 0 reason vintr rip 0x4004ae info1 0x0000000000000000 info2 "
      "0x0000000000000000 intr_info 0x00000000 error_code 0x00000000\n"
      "220.696240: kvm_exit: vcpu 1 reason hlt rip 0x400500 info1 0x0000000000000000 info2 "
      "0x0000000000000000 intr_info 0x00000000 error_code 0x00000000\n"
      "220.696241: kvm_entry: vcpu 0, rip 0x4004ae\n"
      "220.696250: kvm_exit: vcpu 0 reason io rip 0x4004b0 info1 0x0000000003f80210 info2 "
      "0x00000000004004b2 intr_info 0x00000000 error_code 0x00000000\n"
      "220.696251: kvm_pio: pio_write at 0x3f8 size 1 count 1 val 0x41\n"
      "220.696262: kvm_entry: vcpu 0, rip 0x4004b2\n"
      "220.697240: kvm_entry: vcpu 1, rip 0x400501\n";
  auto t = TraceText::FromString(text, "mail.txt");
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->flavor(), TextFlavor::kTimestampOnly);
  EXPECT_EQ((*t)->clock(), "local");
  struct Sink : EventSink {
    std::vector<ExitEvent> exits;
    std::vector<std::string> reasons;
    void OnExit(const ExitEvent& e) override {
      exits.push_back(e);
      reasons.emplace_back(e.reason);
    }
  } sink;
  KvmPairer pairer({}, &sink);
  ASSERT_TRUE((*t)->ReadAll(&pairer).has_value());
  EXPECT_EQ(pairer.stats().kernel_exits, 3u);
  EXPECT_EQ(pairer.stats().unpaired_exits, 0u);
  EXPECT_EQ(pairer.stats().entries_without_exit, 0u);
  ASSERT_EQ(sink.exits.size(), 3u);
  EXPECT_EQ(sink.reasons, (std::vector<std::string>{"vintr", "io", "hlt"}));
  EXPECT_EQ(sink.exits[0].vcpu, 0u);
  EXPECT_EQ(sink.exits[0].duration_ns, 2000u);
  EXPECT_EQ(sink.exits[1].vcpu, 0u);
  EXPECT_EQ(sink.exits[1].duration_ns, 12000u);
  EXPECT_EQ(sink.exits[1].subkey_kind, SubKeyKind::kPort);
  EXPECT_EQ(sink.exits[1].subkey, 0x3f8u);
  EXPECT_EQ(sink.exits[1].value, 0x41u);
  EXPECT_EQ(sink.exits[2].vcpu, 1u);
  EXPECT_EQ(sink.exits[2].duration_ns, 1000000u);
  for (const ExitEvent& e : sink.exits) EXPECT_EQ(e.vm, 0u);
}

// The real capture's first 120 event lines, trimmed to their timestamps
// (testdata/kvm/pvm-user64-pio-mmio-hlt-trimmed.txt, README there): one vCPU thread whose
// records name no vCPU (kvm-pvm has no kvm_exit). They pair exactly as the untrimmed lines.
TEST(TraceText, TheRealCaptureTrimmedPairsAsTheUntrimmedLines) {
  const std::string dir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/";
  std::string untrimmed;
  {
    std::ifstream in(dir + "pvm-user64-pio-mmio-hlt.txt");
    std::string line;
    for (int i = 0; i < 121 && std::getline(in, line); ++i) untrimmed += line + "\n";
  }
  auto full = TraceText::FromString(untrimmed, "head.txt");
  ASSERT_TRUE(full.has_value()) << full.error().message;
  auto trimmed = TraceText::Open(dir + "pvm-user64-pio-mmio-hlt-trimmed.txt");
  ASSERT_TRUE(trimmed.has_value()) << trimmed.error().message;
  EXPECT_EQ((*trimmed)->flavor(), TextFlavor::kTimestampOnly);
  EXPECT_EQ((*trimmed)->clock(), "x86-tsc");
  struct Sink : EventSink {
    std::vector<std::tuple<uint64_t, uint64_t, std::string, uint64_t, uint64_t, bool>> exits;
    void OnExit(const ExitEvent& e) override {
      exits.emplace_back(e.start_ns, e.duration_ns, std::string(e.reason), e.subkey, e.value,
                         e.userspace);
    }
  } a, b;
  KvmPairer pa({}, &a), pb({}, &b);
  ASSERT_TRUE((*full)->ReadAll(&pa).has_value());
  ASSERT_TRUE((*trimmed)->ReadAll(&pb).has_value());
  EXPECT_EQ(pb.stats().records_total, 120u);
  EXPECT_EQ(pb.stats().userspace_exits, 22u);  // 23 IO exits, the last open at end
  EXPECT_EQ(pb.stats().open_at_end, 1u);
  EXPECT_EQ(a.exits, b.exits);
  EXPECT_EQ(pa.stats().exits, pb.stats().exits);
  EXPECT_EQ(pa.stats().children_outside_exit, pb.stats().children_outside_exit);
}

// PVM hypercalls printed by name ("reason HYPERCALL", the number in info2: the maintainers'
// encoding, as a kernel whose print table names PVM reasons writes it) split into HC_* rows
// exactly as the same exit printed as "reason 0x20000" does; HC_ reasons printed by name too.
TEST(TraceText, HypercallByNameSplitsLikeTheBareNumber) {
  const auto exit_line = [](std::string_view reason, double ts, std::string_view info2) {
    return fmt::format(
        "  pvm-4711 [001]  {:.6f}: kvm_exit: vcpu 1 reason {} rip 0xffffffff81001000 info1 "
        "0x0000000000000000 info2 {} intr_info 0x00000000 error_code 0x00000000\n",
        ts, reason, info2);
  };
  const auto entry_line = [](double ts) {
    return fmt::format("  pvm-4711 [001]  {:.6f}: kvm_entry: vcpu 1, rip 0xffffffff81001003\n", ts);
  };
  const auto reasons = [&](std::string_view hypercall) {
    std::string text;
    double ts = 10;
    // HC_WRMSR (0x17088208), HC_IRQ_HALT (+2), HC_LOAD_PGTBL (+0), a number no HC_ has (9).
    for (std::string_view info2 :
         {"0x0000000017088208", "0x0000000017088202", "0x0000000017088200", "0x0000000000000009"}) {
      text += exit_line(hypercall, ts, info2) + entry_line(ts + 0.000002);
      ts += 0.00001;
    }
    text += exit_line("HC_TLB_FLUSH", ts, "0x0000000000000000") + entry_line(ts + 0.000002);
    auto t = TraceText::FromString(text, "pvm.txt");
    EXPECT_TRUE(t.has_value()) << t.error().message;
    Reasons sink;
    KvmPairer p({}, &sink);
    if (t) {
      EXPECT_TRUE((*t)->ReadAll(&p).has_value());
    }
    EXPECT_EQ(p.stats().kernel_exits, 5u);
    return sink.reasons;
  };
  const std::vector<std::string> want = {"HC_WRMSR", "HC_IRQ_HALT", "HC_LOAD_PGTBL", "HYPERCALL",
                                         "HC_TLB_FLUSH"};
  EXPECT_EQ(reasons("0x20000"), want);
  EXPECT_EQ(reasons("HYPERCALL"), want);
  Parsed p = Parse(exit_line("HYPERCALL", 1, "0x0000000017088208"));
  ASSERT_EQ(p.kind, TextLineKind::kRecord);
  EXPECT_EQ(p.rec.isa, 3u);  // PVM
  EXPECT_EQ(p.rec.exit_reason, 0x20000u);
  EXPECT_EQ(p.rec.info2, 0x17088208u);
  EXPECT_TRUE(p.rec.reason_name.empty());  // a table knows it
  p = Parse(exit_line("HC_WRMSR", 1, "0x0"));
  EXPECT_EQ(p.rec.isa, 3u);
  EXPECT_EQ(p.rec.exit_reason, 0x20009u);
}

}  // namespace
}  // namespace exitscope::sources
