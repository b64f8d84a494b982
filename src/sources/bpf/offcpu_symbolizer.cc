// sources/bpf/offcpu_symbolizer.cc: OffCpuSymbolizer: kernel frames from /proc/kallsyms, user
// frames through recorder/symbolizer.h's libdw symbolizer pointed at the VMM's pid.
#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "recorder/symbolizer.h"
#include "sources/bpf/bpf_offcpu_stacks.h"

namespace exitscope::sources::bpf {
namespace {

// The GNU build-id note of the ELF file `path` in hex; "" when it has none or is no 64-bit
// ELF. Reads only the headers and the PT_NOTE segments.
std::string ReadBuildId(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string id;
  Elf64_Ehdr eh{};
  if (::pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh) &&
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
      eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum < 256) {
    for (unsigned i = 0; i < eh.e_phnum && id.empty(); ++i) {
      Elf64_Phdr ph{};
      if (::pread(fd, &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * sizeof ph)) !=
              static_cast<ssize_t>(sizeof ph) ||
          ph.p_type != PT_NOTE || ph.p_filesz > (1u << 16)) {
        continue;
      }
      std::string notes(ph.p_filesz, '\0');
      if (::pread(fd, notes.data(), notes.size(), static_cast<off_t>(ph.p_offset)) !=
          static_cast<ssize_t>(notes.size())) {
        continue;
      }
      for (size_t at = 0; at + sizeof(Elf64_Nhdr) <= notes.size();) {
        Elf64_Nhdr nh;
        std::memcpy(&nh, notes.data() + at, sizeof nh);
        const size_t name_at = at + sizeof nh;
        const size_t desc_at = name_at + ((nh.n_namesz + 3u) & ~3u);
        const size_t next = desc_at + ((nh.n_descsz + 3u) & ~3u);
        if (next > notes.size() || desc_at + nh.n_descsz > notes.size()) break;
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
            std::memcmp(notes.data() + name_at, "GNU", 4) == 0) {
          for (size_t k = 0; k < nh.n_descsz; ++k)
            id += fmt::format("{:02x}", static_cast<unsigned char>(notes[desc_at + k]));
          break;
        }
        at = next;
      }
    }
  }
  ::close(fd);
  return id;
}

}  // namespace

OffCpuSymbolizer::OffCpuSymbolizer(std::string kallsyms) : kallsyms_path_(std::move(kallsyms)) {}
OffCpuSymbolizer::~OffCpuSymbolizer() = default;

void OffCpuSymbolizer::Note(std::string note) {
  if (noted_.insert(note).second) notes_.push_back(std::move(note));
}

bool OffCpuSymbolizer::LoadKallsyms() {
  if (kallsyms_loaded_) return !ksyms_.empty();
  kallsyms_loaded_ = true;
  std::ifstream in(kallsyms_path_);
  if (!in) {
    Note(fmt::format("kernel frames unresolved: cannot read {}: {}", kallsyms_path_,
                     std::strerror(errno)));
    return false;
  }
  std::string line;
  bool any_address = false;
  while (std::getline(in, line)) {
    // "ffffffff81234560 T anon_pipe_read" or "... t kvm_vcpu_ioctl\t[kvm]"
    std::istringstream ls(line);
    std::string addr, type, name, module;
    if (!(ls >> addr >> type >> name)) continue;
    ls >> module;
    const uint64_t a = std::strtoull(addr.c_str(), nullptr, 16);
    if (a != 0) any_address = true;
    if (type != "T" && type != "t" && type != "W" && type != "w") continue;
    ksyms_.push_back(
        {a, std::move(name), module.empty() ? "[kernel]" : module});  // module: "[kvm]"
  }
  if (!any_address) {
    ksyms_.clear();
    Note(fmt::format(
        "kernel frames unresolved: {} shows no addresses (kptr_restrict; read it as root)",
        kallsyms_path_));
    return false;
  }
  std::sort(ksyms_.begin(), ksyms_.end(),
            [](const KSym& a, const KSym& b) { return a.addr < b.addr; });
  return true;
}

StackFrame OffCpuSymbolizer::Kernel(uint64_t ip) {
  StackFrame f;
  f.ip = ip;
  f.module = "[kernel]";
  if (!LoadKallsyms()) return f;
  auto it = std::upper_bound(ksyms_.begin(), ksyms_.end(), ip,
                             [](uint64_t a, const KSym& s) { return a < s.addr; });
  if (it == ksyms_.begin()) {
    Note(fmt::format("kernel frame 0x{:x} is below every symbol of {}", ip, kallsyms_path_));
    return f;
  }
  --it;
  f.function = it->name;
  f.offset = ip - it->addr;
  f.module = it->module;
  return f;
}

void OffCpuSymbolizer::ReadMaps(uint32_t tgid, Process& p) {
  p.read = true;
  p.maps.clear();
  std::ifstream in(fmt::format("/proc/{}/maps", tgid));
  std::string line;
  while (std::getline(in, line)) {
    // "55d0c8a00000-55d0c8a21000 r-xp 00002000 fd:01 1234567   /usr/bin/qemu-system-x86_64"
    std::istringstream ls(line);
    std::string range, perms, offset, dev, inode, path;
    if (!(ls >> range >> perms >> offset >> dev >> inode)) continue;
    std::getline(ls >> std::ws, path);
    if (path.empty() || path[0] != '/' || inode == "0") continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    Mapping m;
    m.start = std::strtoull(range.c_str(), nullptr, 16);
    m.end = std::strtoull(range.c_str() + dash + 1, nullptr, 16);
    m.offset = std::strtoull(offset.c_str(), nullptr, 16);
    m.path = path;
    // The same file in another process (or after a restart) has the same device and inode;
    // read through /proc/PID/root so a VMM in another mount namespace is read right.
    auto it = build_ids_.find(dev + ":" + inode);
    if (it == build_ids_.end()) {
      it = build_ids_
               .emplace(dev + ":" + inode, ReadBuildId(fmt::format("/proc/{}/root{}", tgid, path)))
               .first;
    }
    m.build_id = &it->second;
    p.maps.push_back(std::move(m));
  }
  std::sort(p.maps.begin(), p.maps.end(),
            [](const Mapping& a, const Mapping& b) { return a.start < b.start; });
}

const OffCpuSymbolizer::Mapping* OffCpuSymbolizer::FindMapping(uint32_t tgid, Process& p,
                                                               uint64_t ip) {
  const auto find = [&]() -> const Mapping* {
    auto it = std::upper_bound(p.maps.begin(), p.maps.end(), ip,
                               [](uint64_t a, const Mapping& m) { return a < m.start; });
    if (it == p.maps.begin()) return nullptr;
    --it;
    return ip < it->end ? &*it : nullptr;
  };
  if (!p.read) ReadMaps(tgid, p);
  if (const Mapping* m = find()) return m;
  ReadMaps(tgid, p);  // mapped since
  return find();
}

std::vector<StackFrame> OffCpuSymbolizer::ResolveUser(uint32_t tgid,
                                                      const std::vector<uint64_t>& ips) {
  Process& p = user_[tgid];
  std::vector<StackFrame> out;
  out.reserve(ips.size());
  for (size_t i = 0; i < ips.size(); ++i) {
    const bool exact = i == 0;  // the others are return addresses (looked up at ip - 1)
    const Mapping* m = FindMapping(tgid, p, ips[i]);
    std::pair<std::string, uint64_t> key;
    if (m != nullptr && m->build_id != nullptr && !m->build_id->empty()) {
      key = {*m->build_id, (ips[i] - m->start + m->offset) * 2 + (exact ? 1 : 0)};
      if (auto it = by_build_id_.find(key); it != by_build_id_.end()) {
        ++stats_.build_id_hits;
        out.push_back(it->second);
        out.back().ip = ips[i];
        out.back().module = m->path;
        continue;
      }
    }
    if (!p.dw) {
      p.dw = std::make_unique<internal::Symbolizer>(static_cast<pid_t>(tgid));
      ++stats_.libdw_sessions;
    }
    const uint64_t ip = ips[i];
    out.push_back(p.dw->Resolve(std::span<const uint64_t>(&ip, 1), exact).front());
    if (key.first.empty()) {
      ++stats_.no_build_id;
    } else {
      ++stats_.build_id_misses;
      if (by_build_id_.size() >= kMaxBuildIdFrames) by_build_id_.clear();
      // Unresolved frames too: the same binary has no symbol there in any process.
      if (!out.back().module.empty()) by_build_id_.emplace(std::move(key), out.back());
    }
  }
  return out;
}

ThreadStack OffCpuSymbolizer::Resolve(uint32_t tgid, uint32_t tid, const OffCpuSite& site) {
  ThreadStack st;
  st.tid = static_cast<int32_t>(tid);
  st.capture = site.switches;
  st.state = site.preempted == site.switches && site.switches != 0 ? 'R' : 0;
  for (uint64_t ip : site.kernel) st.kernel.push_back(Kernel(ip));
  std::vector<std::string> missing;
  if (site.kstack_id < 0) {
    missing.push_back(
        site.kstack_id == -EEXIST
            ? "kernel stack not stored (stack map bucket taken: counted as a drop)"
            : fmt::format("kernel stack not stored ({})", std::strerror(-site.kstack_id)));
  }
  if (site.ustack_id < 0) {
    missing.push_back(
        site.ustack_id == -EEXIST
            ? "user stack not stored (stack map bucket taken: counted as a drop)"
            : fmt::format("user stack not stored ({})", std::strerror(-site.ustack_id)));
  }
  if (!site.user.empty()) {
    st.user = ResolveUser(tgid, site.user);
    std::string exe;
    {
      char buf[4096];
      const ssize_t n = ::readlink(fmt::format("/proc/{}/exe", tgid).c_str(), buf, sizeof buf - 1);
      if (n > 0) exe = std::string(buf, static_cast<size_t>(n));
    }
    const std::string exe_base =
        exe.empty() ? fmt::format("process {}", tgid) : exe.substr(exe.rfind('/') + 1);
    for (const StackFrame& f : st.user) {
      if (!f.function.empty()) continue;
      if (f.module.empty()) {
        Note(
            fmt::format("{}: user frame 0x{:x} is in no mapping read from /proc/{}/maps (the "
                        "process exited, or the mapping is gone)",
                        exe_base, f.ip, tgid));
      } else {
        const std::string mod = f.module.substr(f.module.rfind('/') + 1);
        Note(
            fmt::format("{}: no symbol covers its frames at addresses like 0x{:x} (no symbol "
                        "table, stripped)",
                        mod, f.ip));
      }
    }
    // The kernel unwinds user stacks by frame pointers: a short chain ends where they end.
    if (st.user.size() <= 2 && site.user.size() < OS_STACK_DEPTH) {
      const StackFrame& last = st.user.back();
      Note(fmt::format(
          "{}: user frames stop at {}: the kernel follows frame pointers, and the code above "
          "keeps none",
          exe_base, last.function.empty() ? fmt::format("0x{:x}", last.ip) : last.function));
    }
  }
  for (size_t i = 0; i < missing.size(); ++i) st.note += (i ? "; " : "") + missing[i];
  return st;
}

}  // namespace exitscope::sources::bpf
