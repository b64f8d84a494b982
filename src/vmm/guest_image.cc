#include "vmm/guest_image.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include "base/file_read.h"
#include "guests/abi.h"

#ifndef EXITSCOPE_GUEST_BUILD_DIR
#define EXITSCOPE_GUEST_BUILD_DIR ""
#endif

namespace exitscope::vmm {

const std::vector<GuestInfo>& ShippedGuests() {
  static const std::vector<GuestInfo> kGuests = {
      {"hello", "prints through the UART on every vCPU and passes"},
      {"blk", "drives the NVMe-style block device: writes patterns, reads back, verifies"},
      {"mmio-storm", "register reads/writes at a high rate across devices (arg: iterations)"},
      {"idle", "HLT loop with periodic work and markers (arg: rounds)"},
  };
  return kGuests;
}

namespace {
std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  std::string p(buf, static_cast<size_t>(n));
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? std::string() : p.substr(0, slash);
}

bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
}  // namespace

std::vector<std::string> GuestSearchDirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("EXITSCOPE_GUEST_DIR"); env != nullptr && *env)
    dirs.push_back(env);
  const std::string self = SelfDir();
  if (!self.empty()) {
    dirs.push_back(self + "/guests");
    dirs.push_back(self + "/../guests");
    dirs.push_back(self + "/../../guests");
  }
  if (*EXITSCOPE_GUEST_BUILD_DIR) dirs.push_back(EXITSCOPE_GUEST_BUILD_DIR);
  return dirs;
}

Result<std::string> FindGuestImage(const std::string& name) {
  if (name.empty()) return Fail(ErrorCode::kInvalidArgument, "--guest: empty name");
  if (name.find('/') != std::string::npos || name.ends_with(".bin")) {
    // Checked by stat before anything is read: the type (a device such as /dev/zero is named,
    // not "no such file") and the size limit (a 2 GiB file was read whole, then refused).
    struct stat st;
    if (stat(name.c_str(), &st) != 0) {
      const int err = errno;
      return Fail(err == ENOENT || err == ENOTDIR ? ErrorCode::kNotFound : ErrorCode::kIo,
                  "--guest " + name + ": no such image file (" + std::strerror(err) + ")");
    }
    if (!S_ISREG(st.st_mode)) {
      return Fail(ErrorCode::kInvalidArgument, "--guest " + name + ": is " +
                                                   base::FileTypeName(st.st_mode) +
                                                   ", not a guest image file");
    }
    if (static_cast<uint64_t>(st.st_size) > ES_GUEST_MAX_SIZE) {
      return Fail(ErrorCode::kInvalidArgument,
                  "--guest " + name + ": guest image of " + std::to_string(st.st_size) +
                      " bytes exceeds the " + std::to_string(ES_GUEST_MAX_SIZE) + " limit");
    }
    return name;
  }
  std::string searched;
  for (const std::string& d : GuestSearchDirs()) {
    const std::string p = d + "/" + name + ".bin";
    if (IsFile(p)) return p;
    searched += (searched.empty() ? "" : ", ") + d;
  }
  return Fail(ErrorCode::kNotFound, "--guest " + name + ": no image " + name + ".bin in " +
                                        searched + " (see exitscope run --list-guests)");
}

Result<std::vector<uint8_t>> ReadGuestImage(const std::string& path) {
  // The type and size are checked before any read, and nothing past the limit is read.
  auto text =
      base::ReadBoundedFile(path, ES_GUEST_MAX_SIZE, "guest image", ErrorCode::kInvalidArgument);
  if (!text) return Propagate(text);
  if (text->empty()) return Fail(ErrorCode::kInvalidArgument, path + ": empty guest image");
  return std::vector<uint8_t>(text->begin(), text->end());
}

Status LoadGuestImage(GuestMemory& mem, const std::vector<uint8_t>& image) {
  if (image.size() > ES_GUEST_MAX_SIZE ||
      !mem.Write(ES_GUEST_LOAD_ADDR, image.data(), image.size()))
    return Fail(ErrorCode::kInvalidArgument, "guest image does not fit at its load address");
  return {};
}

}  // namespace exitscope::vmm
