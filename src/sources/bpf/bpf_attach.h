// sources/bpf/bpf_attach.h: what the two loaders (bpf_kvm_loader.cc, bpf_offcpu_loader.cc)
// share: libbpf's quiet message callback, the kernel-BTF precondition and attaching a
// skeleton's programs all or none. Only for files built with libbpf.
#pragma once

#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "exitscope/status.h"

namespace exitscope::sources::bpf {

// libbpf's messages: nothing is printed; this thread's last warning is kept for the one-line
// error (LibbpfMessage). libbpf_set_print is process-wide, so both loaders set this one.
inline thread_local std::string g_libbpf_message;
inline int KeepLibbpfMessage(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (level == LIBBPF_DEBUG) return 0;
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, args);
  std::string_view line(buf);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.remove_suffix(1);
  if (!line.empty()) g_libbpf_message = std::string(line);
  return 0;
}
inline void QuietLibbpf() {
  libbpf_set_print(KeepLibbpfMessage);
  g_libbpf_message.clear();
}
// libbpf's last warning on this thread since QuietLibbpf, or strerror(err) when it said none.
inline std::string LibbpfMessage(int err) {
  return g_libbpf_message.empty() ? std::strerror(err) : g_libbpf_message;
}

// The programs read their tracepoints through CO-RE: they need the kernel's BTF,
// /sys/kernel/btf/vmlinux, or the file $EXITSCOPE_KERNEL_BTF names (the tests point it at a
// missing one to take the no-BTF path on a host that has BTF). kUnavailable, "no kernel BTF
// (PATH: why)", when it cannot be read.
inline Status RequireKernelBtf() {
  const char* env_btf = std::getenv("EXITSCOPE_KERNEL_BTF");
  const std::string path =
      env_btf != nullptr && *env_btf != '\0' ? env_btf : "/sys/kernel/btf/vmlinux";
  if (::access(path.c_str(), R_OK) != 0)
    return Fail(ErrorCode::kUnavailable,
                fmt::format("no kernel BTF ({}: {})", path, std::strerror(errno)));
  return {};
}

// Attaches `programs` in order, appending each link to `links`. On the first failure every
// link made so far is destroyed, `links` cleared, and the error names the program ("cannot
// attach to tp_btf kvm:kvm_fpu: Permission denied"; kPermission for EPERM / EACCES).
inline Status AttachPrograms(const std::vector<std::pair<bpf_program*, std::string>>& programs,
                             std::vector<bpf_link*>& links) {
  for (const auto& [prog, what] : programs) {
    bpf_link* link = bpf_program__attach(prog);
    if (link == nullptr) {
      const int err = errno;
      for (bpf_link* l : links) bpf_link__destroy(l);
      links.clear();
      return Fail(err == EPERM || err == EACCES ? ErrorCode::kPermission : ErrorCode::kUnavailable,
                  fmt::format("cannot attach to {}: {}", what, std::strerror(err)));
    }
    links.push_back(link);
  }
  return {};
}

}  // namespace exitscope::sources::bpf
