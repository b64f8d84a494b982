// KVM binary stats parsing: the real stats files of a kvm-pvm 6.18 host (testdata/kvm-host/),
// and files laid out per include/uapi/linux/kvm.h for the values and the error paths.
#include "vmm/kvm_stats.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/kvm.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace exitscope::vmm {
namespace {

constexpr uint32_t kNameSize = 48;
// The fixed part of struct kvm_stats_desc in the ABI: flags, exponent, size, offset,
// bucket_size (16 bytes), then name[name_size]. Not sizeof(kvm_stats_desc): in C++ older uapi
// headers make that 20 (the flexible array member sits behind an empty struct of size 1).
constexpr uint32_t kDescFixed = 16;

struct StatDef {
  const char* name;
  uint32_t flags;
  uint16_t size;
  std::vector<uint64_t> values;
};

// Lays out header, id, descriptors and data exactly as the kernel does (kvm_stats_read()).
std::vector<uint8_t> BuildStatsFile(const std::string& id, const std::vector<StatDef>& defs) {
  const uint32_t desc_stride = kDescFixed + kNameSize;
  kvm_stats_header h{};
  h.name_size = kNameSize;
  h.num_desc = static_cast<uint32_t>(defs.size());
  h.id_offset = sizeof(h);
  h.desc_offset = h.id_offset + kNameSize;
  h.data_offset = h.desc_offset + desc_stride * h.num_desc;
  std::vector<uint8_t> f(h.data_offset);
  std::memcpy(f.data(), &h, sizeof(h));
  std::memcpy(f.data() + h.id_offset, id.c_str(), id.size() + 1);
  uint32_t data_off = 0;
  std::vector<uint64_t> data;
  for (size_t i = 0; i < defs.size(); ++i) {
    uint8_t* d = f.data() + h.desc_offset + i * desc_stride;
    std::memcpy(d + 0, &defs[i].flags, 4);
    std::memcpy(d + 6, &defs[i].size, 2);
    std::memcpy(d + 8, &data_off, 4);
    std::strncpy(reinterpret_cast<char*>(d + kDescFixed), defs[i].name, kNameSize - 1);
    for (uint64_t v : defs[i].values) data.push_back(v);
    data_off += 8 * defs[i].size;
  }
  const size_t at = f.size();
  f.resize(at + data.size() * 8);
  std::memcpy(f.data() + at, data.data(), data.size() * 8);
  return f;
}

int MemFd(const std::vector<uint8_t>& bytes) {
  const int fd = memfd_create("kvm-stats", 0);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  return fd;
}

const std::vector<StatDef> kDefs = {
    {"halt_poll_fail_hist", KVM_STATS_TYPE_LOG_HIST | KVM_STATS_UNIT_SECONDS, 4, {1, 2, 3, 4}},
    {"exits", KVM_STATS_TYPE_CUMULATIVE, 1, {123456}},
    {"halt_exits", KVM_STATS_TYPE_CUMULATIVE, 1, {789}},
    {"guest_mode", KVM_STATS_TYPE_INSTANT | KVM_STATS_UNIT_BOOLEAN, 1, {1}},
};

TEST(KvmStats, ParsesSchemaAndValues) {
  const int fd = MemFd(BuildStatsFile("kvm-42/vcpu-0", kDefs));
  auto schema = ReadKvmStatsSchema(fd, "test");
  ASSERT_TRUE(schema) << schema.error().message;
  EXPECT_EQ(schema->id, "kvm-42/vcpu-0");
  ASSERT_EQ(schema->descs.size(), 4u);
  EXPECT_EQ(schema->descs[0].name, "halt_poll_fail_hist");
  EXPECT_EQ(schema->descs[0].size, 4);
  EXPECT_EQ(schema->descs[1].name, "exits");
  EXPECT_EQ(schema->descs[1].offset, 32u);
  EXPECT_EQ(schema->descs[3].name, "guest_mode");
  auto values = ReadKvmStats(fd, *schema, "test");
  ASSERT_TRUE(values) << values.error().message;
  ASSERT_EQ(values->size(), 3u);  // the histogram is skipped
  EXPECT_EQ((*values)[0].name, "exits");
  EXPECT_EQ((*values)[0].value, 123456u);
  EXPECT_EQ((*values)[1].name, "halt_exits");
  EXPECT_EQ((*values)[1].value, 789u);
  EXPECT_EQ((*values)[2].name, "guest_mode");
  close(fd);
}

TEST(KvmStats, ValuesAreReReadEachSample) {
  std::vector<uint8_t> f = BuildStatsFile("id", {{"exits", 0, 1, {5}}});
  const int fd = MemFd(f);
  auto schema = ReadKvmStatsSchema(fd, "test");
  ASSERT_TRUE(schema);
  EXPECT_EQ((*ReadKvmStats(fd, *schema, "test"))[0].value, 5u);
  const uint64_t six = 6;
  ASSERT_EQ(pwrite(fd, &six, 8, schema->data_offset), 8);
  EXPECT_EQ((*ReadKvmStats(fd, *schema, "test"))[0].value, 6u);
  close(fd);
}

TEST(KvmStats, TruncatedFilesAreCorruptWithTheOffset) {
  const std::vector<uint8_t> full = BuildStatsFile("kvm-1/vcpu-0", kDefs);
  for (size_t cut : {size_t{0}, size_t{10}, sizeof(kvm_stats_header) + 5, full.size() - 8}) {
    const int fd = MemFd(std::vector<uint8_t>(full.begin(), full.begin() + cut));
    auto schema = ReadKvmStatsSchema(fd, "vcpu0-stats");
    Result<std::vector<KvmStatValue>> values = std::vector<KvmStatValue>{};
    if (schema) values = ReadKvmStats(fd, *schema, "vcpu0-stats");
    const Error& e = !schema ? schema.error() : values.error();
    ASSERT_TRUE(!schema || !values) << "cut at " << cut;
    EXPECT_EQ(e.code, ErrorCode::kCorrupt);
    EXPECT_NE(e.message.find("vcpu0-stats: truncated at offset"), std::string::npos) << e.message;
    close(fd);
  }
}

TEST(KvmStats, InconsistentHeadersAreRefused) {
  std::vector<uint8_t> f = BuildStatsFile("id", {{"exits", 0, 1, {5}}});
  kvm_stats_header h;
  std::memcpy(&h, f.data(), sizeof(h));
  h.name_size = 0;
  std::memcpy(f.data(), &h, sizeof(h));
  const int fd = MemFd(f);
  auto schema = ReadKvmStatsSchema(fd, "x");
  ASSERT_FALSE(schema);
  EXPECT_NE(schema.error().message.find("name_size"), std::string::npos);
  close(fd);

  // Descriptors that run into the data block.
  f = BuildStatsFile("id", {{"exits", 0, 1, {5}}});
  std::memcpy(&h, f.data(), sizeof(h));
  h.data_offset -= 8;
  std::memcpy(f.data(), &h, sizeof(h));
  const int fd2 = MemFd(f);
  schema = ReadKvmStatsSchema(fd2, "x");
  ASSERT_FALSE(schema);
  EXPECT_EQ(schema.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(schema.error().message.find("overlap the data block"), std::string::npos)
      << schema.error().message;
  close(fd2);
}

// --- The real stats files of a kvm-pvm 6.18 host (testdata/kvm-host/README.md) ---------------

struct RealDesc {
  const char* name;
  uint32_t flags;
  int16_t exponent;
  uint16_t size;
  uint32_t offset;
};

// Every descriptor of the vCPU files, in file order, as the kernel wrote them (flags
// 0x20 = unit seconds, 0x24 = log histogram of seconds, 0x41 = instant boolean; exponent -9 =
// nanoseconds).
const std::vector<RealDesc> kVcpuDescs = {
    {"halt_successful_poll", 0x0, 0, 1, 0},
    {"halt_attempted_poll", 0x0, 0, 1, 8},
    {"halt_poll_invalid", 0x0, 0, 1, 16},
    {"halt_wakeup", 0x0, 0, 1, 24},
    {"halt_poll_success_ns", 0x20, -9, 1, 32},
    {"halt_poll_fail_ns", 0x20, -9, 1, 40},
    {"halt_wait_ns", 0x20, -9, 1, 48},
    {"halt_poll_success_hist", 0x24, -9, 32, 56},
    {"halt_poll_fail_hist", 0x24, -9, 32, 312},
    {"halt_wait_hist", 0x24, -9, 32, 568},
    {"blocking", 0x41, 0, 1, 824},
    {"pf_taken", 0x0, 0, 1, 832},
    {"pf_fixed", 0x0, 0, 1, 840},
    {"pf_emulate", 0x0, 0, 1, 848},
    {"pf_spurious", 0x0, 0, 1, 856},
    {"pf_fast", 0x0, 0, 1, 864},
    {"pf_mmio_spte_created", 0x0, 0, 1, 872},
    {"pf_guest", 0x0, 0, 1, 880},
    {"tlb_flush", 0x0, 0, 1, 888},
    {"invlpg", 0x0, 0, 1, 896},
    {"exits", 0x0, 0, 1, 904},
    {"io_exits", 0x0, 0, 1, 912},
    {"mmio_exits", 0x0, 0, 1, 920},
    {"signal_exits", 0x0, 0, 1, 928},
    {"irq_window_exits", 0x0, 0, 1, 936},
    {"nmi_window_exits", 0x0, 0, 1, 944},
    {"l1d_flush", 0x0, 0, 1, 952},
    {"halt_exits", 0x0, 0, 1, 960},
    {"request_irq_exits", 0x0, 0, 1, 968},
    {"irq_exits", 0x0, 0, 1, 976},
    {"host_state_reload", 0x0, 0, 1, 984},
    {"fpu_reload", 0x0, 0, 1, 992},
    {"insn_emulation", 0x0, 0, 1, 1000},
    {"insn_emulation_fail", 0x0, 0, 1, 1008},
    {"hypercalls", 0x0, 0, 1, 1016},
    {"irq_injections", 0x0, 0, 1, 1024},
    {"nmi_injections", 0x0, 0, 1, 1032},
    {"req_event", 0x0, 0, 1, 1040},
    {"nested_run", 0x0, 0, 1, 1048},
    {"directed_yield_attempted", 0x0, 0, 1, 1056},
    {"directed_yield_successful", 0x0, 0, 1, 1064},
    {"preemption_reported", 0x0, 0, 1, 1072},
    {"preemption_other", 0x0, 0, 1, 1080},
    {"guest_mode", 0x41, 0, 1, 1088},
    {"notify_window_exits", 0x0, 0, 1, 1096},
    {"pf_parked", 0x0, 0, 1, 1104},
    {"pf_park_timeouts", 0x0, 0, 1, 1112},
};

const std::vector<RealDesc> kVmDescs = {
    {"remote_tlb_flush", 0x0, 0, 1, 0},
    {"remote_tlb_flush_requests", 0x0, 0, 1, 8},
    {"mmu_shadow_zapped", 0x0, 0, 1, 16},
    {"mmu_pte_write", 0x0, 0, 1, 24},
    {"mmu_pde_zapped", 0x0, 0, 1, 32},
    {"mmu_flooded", 0x0, 0, 1, 40},
    {"mmu_recycled", 0x0, 0, 1, 48},
    {"mmu_cache_miss", 0x0, 0, 1, 56},
    {"mmu_unsync", 0x1, 0, 1, 64},
    {"pages_4k", 0x1, 0, 1, 72},
    {"pages_2m", 0x1, 0, 1, 80},
    {"pages_1g", 0x1, 0, 1, 88},
    {"nx_lpage_splits", 0x1, 0, 1, 96},
    {"max_mmu_rmap_size", 0x2, 0, 1, 112},
    {"max_mmu_page_hash_collisions", 0x2, 0, 1, 104},
    {"mmu_kicks_spared", 0x0, 0, 1, 120},
};

std::string RealFile(const std::string& name) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + name;
}

// Opens a committed file; a missing one fails the test (never skips).
int OpenReal(const std::string& name) {
  const int fd = open(RealFile(name).c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << RealFile(name) << ": " << std::strerror(errno);
  return fd;
}

void ExpectDescs(const KvmStatsSchema& s, const std::vector<RealDesc>& want) {
  ASSERT_EQ(s.descs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("descriptor " + std::to_string(i));
    EXPECT_EQ(s.descs[i].name, want[i].name);
    EXPECT_EQ(s.descs[i].flags, want[i].flags);
    EXPECT_EQ(s.descs[i].exponent, want[i].exponent);
    EXPECT_EQ(s.descs[i].size, want[i].size);
    EXPECT_EQ(s.descs[i].offset, want[i].offset);
    EXPECT_EQ(s.descs[i].bucket_size, 0u);
  }
}

TEST(KvmStats, RealVcpuFilesOfAKvmPvmHostParseExactly) {
  for (const char* f : {"kvm-pvm-vcpu0.stats", "kvm-pvm-vcpu1.stats"}) {
    SCOPED_TRACE(f);
    const int fd = OpenReal(f);
    ASSERT_GE(fd, 0);
    auto schema = ReadKvmStatsSchema(fd, f);
    ASSERT_TRUE(schema) << schema.error().message;
    EXPECT_EQ(schema->id,
              std::string(f) == "kvm-pvm-vcpu0.stats" ? "kvm-12719/vcpu-0" : "kvm-12719/vcpu-1");
    // 24-byte header, 48-byte id, 47 descriptors of 16 + 48 bytes, then the data block.
    EXPECT_EQ(schema->data_offset, 24u + 48u + 47u * 64u);
    EXPECT_EQ(schema->data_size, 1120u);  // the file is 4200 bytes: 3080 + 1120
    ExpectDescs(*schema, kVcpuDescs);
    auto values = ReadKvmStats(fd, *schema, f);
    ASSERT_TRUE(values) << values.error().message;
    // The three histograms are skipped; every other stat comes back, in file order, with the
    // value in the file (0: the files were read before the vCPUs ran).
    std::vector<std::string> names;
    for (const RealDesc& d : kVcpuDescs)
      if (d.size == 1) names.push_back(d.name);
    ASSERT_EQ(values->size(), 44u);
    for (size_t i = 0; i < values->size(); ++i) {
      EXPECT_EQ((*values)[i].name, names[i]);
      EXPECT_EQ((*values)[i].value, 0u) << names[i];
    }
    close(fd);
  }
}

TEST(KvmStats, RealVmFileOfAKvmPvmHostParsesExactly) {
  const int fd = OpenReal("kvm-pvm-vm.stats");
  ASSERT_GE(fd, 0);
  auto schema = ReadKvmStatsSchema(fd, "kvm-pvm-vm.stats");
  ASSERT_TRUE(schema) << schema.error().message;
  EXPECT_EQ(schema->id, "kvm-6552");
  EXPECT_EQ(schema->data_offset, 24u + 48u + 16u * 64u);
  EXPECT_EQ(schema->data_size, 128u);  // descriptors need not be in data order
  ExpectDescs(*schema, kVmDescs);
  auto values = ReadKvmStats(fd, *schema, "kvm-pvm-vm.stats");
  ASSERT_TRUE(values) << values.error().message;
  ASSERT_EQ(values->size(), 16u);
  EXPECT_EQ((*values)[13].name, "max_mmu_rmap_size");
  close(fd);
}

// The real layout with values written in: each value comes from its own descriptor's offset.
TEST(KvmStats, RealVcpuLayoutValuesComeFromEachDescriptorsOffset) {
  const int src = OpenReal("kvm-pvm-vcpu1.stats");
  ASSERT_GE(src, 0);
  std::vector<uint8_t> bytes(8192);
  const ssize_t n = pread(src, bytes.data(), bytes.size(), 0);
  close(src);
  ASSERT_EQ(n, 4200);
  bytes.resize(4200);
  // Value of the descriptor at data offset o: 1000 + o / 8, so every slot is distinct.
  for (uint32_t o = 0; o < 1120; o += 8) {
    const uint64_t v = 1000 + o / 8;
    std::memcpy(bytes.data() + 3080 + o, &v, 8);
  }
  const int fd = MemFd(bytes);
  auto schema = ReadKvmStatsSchema(fd, "vcpu1");
  ASSERT_TRUE(schema) << schema.error().message;
  auto values = ReadKvmStats(fd, *schema, "vcpu1");
  ASSERT_TRUE(values) << values.error().message;
  std::map<std::string, uint64_t> got;
  for (const KvmStatValue& v : *values) got[v.name] = v.value;
  EXPECT_EQ(got.at("halt_successful_poll"), 1000u);
  EXPECT_EQ(got.at("blocking"), 1000u + 824 / 8);
  EXPECT_EQ(got.at("pf_taken"), 1000u + 832 / 8);
  EXPECT_EQ(got.at("exits"), 1000u + 904 / 8);
  EXPECT_EQ(got.at("io_exits"), 1000u + 912 / 8);
  EXPECT_EQ(got.at("mmio_exits"), 1000u + 920 / 8);
  EXPECT_EQ(got.at("halt_exits"), 1000u + 960 / 8);
  EXPECT_EQ(got.at("irq_exits"), 1000u + 976 / 8);
  EXPECT_EQ(got.at("insn_emulation"), 1000u + 1000 / 8);
  EXPECT_EQ(got.at("pf_park_timeouts"), 1000u + 1112 / 8);
  close(fd);
}

}  // namespace
}  // namespace exitscope::vmm
