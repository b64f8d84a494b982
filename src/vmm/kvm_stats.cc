// vmm/kvm_stats.cc: see kvm_stats.h.
#include "vmm/kvm_stats.h"

#include <linux/kvm.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace exitscope::vmm {

namespace {

// The ABI's layout, spelled out rather than taken from sizeof(struct kvm_stats_desc): that
// struct ends in a flexible array member, and in C++ older uapi headers declare it behind an
// empty struct of size 1, which makes sizeof 20 and offsetof(name) 17 instead of 16. A
// stride of 20 + name_size reads every descriptor after the first 4 bytes further off
// ("empted_poll" for "halt_attempted_poll").
constexpr size_t kStatsHeaderSize = 24;     // flags, name_size, num_desc, id/desc/data offset
constexpr size_t kStatsDescFixedSize = 16;  // flags, exponent, size, offset, bucket_size
static_assert(offsetof(kvm_stats_header, data_offset) + 4 == kStatsHeaderSize);
static_assert(offsetof(kvm_stats_desc, bucket_size) + 4 == kStatsDescFixedSize);

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // the kernel writes the file in host byte order
}

Status PreadAll(int fd, void* buf, size_t len, uint64_t off, const std::string& origin,
                const char* what) {
  size_t done = 0;
  while (done < len) {
    const ssize_t r = pread(fd, static_cast<char*>(buf) + done, len - done, off + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return Fail(ErrorCode::kIo, origin + ": reading " + what + " at offset " +
                                      std::to_string(off + done) + ": " + std::strerror(errno));
    if (r == 0)
      return Fail(ErrorCode::kCorrupt, origin + ": truncated at offset " +
                                           std::to_string(off + done) + " reading " + what + " (" +
                                           std::to_string(len) + " bytes needed)");
    done += static_cast<size_t>(r);
  }
  return {};
}

}  // namespace

Result<KvmStatsSchema> ReadKvmStatsSchema(int fd, const std::string& origin) {
  uint8_t hb[kStatsHeaderSize];
  EXITSCOPE_RETURN_IF_ERROR(PreadAll(fd, hb, sizeof(hb), 0, origin, "the header"));
  const uint32_t name_size = Load32(hb + 4), num_desc = Load32(hb + 8), id_offset = Load32(hb + 12),
                 desc_offset = Load32(hb + 16), data_offset = Load32(hb + 20);
  if (name_size == 0 || name_size > 4096)
    return Fail(ErrorCode::kCorrupt,
                origin + ": header name_size " + std::to_string(name_size) + " out of range");
  if (num_desc > 65536)
    return Fail(ErrorCode::kCorrupt,
                origin + ": header num_desc " + std::to_string(num_desc) + " out of range");
  const uint64_t stride = kStatsDescFixedSize + uint64_t{name_size};
  const uint64_t desc_end = uint64_t{desc_offset} + stride * num_desc;
  if (desc_end > data_offset)
    return Fail(ErrorCode::kCorrupt,
                origin + ": " + std::to_string(num_desc) + " descriptors of " +
                    std::to_string(stride) + " bytes from offset " + std::to_string(desc_offset) +
                    " overlap the data block at offset " + std::to_string(data_offset));
  // Bounds before anything is allocated: a real kernel's descriptors take a few KiB and its
  // data block under 1 KiB (47 vCPU stats on 6.18). Corrupt sizes must not allocate gigabytes.
  constexpr uint64_t kMaxDescBytes = 16u << 20, kMaxDataBytes = 1u << 20;
  if (stride * num_desc > kMaxDescBytes)
    return Fail(ErrorCode::kCorrupt, origin + ": " + std::to_string(num_desc) + " descriptors of " +
                                         std::to_string(stride) + " bytes: more than " +
                                         std::to_string(kMaxDescBytes) + " bytes of descriptors");
  KvmStatsSchema s;
  s.data_offset = data_offset;
  std::string id(name_size, '\0');
  EXITSCOPE_RETURN_IF_ERROR(PreadAll(fd, id.data(), id.size(), id_offset, origin, "the id string"));
  s.id = std::string(id.c_str());
  std::vector<uint8_t> buf(stride * num_desc);
  if (!buf.empty())
    EXITSCOPE_RETURN_IF_ERROR(
        PreadAll(fd, buf.data(), buf.size(), desc_offset, origin, "the descriptors"));
  s.descs.reserve(num_desc);
  for (uint32_t i = 0; i < num_desc; ++i) {
    const uint8_t* p = buf.data() + i * stride;
    const uint64_t at = desc_offset + i * stride;
    KvmStatDesc out;
    const char* name = reinterpret_cast<const char*>(p + kStatsDescFixedSize);
    out.name.assign(name, strnlen(name, name_size));
    out.flags = Load32(p + 0);
    std::memcpy(&out.exponent, p + 4, 2);
    std::memcpy(&out.size, p + 6, 2);
    out.offset = Load32(p + 8);
    out.bucket_size = Load32(p + 12);
    if (out.name.empty())
      return Fail(ErrorCode::kCorrupt, origin + ": descriptor " + std::to_string(i) +
                                           " at offset " + std::to_string(at) +
                                           " has an empty name");
    if (out.size == 0 || out.offset % 8 != 0)
      return Fail(ErrorCode::kCorrupt, origin + ": descriptor " + std::to_string(i) + " '" +
                                           out.name + "' at offset " + std::to_string(at) +
                                           " has size " + std::to_string(out.size) +
                                           " and data offset " + std::to_string(out.offset));
    if (uint64_t{out.offset} + 8ull * out.size > kMaxDataBytes)
      return Fail(ErrorCode::kCorrupt, origin + ": descriptor " + std::to_string(i) + " '" +
                                           out.name + "' at offset " + std::to_string(at) +
                                           " has data at offset " + std::to_string(out.offset) +
                                           ": beyond the " + std::to_string(kMaxDataBytes) +
                                           "-byte bound of a stats data block");
    s.data_size = std::max<uint64_t>(s.data_size, uint64_t{out.offset} + 8ull * out.size);
    s.descs.push_back(std::move(out));
  }
  return s;
}

Result<std::vector<KvmStatValue>> ReadKvmStats(int fd, const KvmStatsSchema& schema,
                                               const std::string& origin) {
  std::vector<uint64_t> data((schema.data_size + 7) / 8);
  if (!data.empty())
    EXITSCOPE_RETURN_IF_ERROR(
        PreadAll(fd, data.data(), data.size() * 8, schema.data_offset, origin, "the data block"));
  std::vector<KvmStatValue> out;
  out.reserve(schema.descs.size());
  for (const KvmStatDesc& d : schema.descs) {
    const uint32_t type = d.flags & KVM_STATS_TYPE_MASK;
    if (type == KVM_STATS_TYPE_LINEAR_HIST || type == KVM_STATS_TYPE_LOG_HIST || d.size != 1)
      continue;
    out.push_back({d.name, data[d.offset / 8]});
  }
  return out;
}

}  // namespace exitscope::vmm
