// Symbolizing this process's addresses with elfutils libdw; demangling with libiberty's
// demangler (C++ and both Rust manglings).
#include "recorder/symbolizer.h"

#include <elfutils/libdwfl.h>
// libiberty.h (included by demangle.h) declares basename() unless told glibc has it.
#define HAVE_DECL_BASENAME 1
#include <libiberty/demangle.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace exitscope {

std::string FormatFrame(const StackFrame& f) {
  char buf[64];
  std::string s;
  if (f.function.empty()) {
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(f.ip));
    s = buf;
  } else {
    std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(f.offset));
    s = f.function + buf;
  }
  if (!f.file.empty()) {
    s += " (" + f.file;
    if (f.line != 0) s += ":" + std::to_string(f.line);
    s += ")";
  }
  if (f.module.starts_with("[")) {
    s += " " + f.module;  // "[kernel]", "[kvm]"
  } else if (!f.module.empty()) {
    const size_t slash = f.module.rfind('/');
    s += " [" + (slash == std::string::npos ? f.module : f.module.substr(slash + 1)) + "]";
  }
  return s;
}

namespace internal {

std::string Demangle(const char* name) {
  if (name == nullptr) return {};
  if (name[0] != '_' || (name[1] != 'Z' && name[1] != 'R')) return name;
  char* d = cplus_demangle(name, DMGL_PARAMS | DMGL_ANSI | DMGL_AUTO);
  if (d == nullptr) return name;
  std::string out(d);
  std::free(d);
  return out;
}

namespace {
char* g_debuginfo_path = nullptr;
const Dwfl_Callbacks kCallbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = nullptr,
    .debuginfo_path = &g_debuginfo_path,
};
}  // namespace

Symbolizer::~Symbolizer() {
  if (dwfl_ != nullptr) dwfl_end(dwfl_);
}

bool Symbolizer::Report() {
  if (dwfl_ == nullptr) dwfl_ = dwfl_begin(&kCallbacks);
  if (dwfl_ == nullptr) return false;
  dwfl_report_begin(dwfl_);
  const int rc = dwfl_linux_proc_report(dwfl_, pid_ != 0 ? pid_ : getpid());
  reported_ = dwfl_report_end(dwfl_, nullptr, nullptr) == 0 && rc == 0;
  return reported_;
}

StackFrame Symbolizer::Lookup(uint64_t ip, bool exact) {
  StackFrame f;
  f.ip = ip;
  const Dwarf_Addr addr = exact || ip == 0 ? ip : ip - 1;
  if (!reported_ && !Report()) return f;
  Dwfl_Module* m = dwfl_addrmodule(dwfl_, addr);
  if (m == nullptr && Report()) m = dwfl_addrmodule(dwfl_, addr);  // loaded since
  if (m == nullptr) return f;
  const char* mod =
      dwfl_module_info(m, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  if (mod != nullptr) f.module = mod;
  GElf_Off off = 0;
  GElf_Sym sym;
  const char* name = dwfl_module_addrinfo(m, addr, &off, &sym, nullptr, nullptr, nullptr);
  if (name != nullptr) {
    // "clock_nanosleep@GLIBC_2.2.5", "__libc_start_main@@GLIBC_2.34": the symbol version is
    // not part of the function's name.
    const char* at = std::strchr(name, '@');
    f.function = Demangle(at == nullptr ? name : std::string(name, at).c_str());
    f.offset = off + (addr == ip ? 0 : 1);
  }
  if (Dwfl_Line* line = dwfl_module_getsrc(m, addr); line != nullptr) {
    int lineno = 0;
    const char* src = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
    if (src != nullptr) f.file = src;
    f.line = lineno > 0 ? static_cast<uint32_t>(lineno) : 0;
  }
  return f;
}

std::vector<StackFrame> Symbolizer::Resolve(std::span<const uint64_t> ips, bool first_exact) {
  std::vector<StackFrame> out;
  out.reserve(ips.size());
  for (size_t i = 0; i < ips.size(); ++i) {
    const bool exact = first_exact && i == 0;
    const uint64_t key = ips[i] * 2 + (exact ? 1 : 0);
    if (auto it = cache_.find(key); it != cache_.end()) {
      out.push_back(it->second);
      continue;
    }
    if (cache_.size() >= kMaxCached) cache_.clear();
    out.push_back(cache_.emplace(key, Lookup(ips[i], exact)).first->second);
  }
  return out;
}

}  // namespace internal
}  // namespace exitscope
