#include "vmm/guest_image.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

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
    if (!IsFile(name))
      return Fail(ErrorCode::kNotFound, "--guest " + name + ": no such image file");
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
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(ErrorCode::kIo, path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (bytes.empty()) return Fail(ErrorCode::kInvalidArgument, path + ": empty guest image");
  if (bytes.size() > ES_GUEST_MAX_SIZE)
    return Fail(ErrorCode::kInvalidArgument,
                path + ": guest image of " + std::to_string(bytes.size()) + " bytes exceeds the " +
                    std::to_string(ES_GUEST_MAX_SIZE) + " limit");
  return bytes;
}

Status LoadGuestImage(GuestMemory& mem, const std::vector<uint8_t>& image) {
  if (image.size() > ES_GUEST_MAX_SIZE ||
      !mem.Write(ES_GUEST_LOAD_ADDR, image.data(), image.size()))
    return Fail(ErrorCode::kInvalidArgument, "guest image does not fit at its load address");
  return {};
}

}  // namespace exitscope::vmm
