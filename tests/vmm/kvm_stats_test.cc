// KVM binary stats parsing against files laid out per include/uapi/linux/kvm.h.
#include "vmm/kvm_stats.h"

#include <gtest/gtest.h>
#include <linux/kvm.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace exitscope::vmm {
namespace {

constexpr uint32_t kNameSize = 48;

struct StatDef {
  const char* name;
  uint32_t flags;
  uint16_t size;
  std::vector<uint64_t> values;
};

// Lays out header, id, descriptors and data exactly as the kernel does (kvm_stats_read()).
std::vector<uint8_t> BuildStatsFile(const std::string& id, const std::vector<StatDef>& defs) {
  const uint32_t desc_stride = sizeof(kvm_stats_desc) + kNameSize;
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
    kvm_stats_desc d{};
    d.flags = defs[i].flags;
    d.size = defs[i].size;
    d.offset = data_off;
    std::memcpy(f.data() + h.desc_offset + i * desc_stride, &d, sizeof(d));
    std::strncpy(reinterpret_cast<char*>(f.data() + h.desc_offset + i * desc_stride + sizeof(d)),
                 defs[i].name, kNameSize - 1);
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
  EXPECT_EQ(schema->descs[1].offset, 32u);
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
}

}  // namespace
}  // namespace exitscope::vmm
