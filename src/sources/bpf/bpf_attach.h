// sources/bpf/bpf_attach.h: attaching a skeleton's programs all or none, shared by the two
// loaders (bpf_kvm_loader.cc, bpf_offcpu_loader.cc). Only for files built with libbpf.
#pragma once

#include <bpf/libbpf.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "exitscope/status.h"

namespace exitscope::sources::bpf {

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
