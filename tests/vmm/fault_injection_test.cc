// --inject parsing and the exit-delay rules bound to real register maps.
#include "vmm/fault_injection.h"

#include <gtest/gtest.h>

#include "exitscope/register_map.h"
#include "guests/abi.h"

namespace exitscope::vmm {
namespace {

TEST(ParseInjectSpec, AcceptsTheThreeKinds) {
  auto d = ParseInjectSpec("delay:nvme0.SQ1TDBL:300");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->kind, InjectSpec::Kind::kDelay);
  EXPECT_EQ(d->device, "nvme0");
  EXPECT_EQ(d->reg, "SQ1TDBL");
  EXPECT_EQ(d->ms, 300u);
  EXPECT_EQ(d->every, 1u);
  auto d2 = ParseInjectSpec("delay:uart0:5:10");
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->reg, "");
  EXPECT_EQ(d2->every, 10u);
  auto bd = ParseInjectSpec("backend-delay:nvme0:250:8");
  ASSERT_TRUE(bd);
  EXPECT_EQ(bd->kind, InjectSpec::Kind::kBackendDelay);
  EXPECT_EQ(bd->ms, 250u);
  EXPECT_EQ(bd->every, 8u);
  auto be = ParseInjectSpec("backend-error:nvme0:3");
  ASSERT_TRUE(be);
  EXPECT_EQ(be->kind, InjectSpec::Kind::kBackendError);
  EXPECT_EQ(be->every, 3u);
}

TEST(ParseInjectSpec, RejectsMalformedSpecsWithTheSpecInTheMessage) {
  for (const char* bad :
       {"", "delay", "delay:nvme0", "delay::5", "delay:nvme0:abc", "delay:nvme0:0",
        "delay:nvme0:5:0", "delay:nvme0:5:1:2", "delay:.CC:5", "delay:nvme0.:5",
        "backend-delay:nvme0.CC:5", "backend-error:nvme0", "backend-error:nvme0:1:2",
        "explode:nvme0:1", "delay:nvme0:99999999999"}) {
    auto r = ParseInjectSpec(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(std::string("--inject ") + bad), std::string::npos)
        << r.error().message;
  }
}

TEST(ParseInjectSpec, AcceptsALockSpec) {
  auto l = ParseInjectSpec("lock:nvme0:300:64");
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_EQ(l->kind, InjectSpec::Kind::kLock);
  EXPECT_EQ(l->device, "nvme0");
  EXPECT_EQ(l->reg, "");
  EXPECT_EQ(l->ms, 300u);
  EXPECT_EQ(l->every, 64u);
  EXPECT_EQ(l->text, "lock:nvme0:300:64");
  auto edges = ParseInjectSpec("lock:nvme0:3600000:1");
  ASSERT_TRUE(edges) << edges.error().message;
  EXPECT_EQ(edges->ms, 3'600'000u);
  EXPECT_EQ(edges->every, 1u);
}

// Each kind of bad lock spec, with the one line it gets.
TEST(ParseInjectSpec, RejectsBadLockSpecsSayingWhatIsWrong) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {"lock:nvme0", "--inject lock:nvme0: too few fields (expected"},
      {"lock:nvme0:300", "--inject lock:nvme0:300: lock takes exactly DEVICE:MS:EVERY_N"},
      {"lock:nvme0:300:64:2", "--inject lock:nvme0:300:64:2: lock takes exactly DEVICE:MS:EVERY_N"},
      {"lock::300:64", "--inject lock::300:64: empty device name"},
      {"lock:nvme0.CC:300:64",
       "--inject lock:nvme0.CC:300:64: lock takes a device, not a register"},
      {"lock:nvme0:abc:64", "--inject lock:nvme0:abc:64: lock hold in ms 'abc' is not a number"},
      {"lock:nvme0:0:64", "--inject lock:nvme0:0:64: lock hold in ms 0 out of range (1..3600000)"},
      {"lock:nvme0:3600001:64",
       "--inject lock:nvme0:3600001:64: lock hold in ms 3600001 out of range (1..3600000)"},
      {"lock:nvme0:300:0", "--inject lock:nvme0:300:0: EVERY_N 0 out of range (1..3600000)"},
      {"lock:nvme0:300:-1", "--inject lock:nvme0:300:-1: EVERY_N '-1' is not a number"},
  };
  for (const Case& c : cases) {
    auto r = ParseInjectSpec(c.spec);
    ASSERT_FALSE(r) << c.spec;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().message.rfind(c.message, 0), 0u) << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
  }
}

class Bound : public ::testing::Test {
 protected:
  void SetUp() override {
    nvme = *space.AddDevice({.name = "nvme0", .kind = "nvme"});
    uart = *space.AddDevice({.name = "uart0", .kind = "uart16550"});
    auto nmap = RegisterMap::Builtin("nvme");
    ASSERT_TRUE(nmap) << nmap.error().message;
    auto umap = RegisterMap::Builtin("uart16550");
    ASSERT_TRUE(umap) << umap.error().message;
    ASSERT_TRUE(space.AddRange(IoSpace::kMmio, ES_NVME_BASE, ES_NVME_SIZE, nvme, *nmap));
    ASSERT_TRUE(space.AddRange(IoSpace::kPio, ES_UART_PORT, 8, uart, *umap));
  }
  std::unique_ptr<ExitDelayInjector> Bind(std::vector<std::string> texts) {
    std::vector<InjectSpec> specs;
    for (auto& t : texts) specs.push_back(*ParseInjectSpec(t));
    auto r = ExitDelayInjector::Bind(specs, space);
    EXPECT_TRUE(r) << r.error().message;
    return r ? std::move(*r) : nullptr;
  }
  Resolution Mmio(uint64_t off) {
    return space.Lookup(IoSpace::kMmio, ES_NVME_BASE + off, 4, AccessDir::kWrite);
  }
  AddressSpace space;
  uint32_t nvme = 0, uart = 0;
};

TEST_F(Bound, ARegisterRuleMatchesOnlyThatRegisterAndArrayElement) {
  auto inj = Bind({"delay:nvme0.SQ1TDBL:300"});
  ASSERT_TRUE(inj);
  EXPECT_EQ(inj->DelayFor(Mmio(0x1008)), 300u);  // SQ1TDBL
  EXPECT_EQ(inj->DelayFor(Mmio(0x1000)), 0u);    // SQ0TDBL
  EXPECT_EQ(inj->DelayFor(Mmio(0x100c)), 0u);    // CQ1HDBL
  EXPECT_EQ(inj->DelayFor(Mmio(0x14)), 0u);      // CC
  EXPECT_EQ(inj->DelayFor(space.Lookup(IoSpace::kPio, ES_UART_PORT, 1)), 0u);
}

TEST_F(Bound, ADeviceRuleMatchesEveryRegisterEveryNth) {
  auto inj = Bind({"delay:uart0:7:3"});
  ASSERT_TRUE(inj);
  std::vector<uint64_t> got;
  for (int i = 0; i < 6; ++i)
    got.push_back(inj->DelayFor(space.Lookup(IoSpace::kPio, ES_UART_PORT + (i % 8), 1)));
  EXPECT_EQ(got, (std::vector<uint64_t>{0, 0, 7, 0, 0, 7}));
  EXPECT_EQ(inj->DelayFor(Mmio(0x14)), 0u);
}

TEST_F(Bound, ASpinRuleDelaysLikeADelayRuleAndSaysToSpin) {
  auto inj = Bind({"spin:nvme0.SQ1TDBL:250:2", "delay:uart0:7"});
  ASSERT_TRUE(inj);
  bool spin = false;
  EXPECT_EQ(inj->DelayFor(Mmio(0x1008), &spin), 0u);  // the 1st of every 2nd
  EXPECT_FALSE(spin);
  EXPECT_EQ(inj->DelayFor(Mmio(0x1008), &spin), 250u);
  EXPECT_TRUE(spin);
  spin = false;
  EXPECT_EQ(inj->DelayFor(space.Lookup(IoSpace::kPio, ES_UART_PORT, 1), &spin), 7u);
  EXPECT_FALSE(spin);  // a delay: rule sleeps
  auto bad = ParseInjectSpec("spin:nvme0");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("spin:DEVICE[.REGISTER]:MS[:EVERY_N]"), std::string::npos);
  auto spec = ParseInjectSpec("spin:nvme0.SQ1TDBL:250:2");
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->kind, InjectSpec::Kind::kSpin);
  EXPECT_EQ(spec->reg, "SQ1TDBL");
}

TEST_F(Bound, UnknownDevicesAndRegistersAreUsageErrors) {
  auto bad_dev = ExitDelayInjector::Bind({*ParseInjectSpec("delay:nvme9:5")}, space);
  ASSERT_FALSE(bad_dev);
  EXPECT_NE(bad_dev.error().message.find("no device named 'nvme9'"), std::string::npos);
  auto bad_reg = ExitDelayInjector::Bind({*ParseInjectSpec("delay:nvme0.BOGUS:5")}, space);
  ASSERT_FALSE(bad_reg);
  EXPECT_NE(bad_reg.error().message.find("has no register 'BOGUS'"), std::string::npos);
  // Backend specs are not exit-delay rules.
  auto only_backend = ExitDelayInjector::Bind({*ParseInjectSpec("backend-error:nvme0:2")}, space);
  ASSERT_TRUE(only_backend);
  EXPECT_TRUE((*only_backend)->empty());
}

// The specs that act inside a device name a device of the bus that models them (nvme0).
TEST_F(Bound, DeviceFaultsNameADeviceThatHasThem) {
  auto check = [&](const char* text) {
    return CheckDeviceFaults({*ParseInjectSpec(text)}, space, "nvme0");
  };
  EXPECT_TRUE(check("lock:nvme0:300:64"));
  EXPECT_TRUE(check("backend-delay:nvme0:5"));
  EXPECT_TRUE(check("delay:uart0:5"));  // Bind's to check
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {"lock:nvme9:300:64", "--inject lock:nvme9:300:64: no device named 'nvme9'"},
      {"lock:uart0:300:64",
       "--inject lock:uart0:300:64: device 'uart0' has no lock to contend (lock faults apply to "
       "nvme0)"},
      {"backend-delay:nvme9:5", "--inject backend-delay:nvme9:5: no device named 'nvme9'"},
      {"backend-error:uart0:2",
       "--inject backend-error:uart0:2: device 'uart0' has no backend (backend faults apply to "
       "nvme0)"},
  };
  for (const Case& c : cases) {
    Status st = check(c.spec);
    ASSERT_FALSE(st) << c.spec;
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(st.error().message, c.message);
  }
}

}  // namespace
}  // namespace exitscope::vmm
