// What Vmm::Create sets up without /dev/kvm: devices on the bus and in the recorder, flag
// validation, fault-injection binding; and Run's answer when KVM is missing.
#include "vmm/vmm.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "guests/abi.h"

namespace exitscope::vmm {
namespace {

VmmConfig Base() {
  VmmConfig c;
  c.guest = "hello";
  c.serial_quiet = true;
  c.write_dump = false;
  c.log = [](std::string_view) {};
  return c;
}

TEST(VmmSetup, RegistersTheDevicesIdenticallyOnTheBusAndInTheRecorder) {
  auto vmm = Vmm::Create(Base());
  ASSERT_TRUE(vmm) << vmm.error().message;
  Vmm& v = **vmm;
  ASSERT_NE(v.recorder(), nullptr);
  const AddressSpace* spaces[] = {&v.bus(), &v.recorder()->address_space()};
  for (const AddressSpace* s : spaces) {
    EXPECT_EQ(s->DeviceName(v.uart_index()), "uart0");
    EXPECT_EQ(s->DeviceName(v.debug_index()), "debug0");
    EXPECT_EQ(s->DeviceName(v.nvme_index()), "nvme0");
    const Resolution thr = s->Lookup(IoSpace::kPio, ES_UART_PORT, 1, AccessDir::kWrite);
    EXPECT_EQ(thr.device, v.uart_index());
    EXPECT_EQ(AddressSpace::RegisterName(thr, 1), "THR");
    const Resolution db = s->Lookup(IoSpace::kMmio, ES_NVME_BASE + 0x1008, 4, AccessDir::kWrite);
    EXPECT_EQ(AddressSpace::RegisterName(db, 4), "SQ1TDBL");
    const Resolution cq = s->Lookup(IoSpace::kMmio, ES_NVME_BASE + 0x1084, 4, AccessDir::kWrite);
    EXPECT_EQ(AddressSpace::RegisterName(cq, 4), "CQ16HDBL");
    const Resolution exit = s->Lookup(IoSpace::kPio, ES_DEBUG_EXIT, 4, AccessDir::kWrite);
    EXPECT_EQ(AddressSpace::RegisterName(exit, 4), "EXIT");
    EXPECT_FALSE(s->Lookup(IoSpace::kMmio, ES_UNASSIGNED_MMIO, 4).assigned());
  }
  // The guest image is in memory at its load address.
  uint8_t first[3];
  ASSERT_TRUE(v.memory().Read(ES_GUEST_LOAD_ADDR, first, 3));
  EXPECT_EQ(first[0], 0x48);
}

TEST(VmmSetup, NoRecordMeansNoRecorder) {
  VmmConfig c = Base();
  c.record = false;
  auto vmm = Vmm::Create(c);
  ASSERT_TRUE(vmm) << vmm.error().message;
  EXPECT_EQ((*vmm)->recorder(), nullptr);
}

TEST(VmmSetup, BadFlagsAreUsageErrors) {
  VmmConfig c = Base();
  c.vcpus = 0;
  EXPECT_EQ(Vmm::Create(c).error().code, ErrorCode::kInvalidArgument);
  c = Base();
  c.vcpus = ES_MAX_VCPUS + 1;
  EXPECT_EQ(Vmm::Create(c).error().code, ErrorCode::kInvalidArgument);
  c = Base();
  c.guest = "nonexistent";
  EXPECT_EQ(Vmm::Create(c).error().code, ErrorCode::kNotFound);
  c = Base();
  c.injects.push_back(*ParseInjectSpec("delay:nvme0.NOPE:5"));
  auto r = Vmm::Create(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("NOPE"), std::string::npos);
  c = Base();
  c.injects.push_back(*ParseInjectSpec("backend-error:uart0:2"));
  EXPECT_FALSE(Vmm::Create(c));
  c = Base();
  c.injects.push_back(*ParseInjectSpec("lock:uart0:300:64"));
  auto no_lock = Vmm::Create(c);
  ASSERT_FALSE(no_lock);
  EXPECT_NE(no_lock.error().message.find("has no lock to contend"), std::string::npos);
  c = Base();
  c.injects.push_back(*ParseInjectSpec("lock:nvme0:300:64"));
  c.injects.push_back(*ParseInjectSpec("backend-delay:nvme0:300:64"));
  auto both = Vmm::Create(c);
  EXPECT_TRUE(both) << both.error().message;
}

TEST(VmmSetup, DiskIsCreatedWithTheRequestedSize) {
  const std::string path = "/tmp/exitscope-setup-disk-" + std::to_string(getpid());
  unlink(path.c_str());
  VmmConfig c = Base();
  c.disk_path = path;
  c.disk_bytes = 3 << 20;
  auto vmm = Vmm::Create(c);
  ASSERT_TRUE(vmm) << vmm.error().message;
  EXPECT_EQ(std::filesystem::file_size(path), 3u << 20);
  EXPECT_EQ((*vmm)->block().namespace_blocks(), (3u << 20) / 512);
  unlink(path.c_str());
}

TEST(VmmSetup, RunWithoutKvmIsUnavailableWithTheReason) {
  VmmConfig c = Base();
  c.kvm_path = "/nonexistent/kvm";
  auto vmm = Vmm::Create(c);
  ASSERT_TRUE(vmm) << vmm.error().message;
  auto r = (*vmm)->Run();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(r.error().message, "/nonexistent/kvm not available (No such file or directory)");
}

}  // namespace
}  // namespace exitscope::vmm
