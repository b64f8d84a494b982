#include "vmm/kvm_stats.h"

#include <linux/kvm.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace exitscope::vmm {

namespace {

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
  kvm_stats_header h;
  if (auto st = PreadAll(fd, &h, sizeof(h), 0, origin, "the header"); !st)
    return std::unexpected(st.error());
  if (h.name_size == 0 || h.name_size > 4096)
    return Fail(ErrorCode::kCorrupt,
                origin + ": header name_size " + std::to_string(h.name_size) + " out of range");
  if (h.num_desc > 65536)
    return Fail(ErrorCode::kCorrupt,
                origin + ": header num_desc " + std::to_string(h.num_desc) + " out of range");
  KvmStatsSchema s;
  s.data_offset = h.data_offset;
  std::string id(h.name_size, '\0');
  if (auto st = PreadAll(fd, id.data(), id.size(), h.id_offset, origin, "the id string"); !st)
    return std::unexpected(st.error());
  s.id = std::string(id.c_str());
  const size_t stride = sizeof(kvm_stats_desc) + h.name_size;
  std::vector<char> buf(stride * h.num_desc);
  if (!buf.empty())
    if (auto st = PreadAll(fd, buf.data(), buf.size(), h.desc_offset, origin, "the descriptors");
        !st)
      return std::unexpected(st.error());
  for (uint32_t i = 0; i < h.num_desc; ++i) {
    const char* p = buf.data() + i * stride;
    kvm_stats_desc d;
    std::memcpy(&d, p, sizeof(d));
    KvmStatDesc out;
    const char* name = p + sizeof(kvm_stats_desc);
    out.name.assign(name, strnlen(name, h.name_size));
    out.flags = d.flags;
    out.exponent = d.exponent;
    out.size = d.size;
    out.offset = d.offset;
    out.bucket_size = d.bucket_size;
    if (out.name.empty())
      return Fail(ErrorCode::kCorrupt,
                  origin + ": descriptor " + std::to_string(i) + " at offset " +
                      std::to_string(h.desc_offset + i * stride) + " has an empty name");
    if (out.size == 0 || out.offset % 8 != 0)
      return Fail(ErrorCode::kCorrupt, origin + ": descriptor '" + out.name + "' has size " +
                                           std::to_string(out.size) + " and offset " +
                                           std::to_string(out.offset));
    s.data_size = std::max<uint64_t>(s.data_size, uint64_t{out.offset} + 8ull * out.size);
    s.descs.push_back(std::move(out));
  }
  return s;
}

Result<std::vector<KvmStatValue>> ReadKvmStats(int fd, const KvmStatsSchema& schema,
                                               const std::string& origin) {
  std::vector<uint64_t> data((schema.data_size + 7) / 8);
  if (!data.empty())
    if (auto st = PreadAll(fd, data.data(), data.size() * 8, schema.data_offset, origin,
                           "the data block");
        !st)
      return std::unexpected(st.error());
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
