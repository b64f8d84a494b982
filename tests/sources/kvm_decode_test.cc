// kvm_exit decoding on records built from the real 6.18 format files and decoded through
// libtraceevent + KvmTepDecoder: VMX, SVM, PVM (every HC_* reason, both hypercall encodings,
// FAILED_VMENTRY, fork numbering), and the other kvm events' fields.
#include "sources/kvm_decode.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvm_tep_fixture.h"
#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"

namespace exitscope::sources {
namespace {

using exitscope::testing::RealKvmFormats;

class KvmDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Committed test data: missing files fail the test, they never skip it.
    ASSERT_EQ(formats_.loaded(), 13)
        << "expected the 13 kvm format files of testdata under " << testing::KvmTestdata("");
  }

  // Builds a kvm_exit record, decodes it through the tep, returns the record.
  KvmRecord Exit(uint32_t reason, uint32_t isa, uint64_t info1 = 0, uint64_t info2 = 0,
                 uint32_t vcpu = 3) {
    data_ = formats_.Build("kvm_exit", 4711,
                           {{"exit_reason", reason},
                            {"guest_rip", 0xffffffff81000000ull},
                            {"isa", isa},
                            {"info1", info1},
                            {"info2", info2},
                            {"intr_info", 0x80000b0e},
                            {"error_code", 0x5},
                            {"vcpu_id", vcpu}});
    tep_record r = RealKvmFormats::Record(data_, 1000);
    KvmTepDecoder dec(formats_.tep());
    KvmRecord out;
    EXPECT_TRUE(dec.Decode(&r, 1, &out));
    return out;
  }

  RealKvmFormats formats_;
  std::vector<uint8_t> data_;
};

TEST_F(KvmDecodeTest, ExitFieldsComeFromTheRealLayout) {
  const KvmRecord r = Exit(48, 1, 0x181, 0xfebf1008, 2);
  EXPECT_EQ(r.type, KvmEventType::kExit);
  EXPECT_EQ(r.tid, 4711);
  EXPECT_EQ(r.cpu, 1u);
  EXPECT_EQ(r.ts, 1000u);
  EXPECT_EQ(r.exit_reason, 48u);
  EXPECT_EQ(r.isa, 1u);
  EXPECT_EQ(r.guest_rip, 0xffffffff81000000ull);
  EXPECT_EQ(r.info1, 0x181u);
  EXPECT_EQ(r.info2, 0xfebf1008u);
  EXPECT_EQ(r.intr_info, 0x80000b0eu);
  EXPECT_EQ(r.error_code, 5u);
  EXPECT_EQ(r.vcpu_id, 2);
}

// Every VMX reason we name is the name the kernel's own print fmt gives (libtraceevent
// renders the record with the format file's __print_symbolic table).
TEST_F(KvmDecodeTest, VmxNamesMatchTheKernelPrintFmt) {
  int checked = 0;
  for (uint32_t code = 0; code < 100; ++code) {
    const KvmRecord r = Exit(code, 1);
    const ExitReason d = DecodeExitReason(r.exit_reason, r.isa, r.info2);
    const std::string printed = formats_.Print(data_);
    if (!d.known) continue;
    ++checked;
    EXPECT_NE(printed.find("reason " + std::string(d.name) + " rip"), std::string::npos)
        << code << ": " << printed;
    EXPECT_FALSE(d.failed_vmentry);
  }
  EXPECT_EQ(checked, 65);  // the 65 names of the 6.18 VMX table
}

TEST_F(KvmDecodeTest, SvmNamesMatchTheKernelPrintFmt) {
  const uint32_t codes[] = {0x000, 0x027, 0x04e, 0x060, 0x072,      0x078,     0x07b,
                            0x07c, 0x081, 0x400, 0x403, 0x80000010, 0x8000fffd};
  for (uint32_t code : codes) {
    const KvmRecord r = Exit(code, 2);
    const ExitReason d = DecodeExitReason(r.exit_reason, r.isa, r.info2);
    ASSERT_TRUE(d.known) << code;
    const std::string printed = formats_.Print(data_);
    EXPECT_NE(printed.find("reason " + std::string(d.name) + " rip"), std::string::npos)
        << code << ": " << printed;
  }
  // SVM_EXIT_ERR is -1 in the table but exit_reason is a u32, so the kernel's own print
  // never matches it (it prints 0xffffffff); we name it.
  EXPECT_EQ(DecodeExitReason(0xffffffff, 2, 0).name, "invalid_guest_state");
  EXPECT_EQ(DecodeExitReason(0x078, 2, 0).name, "hlt");
  EXPECT_EQ(DecodeExitReason(0x400, 2, 0).name, "npf");
  EXPECT_TRUE(DecodeExitReason(0x400, 2, 0).mmio);
  EXPECT_TRUE(DecodeExitReason(0x07c, 2, 0).msr);
}

TEST_F(KvmDecodeTest, VmxFailedVmentryFlag) {
  const KvmRecord r = Exit(0x80000021, 1);  // INVALID_STATE | FAILED_VMENTRY
  const ExitReason d = DecodeExitReason(r.exit_reason, r.isa, r.info2);
  EXPECT_EQ(d.name, "INVALID_STATE");
  EXPECT_TRUE(d.failed_vmentry);
  const std::string printed = formats_.Print(data_);
  EXPECT_NE(printed.find("INVALID_STATE FAILED_VMENTRY"), std::string::npos) << printed;
  EXPECT_EQ(DecodeExitReason(0x80000022, 1, 0).name, "MSR_LOAD_FAIL");
}

TEST_F(KvmDecodeTest, PvmHcReasonsEncoding) {
  const char* expected[] = {
      "HC_IRQ_WIN",    "HC_IRQ_HALT", "HC_LOAD_PGTBL", "HC_TLB_FLUSH", "HC_TLB_FLUSH_CURRENT",
      "HC_TLB_INVLPG", "HC_LOAD_GS",  "HC_RDMSR",      "HC_WRMSR",     "HC_LOAD_TLS"};
  for (uint32_t n = 1; n <= 10; ++n) {
    const KvmRecord r = Exit(0x20000 + n, 3);
    const ExitReason d = DecodeExitReason(r.exit_reason, r.isa, r.info2);
    EXPECT_EQ(d.name, expected[n - 1]) << n;
    EXPECT_TRUE(d.hypercall);
    EXPECT_EQ(d.msr, n == 8 || n == 9);
  }
}

TEST_F(KvmDecodeTest, PvmHypercallNumberInInfo2UsesItsOwnOrder) {
  // PVM_HC_SPECIAL_BASE + n: LOAD_PGTBL 0, IRQ_WIN 1, IRQ_HALT 2, TLB_FLUSH 3,
  // TLB_FLUSH_CURRENT 4, TLB_INVLPG 5, LOAD_GS 6, RDMSR 7, WRMSR 8, LOAD_TLS 9.
  const char* expected[] = {
      "HC_LOAD_PGTBL", "HC_IRQ_WIN", "HC_IRQ_HALT", "HC_TLB_FLUSH", "HC_TLB_FLUSH_CURRENT",
      "HC_TLB_INVLPG", "HC_LOAD_GS", "HC_RDMSR",    "HC_WRMSR",     "HC_LOAD_TLS"};
  for (uint64_t n = 0; n < 10; ++n) {
    const KvmRecord r = Exit(0x20000, 3, 0, 0x17088200 + n);
    const ExitReason d = DecodeExitReason(r.exit_reason, r.isa, r.info2);
    EXPECT_EQ(d.name, expected[n]) << n;
    EXPECT_EQ(d.hypercall_nr, static_cast<int64_t>(0x17088200 + n));
  }
  // Both encodings name the same hypercall the same way.
  EXPECT_EQ(DecodeExitReason(0x20009, 3, 0).name, DecodeExitReason(0x20000, 3, 0x17088208).name);
  EXPECT_EQ(DecodeExitReason(0x20003, 3, 0).name, DecodeExitReason(0x20000, 3, 0x17088200).name);
  // Any other number stays HYPERCALL, with the number kept.
  const ExitReason other = DecodeExitReason(0x20000, 3, 9);
  EXPECT_EQ(other.name, "HYPERCALL");
  EXPECT_EQ(other.hypercall_nr, 9);
}

TEST_F(KvmDecodeTest, PvmTableIsChosenFromIsaNotFromTheHost) {
  // The same numbers decode differently per isa: 14 is PF excp on PVM, INVLPG on VMX.
  EXPECT_EQ(DecodeExitReason(Exit(14, 3).exit_reason, 3, 0).name, "PF excp");
  EXPECT_EQ(DecodeExitReason(Exit(14, 1).exit_reason, 1, 0).name, "INVLPG");
  EXPECT_EQ(DecodeExitReason(0, 3, 0).name, "DE excp");
  EXPECT_EQ(DecodeExitReason(0, 2, 0).name, "read_cr0");
  EXPECT_EQ(DecodeExitReason(20, 3, 0).name, "VE excp");
  EXPECT_FALSE(DecodeExitReason(0x20000, 1, 0).name == "HYPERCALL");
  const ExitReason failed = DecodeExitReason(Exit(1025, 3).exit_reason, 3, 0);
  EXPECT_EQ(failed.name, "FAILED_VMENTRY");
  EXPECT_TRUE(failed.failed_vmentry);
}

TEST_F(KvmDecodeTest, PvmUpstreamAndForkNumbering) {
  EXPECT_EQ(DecodeExitReason(0x10000, 3, 0).name, "SYSCALL");
  EXPECT_EQ(DecodeExitReason(0x30000, 3, 0).name, "ERETU");
  EXPECT_EQ(DecodeExitReason(0x40000, 3, 0, PvmNumbering::kUpstream).name, "ERETS");
  EXPECT_EQ(DecodeExitReason(0x50000, 3, 0, PvmNumbering::kUpstream).name, "INTERRUPT");
  EXPECT_EQ(DecodeExitReason(0x60000, 3, 0, PvmNumbering::kUpstream).name, "INT80");
  EXPECT_EQ(DecodeExitReason(0x40000, 3, 0, PvmNumbering::kFork).name, "INTERRUPT");
  EXPECT_EQ(DecodeExitReason(0x50000, 3, 0, PvmNumbering::kFork).name, "INT80");
  EXPECT_FALSE(DecodeExitReason(0x60000, 3, 0, PvmNumbering::kFork).known);
  EXPECT_EQ(DecodeExitReason(0x20000, 3, 0x17088207, PvmNumbering::kFork).name, "HC_RDMSR");
}

TEST_F(KvmDecodeTest, UnknownReasonIsNotInvented) {
  EXPECT_FALSE(DecodeExitReason(0x70000, 3, 0).known);
  EXPECT_FALSE(DecodeExitReason(99, 1, 0).known);
  EXPECT_FALSE(DecodeExitReason(0x500, 2, 0).known);
  EXPECT_FALSE(DecodeExitReason(12, 7, 0).known);  // isa the kernel does not define
}

TEST_F(KvmDecodeTest, OtherEventsDecode) {
  KvmTepDecoder dec(formats_.tep());
  KvmRecord r;
  auto pio = formats_.Build("kvm_pio", 10,
                            {{"rw", 1}, {"port", 0x3f8}, {"size", 1}, {"count", 1}, {"val", 0x41}});
  tep_record tr = RealKvmFormats::Record(pio, 5);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kPio);
  EXPECT_EQ(r.addr, 0x3f8u);
  EXPECT_EQ(r.write, 1u);
  EXPECT_EQ(r.size, 1u);
  EXPECT_EQ(r.data, 0x41u);

  auto mmio =
      formats_.Build("kvm_mmio", 10, {{"type", 0}, {"len", 4}, {"gpa", 0xfebf0014}, {"val", 0}});
  tr = RealKvmFormats::Record(mmio, 6);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kMmio);
  EXPECT_EQ(r.mmio_type, kKvmMmioUnsatisfiedRead);
  EXPECT_EQ(r.addr, 0xfebf0014u);
  EXPECT_EQ(r.size, 4u);

  auto msr = formats_.Build("kvm_msr", 10,
                            {{"write", 1}, {"ecx", 0x6e0}, {"data", 123456}, {"exception", 0}});
  tr = RealKvmFormats::Record(msr, 7);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kMsr);
  EXPECT_EQ(r.addr, 0x6e0u);
  EXPECT_EQ(r.data, 123456u);
  EXPECT_EQ(MsrName(0x6e0), "IA32_TSC_DEADLINE");

  auto ue = formats_.Build("kvm_userspace_exit", 10, {{"reason", 6}, {"errno", 0}});
  tr = RealKvmFormats::Record(ue, 8);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kUserspaceExit);
  EXPECT_EQ(r.reason, 6u);
  EXPECT_EQ(UserspaceExitName(r.reason), "MMIO");

  auto restart = formats_.Build("kvm_userspace_exit", 10, {{"reason", 0}, {"errno", -4}});
  tr = RealKvmFormats::Record(restart, 8);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.err, -4);

  auto insn = formats_.Build("kvm_emulate_insn", 10,
                             {{"rip", 0x1000}, {"csbase", 0}, {"len", 2}, {"flags", 9}});
  formats_.PutBytes("kvm_emulate_insn", insn, "insn", {0xe6, 0x80});
  tr = RealKvmFormats::Record(insn, 9);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kEmulateInsn);
  EXPECT_EQ(r.guest_rip, 0x1000u);
  ASSERT_EQ(r.insn_len, 2);
  EXPECT_EQ(r.insn[0], 0xe6);
  EXPECT_EQ(r.insn[1], 0x80);

  auto entry = formats_.Build("kvm_entry", 10, {{"vcpu_id", 5}, {"rip", 0x2000}});
  tr = RealKvmFormats::Record(entry, 10);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kEntry);
  EXPECT_EQ(r.vcpu_id, 5);

  auto fpu = formats_.Build("kvm_fpu", 10, {{"load", 1}});
  tr = RealKvmFormats::Record(fpu, 11);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kFpu);
  EXPECT_EQ(r.write, 1u);

  auto hc = formats_.Build("kvm_hypercall", 10, {{"nr", 9}, {"a0", 1}});
  tr = RealKvmFormats::Record(hc, 12);
  ASSERT_TRUE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(r.type, KvmEventType::kHypercall);
  EXPECT_EQ(r.addr, 9u);
}

TEST_F(KvmDecodeTest, ShortRecordIsRejectedAndCounted) {
  auto exit = formats_.Build("kvm_exit", 1, {{"exit_reason", 12}, {"isa", 1}});
  exit.resize(20);  // cut inside the fields
  tep_record tr = RealKvmFormats::Record(exit, 1);
  KvmTepDecoder dec(formats_.tep());
  KvmRecord r;
  EXPECT_FALSE(dec.Decode(&tr, 0, &r));
  EXPECT_EQ(dec.short_records(), 1u);
}

// Pairing of decoded records: a VMX IO exit with its kvm_pio child.
TEST_F(KvmDecodeTest, DecodedVmxRecordsPair) {
  struct Sink : EventSink {
    std::vector<ExitEvent> exits;
    std::vector<std::string> reasons;
    void OnExit(const ExitEvent& e) override {
      exits.push_back(e);
      reasons.emplace_back(e.reason);
    }
  } sink;
  KvmPairer pairer({}, &sink);
  KvmTepDecoder dec(formats_.tep());
  KvmRecord r;
  // VMX IO_INSTRUCTION, qualification: port 0x3f8 (bits 31:16), OUT (bit 3 = 0), size 1.
  auto exit = formats_.Build(
      "kvm_exit", 77, {{"exit_reason", 30}, {"isa", 1}, {"info1", 0x3f80000}, {"vcpu_id", 1}});
  auto pio = formats_.Build("kvm_pio", 77, {{"rw", 1}, {"port", 0x3f8}, {"size", 1}, {"count", 1}});
  auto entry = formats_.Build("kvm_entry", 77, {{"vcpu_id", 1}});
  for (auto [data, ts] : {std::pair{&exit, 100ull}, {&pio, 150ull}, {&entry, 1100ull}}) {
    tep_record tr = RealKvmFormats::Record(*data, ts);
    ASSERT_TRUE(dec.Decode(&tr, 0, &r));
    pairer.Feed(r);
  }
  pairer.Finish();
  ASSERT_EQ(sink.exits.size(), 1u);
  EXPECT_EQ(sink.reasons[0], "IO_INSTRUCTION");
  EXPECT_EQ(sink.exits[0].isa, Isa::kVmx);
  EXPECT_EQ(sink.exits[0].duration_ns, 1000u);
  EXPECT_EQ(sink.exits[0].vcpu, 1u);
  EXPECT_EQ(sink.exits[0].subkey_kind, SubKeyKind::kPort);
  EXPECT_EQ(sink.exits[0].subkey, 0x3f8u);
  EXPECT_EQ(sink.exits[0].dir, AccessDir::kWrite);
  EXPECT_EQ(pairer.stats().kernel_exits, 1u);
}

// The open asks this of every format of a capture (about 2400): only the events the decoder
// reads, by system and name, go to libtraceevent.
TEST(KvmDecoderReadsTest, OnlyTheKvmEventsItDecodesAndSchedSwitch) {
  EXPECT_TRUE(KvmDecoderReads("kvm", "kvm_exit"));
  EXPECT_TRUE(KvmDecoderReads("kvm", "kvm_userspace_exit"));
  EXPECT_TRUE(KvmDecoderReads("sched", "sched_switch"));
  EXPECT_FALSE(KvmDecoderReads("kvmmmu", "kvm_exit"));  // a name of the wrong system
  EXPECT_FALSE(KvmDecoderReads("sched", "kvm_exit"));
  EXPECT_FALSE(KvmDecoderReads("kvm", "sched_switch"));
  EXPECT_FALSE(KvmDecoderReads("kvm", "kvm_set_irq"));  // a kvm event it does not decode
  EXPECT_FALSE(KvmDecoderReads("xfs", "xfs_log_force"));
  EXPECT_FALSE(KvmDecoderReads("", ""));
}

}  // namespace
}  // namespace exitscope::sources
