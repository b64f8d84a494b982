#include "sources/trace_text.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "sources/kvm_decode.h"

namespace exitscope::sources {
namespace {

using SV = std::string_view;

bool IsDigit(char c) noexcept {
  return c >= '0' && c <= '9';
}

SV TrimLeft(SV s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}
SV TrimRight(SV s) noexcept {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// Parses an unsigned number at the start of `s` ("0x1f", "1f" with base 16, "42"), advancing
// `s` past it. Returns false when there is no number.
bool TakeNum(SV& s, uint64_t* v, int base = 10) noexcept {
  s = TrimLeft(s);
  if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
  if (ec != std::errc() || p == s.data()) return false;
  s.remove_prefix(static_cast<size_t>(p - s.data()));
  return true;
}
bool TakeInt(SV& s, int64_t* v) noexcept {
  s = TrimLeft(s);
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 10);
  if (ec != std::errc() || p == s.data()) return false;
  s.remove_prefix(static_cast<size_t>(p - s.data()));
  return true;
}

// Finds `key` in `s` and parses the number after it.
bool NumAfter(SV s, SV key, uint64_t* v, int base = 10) noexcept {
  const size_t at = s.find(key);
  if (at == SV::npos) return false;
  s.remove_prefix(at + key.size());
  return TakeNum(s, v, base);
}

SV TakeWord(SV& s) noexcept {
  s = TrimLeft(s);
  size_t n = 0;
  while (n < s.size() && s[n] != ' ' && s[n] != '\t') ++n;
  SV w = s.substr(0, n);
  s.remove_prefix(n);
  return w;
}

bool AllDigits(SV s) noexcept {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsDigit(c)) return false;
  }
  return true;
}

int HexVal(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A timestamp: "sec.frac" (at most 9 fraction digits) in nanoseconds, or an integer counter.
bool ParseStamp(SV ts, uint64_t* stamp) noexcept {
  if (ts.empty() || !IsDigit(ts.front())) return false;
  const size_t dot = ts.find('.');
  if (dot == SV::npos) {
    if (!AllDigits(ts)) return false;
    std::from_chars(ts.data(), ts.data() + ts.size(), *stamp);
    return true;
  }
  uint64_t sec = 0, frac = 0;
  SV fs = ts.substr(dot + 1);
  if (!AllDigits(ts.substr(0, dot)) || !AllDigits(fs) || fs.size() > 9) return false;
  std::from_chars(ts.data(), ts.data() + dot, sec);
  std::from_chars(fs.data(), fs.data() + fs.size(), frac);
  for (size_t i = fs.size(); i < 9; ++i) frac *= 10;
  *stamp = sec * 1'000'000'000ull + frac;
  return true;
}

// A line trimmed to its timestamp, as traces are quoted in mails: "220.696239: kvm_exit: ..."
// (digits, an optional ".digits", ':' and a blank). Sets *colon to the ':'.
bool TimestampFirst(SV t, size_t* colon) noexcept {
  size_t k = 0;
  while (k < t.size() && IsDigit(t[k])) ++k;
  if (k == 0) return false;
  if (k < t.size() && t[k] == '.') {
    const size_t frac = ++k;
    while (k < t.size() && IsDigit(t[k])) ++k;
    if (k == frac) return false;
  }
  if (k + 1 >= t.size() || t[k] != ':' || (t[k + 1] != ' ' && t[k + 1] != '\t')) return false;
  *colon = k;
  return true;
}

// kvm_exit: "vcpu 0 reason EPT_VIOLATION rip 0x... info1 0x... info2 0x... intr_info ..."
bool ParseExit(SV p, const TextOptions& o, KvmRecord* r) noexcept {
  uint64_t v = 0;
  r->reason_name = {};
  r->vcpu_id = NumAfter(p, "vcpu ", &v) ? static_cast<int64_t>(v) : -1;
  const size_t at = p.find("reason ");
  if (at == SV::npos) return false;
  SV rest = p.substr(at + 7);
  const size_t rip = rest.find(" rip ");
  if (rip == SV::npos) return false;
  SV name = TrimRight(rest.substr(0, rip));
  bool failed = false;
  if (name.ends_with("FAILED_VMENTRY")) {
    failed = true;
    name = TrimRight(name.substr(0, name.size() - 14));
  }
  rest.remove_prefix(rip + 5);
  if (!TakeNum(rest, &r->guest_rip, 16)) return false;
  r->info1 = r->info2 = 0;
  r->intr_info = r->error_code = 0;
  NumAfter(rest, "info1 ", &r->info1, 16);
  NumAfter(rest, "info2 ", &r->info2, 16);
  if (NumAfter(rest, "intr_info ", &v, 16)) r->intr_info = static_cast<uint32_t>(v);
  if (NumAfter(rest, "error_code ", &v, 16)) r->error_code = static_cast<uint32_t>(v);

  uint32_t code = 0;
  Isa isa = Isa::kUnknown;
  SV num = name;
  uint64_t n = 0;
  const bool numeric = TakeNum(num, &n) && num.empty();
  if (numeric) {
    code = static_cast<uint32_t>(n);
    r->reason_name = name;  // used only when no table knows the number
    isa = o.isa;
    if (isa == Isa::kUnknown) {
      // A bare number is what the kernel prints for a reason its table lacks: PVM reasons
      // on a PVM host (printed through the SVM table).
      isa = !PvmReasonName(code, PvmNumbering::kUpstream).empty() ? Isa::kPvm : Isa::kUnknown;
    }
  } else {
    if (!LookupExitReasonName(name, &code, &isa)) {
      isa = Isa::kUnknown;
      code = 0;
      r->reason_name = name;  // no table knows it: it stays as the trace printed it
    }
    if (o.isa == Isa::kPvm && isa == Isa::kSvm) isa = Isa::kPvm;  // same number, PVM table
  }
  if (failed) code |= kVmxFailedVmentry;
  r->exit_reason = code;
  r->isa = static_cast<uint32_t>(isa);
  return true;
}

// kvm_emulate_insn: "0:1000: ee" (trace-cmd) or "0:1000:ee (prot64)" (print fmt) [" failed"]
bool ParseEmulate(SV p, KvmRecord* r) noexcept {
  uint64_t cs = 0, rip = 0;
  if (!TakeNum(p, &cs, 16) || p.empty() || p.front() != ':') return false;
  p.remove_prefix(1);
  if (!TakeNum(p, &rip, 16) || p.empty() || p.front() != ':') return false;
  p.remove_prefix(1);
  r->addr = cs;
  r->guest_rip = rip;
  r->insn_len = 0;
  r->failed = p.ends_with(" failed") ? 1 : 0;
  p = TrimLeft(p);
  while (!p.empty() && r->insn_len < r->insn.size()) {
    if (p.front() == ' ') {
      p.remove_prefix(1);
      continue;
    }
    if (p.size() < 2) break;
    const int hi = HexVal(p[0]), lo = HexVal(p[1]);
    if (hi < 0 || lo < 0) break;
    r->insn[r->insn_len++] = static_cast<uint8_t>(hi * 16 + lo);
    p.remove_prefix(2);
  }
  return true;
}

bool ParsePayload(KvmEventType t, SV p, const TextOptions& o, KvmRecord* r) noexcept {
  uint64_t v = 0;
  switch (t) {
    case KvmEventType::kExit:
      return ParseExit(p, o, r);
    case KvmEventType::kEntry:
      r->vcpu_id = NumAfter(p, "vcpu ", &v) ? static_cast<int64_t>(v) : -1;
      r->guest_rip = 0;
      NumAfter(p, "rip ", &r->guest_rip, 16);
      return r->vcpu_id >= 0;
    case KvmEventType::kUserspaceExit: {
      const size_t at = p.find("reason ");
      const size_t open = p.rfind('(');
      if (at == SV::npos || open == SV::npos) return false;
      SV num = p.substr(open + 1);
      int64_t n = 0;
      if (!TakeInt(num, &n)) return false;
      SV name = TrimRight(p.substr(at + 7, open - (at + 7)));
      if (name == "restart") {
        r->err = -static_cast<int32_t>(n);
        r->reason = 0;
      } else if (name == "error") {
        r->err = -static_cast<int32_t>(n);
        r->reason = 0;
      } else {
        r->err = 0;
        r->reason = static_cast<uint32_t>(n);
      }
      return true;
    }
    case KvmEventType::kFpu:
      p = TrimRight(TrimLeft(p));
      if (p == "load")
        r->write = 1;
      else if (p == "unload")
        r->write = 0;
      else
        return false;
      return true;
    case KvmEventType::kPio: {
      p = TrimLeft(p);
      if (p.starts_with("pio_write"))
        r->write = 1;
      else if (p.starts_with("pio_read"))
        r->write = 0;
      else
        return false;
      if (!NumAfter(p, " at ", &r->addr, 16)) return false;
      r->size = NumAfter(p, " size ", &v) ? static_cast<uint32_t>(v) : 0;
      r->count = NumAfter(p, " count ", &v) ? static_cast<uint32_t>(v) : 1;
      r->data = 0;
      NumAfter(p, " val ", &r->data, 16);
      return true;
    }
    case KvmEventType::kMmio: {
      p = TrimLeft(p);
      if (!p.starts_with("mmio ")) return false;
      p.remove_prefix(5);
      SV kind = TakeWord(p);
      if (kind == "write")
        r->mmio_type = kKvmMmioWrite;
      else if (kind == "read")
        r->mmio_type = kKvmMmioRead;
      else if (kind == "unsatisfied-read")
        r->mmio_type = kKvmMmioUnsatisfiedRead;
      else
        return false;
      r->write = r->mmio_type == kKvmMmioWrite ? 1 : 0;
      r->size = NumAfter(p, "len ", &v) ? static_cast<uint32_t>(v) : 0;
      if (!NumAfter(p, "gpa ", &r->addr, 16)) return false;
      r->data = 0;
      NumAfter(p, "val ", &r->data, 16);
      return true;
    }
    case KvmEventType::kMsr: {
      p = TrimLeft(p);
      if (p.starts_with("msr_write"))
        r->write = 1;
      else if (p.starts_with("msr_read"))
        r->write = 0;
      else
        return false;
      SV rest = p.substr(p.find(' ') == SV::npos ? p.size() : p.find(' '));
      if (!TakeNum(rest, &r->addr, 16)) return false;
      r->data = 0;
      NumAfter(rest, "= ", &r->data, 16);
      r->exception = rest.find("(#GP)") != SV::npos ? 1 : 0;
      return true;
    }
    case KvmEventType::kHypercall:
      if (!NumAfter(p, "nr ", &r->addr, 16)) return false;
      r->data = 0;
      NumAfter(p, "a0 ", &r->data, 16);
      return true;
    case KvmEventType::kEmulateInsn:
      return ParseEmulate(TrimLeft(p), r);
    case KvmEventType::kVcpuMatchMmio:
      r->data = 0;
      NumAfter(p, "gva ", &r->data, 16);
      if (!NumAfter(p, "gpa ", &r->addr, 16)) return false;
      r->write = p.find(" Write") != SV::npos ? 1 : 0;
      return true;
    case KvmEventType::kPageFault:
      r->vcpu_id = NumAfter(p, "vcpu ", &v) ? static_cast<int64_t>(v) : -1;
      r->guest_rip = 0;
      NumAfter(p, "rip ", &r->guest_rip, 16);
      if (!NumAfter(p, "address ", &r->addr, 16)) return false;
      if (NumAfter(p, "error_code ", &v, 16)) r->error_code = static_cast<uint32_t>(v);
      return true;
    case KvmEventType::kInjException:
      if (NumAfter(p, "exception=", &v)) {  // libtraceevent's "[FAILED TO PARSE]" dump
        r->exception = static_cast<uint8_t>(v);
        r->has_error = NumAfter(p, "has_error=", &v) && v ? 1 : 0;
        r->error_code = NumAfter(p, "error_code=", &v) ? static_cast<uint32_t>(v) : 0;
        return true;
      } else {
        p = TrimLeft(p);
        if (!p.starts_with("#")) return false;
        const SV mnemonic = TakeWord(p);
        for (uint32_t vec = 0; vec < 32; ++vec) {
          if (ExceptionName(vec) == mnemonic) {
            r->exception = static_cast<uint8_t>(vec);
            r->has_error = p.find('(') != SV::npos ? 1 : 0;
            if (r->has_error && NumAfter(p, "(", &v, 16)) r->error_code = static_cast<uint32_t>(v);
            return true;
          }
        }
        return false;
      }
    case KvmEventType::kCpuid:
      return NumAfter(p, "func ", &r->addr, 16);
    case KvmEventType::kSchedSwitch: {
      // ftrace / perf script: "prev_comm=a prev_pid=12 prev_prio=120 prev_state=S ==>
      // next_comm=b next_pid=0 next_prio=120" (comm may hold spaces: fields found by name).
      // trace-cmd report's plugin: "a:12 [120] S ==> b:0 [120]".
      const size_t arrow = p.find("==>");
      if (arrow == SV::npos) return false;
      if (p.find("prev_pid=") != SV::npos) {
        if (!NumAfter(p, "prev_pid=", &v)) return false;
        r->prev_tid = static_cast<int32_t>(v);
        if (!NumAfter(p, "next_pid=", &v)) return false;
        r->next_tid = static_cast<int32_t>(v);
        const size_t st = p.find("prev_state=");
        // R / R+ is runnable (preempted); anything else (S, D, ...) is not.
        r->prev_state = st != SV::npos && st + 11 < p.size() && p[st + 11] == 'R' ? 0 : 1;
        return true;
      }
      // "comm:pid [prio]": the pid ends at the last ':' before the " [".
      const auto pid_of = [](SV side, uint64_t* out) {
        const size_t br = side.rfind(" [");
        if (br == SV::npos) return false;
        const size_t colon = side.rfind(':', br);
        if (colon == SV::npos) return false;
        SV num = side.substr(colon + 1, br - colon - 1);
        return TakeNum(num, out, 10);
      };
      SV left = p.substr(0, arrow), right = p.substr(arrow + 3);
      if (!pid_of(left, &v)) return false;
      r->prev_tid = static_cast<int32_t>(v);
      if (!pid_of(TrimRight(right), &v)) return false;
      r->next_tid = static_cast<int32_t>(v);
      const size_t close = left.rfind(']');
      SV state = close == SV::npos ? SV{} : TrimLeft(left.substr(close + 1));
      r->prev_state = !state.empty() && state[0] == 'R' ? 0 : 1;
      return true;
    }
    default:
      return true;
  }
}

}  // namespace

std::string_view ToString(TextFlavor f) noexcept {
  switch (f) {
    case TextFlavor::kTraceCmdReport:
      return "trace-cmd report";
    case TextFlavor::kFtrace:
      return "ftrace";
    case TextFlavor::kPerfScript:
      return "perf script";
    case TextFlavor::kTimestampOnly:
      return "timestamp-only lines: threads known only by their vcpu field";
    case TextFlavor::kAuto:
      break;
  }
  return "auto";
}

TextLineKind ParseTraceLine(std::string_view line, const TextOptions& options, KvmRecord* out,
                            int64_t* lost, TextFlavor* flavor) noexcept {
  SV s = TrimRight(line);
  SV t = TrimLeft(s);
  if (t.empty() || t.front() == '#' || t.starts_with("cpus=") || t.starts_with("version =")) {
    return TextLineKind::kSkip;
  }
  if (t.starts_with("CPU:")) {  // "CPU:0 [LOST 123 EVENTS]" / "CPU:0 [LOST EVENTS]"
    SV r = t.substr(4);
    uint64_t cpu = 0;
    if (!TakeNum(r, &cpu)) return TextLineKind::kBad;
    r = TrimLeft(r);
    if (!r.starts_with("[LOST")) return TextLineKind::kBad;
    r.remove_prefix(5);
    uint64_t n = 0;
    *lost = TakeNum(r, &n) ? static_cast<int64_t>(n) : -1;
    out->cpu = static_cast<uint32_t>(cpu);
    return TextLineKind::kLost;
  }
  if (t.starts_with("CPU ") && t.ends_with(" is empty")) return TextLineKind::kSkip;

  uint64_t stamp = 0;
  uint64_t cpu = 0;
  int64_t tid = 0;
  int32_t tgid = -1;
  TextFlavor fl = TextFlavor::kTraceCmdReport;
  SV rest;
  size_t colon = 0;
  const bool trimmed = TimestampFirst(t, &colon);
  if (trimmed) {
    // No task and no CPU: the thread is the vCPU the payload names (set below; -1 when it
    // names none: TraceText::ReadAll gives the record to the last vCPU named), in VM 0.
    if (!ParseStamp(t.substr(0, colon), &stamp)) return TextLineKind::kBad;
    tid = -1;
    tgid = 0;
    fl = TextFlavor::kTimestampOnly;
    rest = t.substr(colon + 1);
  } else {
    // The CPU bracket: the first "[digits]".
    size_t lb = 0;
    for (;;) {
      lb = s.find('[', lb);
      if (lb == SV::npos) return TextLineKind::kBad;
      size_t k = lb + 1;
      while (k < s.size() && IsDigit(s[k])) ++k;
      if (k > lb + 1 && k < s.size() && s[k] == ']') break;
      ++lb;
    }
    const size_t rb = s.find(']', lb);
    std::from_chars(s.data() + lb + 1, s.data() + rb, cpu);

    // Task: "comm-tid", "comm tid", "comm pid/tid", optionally followed by "(tgid)".
    SV task = TrimRight(s.substr(0, lb));
    if (!task.empty() && task.back() == ')') {
      const size_t open = task.rfind('(');
      if (open == SV::npos) return TextLineKind::kBad;
      SV g = task.substr(open + 1, task.size() - open - 2);
      int64_t gv = 0;
      if (TakeInt(g, &gv)) tgid = static_cast<int32_t>(gv);
      task = TrimRight(task.substr(0, open));
      fl = TextFlavor::kFtrace;
    }
    const size_t sp = task.find_last_of(" \t");
    SV last = sp == SV::npos ? task : task.substr(sp + 1);
    if (sp != SV::npos && AllDigits(last)) {  // perf: "comm tid"
      std::from_chars(last.data(), last.data() + last.size(), tid);
      fl = TextFlavor::kPerfScript;
    } else if (const size_t slash = last.find('/');
               sp != SV::npos && slash != SV::npos && AllDigits(last.substr(0, slash)) &&
               AllDigits(last.substr(slash + 1))) {  // perf: "comm pid/tid"
      int64_t pid = 0;
      std::from_chars(last.data(), last.data() + slash, pid);
      std::from_chars(last.data() + slash + 1, last.data() + last.size(), tid);
      tgid = static_cast<int32_t>(pid);
      fl = TextFlavor::kPerfScript;
    } else {  // ftrace / trace-cmd: "comm-tid"
      const size_t dash = last.rfind('-');
      if (dash == SV::npos || !AllDigits(last.substr(dash + 1))) return TextLineKind::kBad;
      std::from_chars(last.data() + dash + 1, last.data() + last.size(), tid);
    }

    // After the bracket: [flags] timestamp ':'.
    rest = TrimLeft(s.substr(rb + 1));
    colon = rest.find(':');
    if (colon == SV::npos) return TextLineKind::kBad;
    SV ts = rest.substr(0, colon);
    if (const size_t sp2 = ts.find_last_of(" \t"); sp2 != SV::npos) {  // latency flags first
      ts = ts.substr(sp2 + 1);
      if (fl == TextFlavor::kTraceCmdReport) fl = TextFlavor::kFtrace;
    }
    if (!ParseStamp(ts, &stamp)) return TextLineKind::kBad;
    rest.remove_prefix(colon + 1);
  }
  rest = TrimLeft(rest);
  // Event name: "kvm_fpu:" or "kvm:kvm_fpu:".
  colon = rest.find(':');
  if (colon == SV::npos) return TextLineKind::kBad;
  SV name = rest.substr(0, colon);
  rest.remove_prefix(colon + 1);
  if (name == "kvm" || name == "kvmmmu" || name == "sched") {
    colon = rest.find(':');
    if (colon == SV::npos) return TextLineKind::kBad;
    const bool kvm = name == "kvm" || name == "sched";
    name = rest.substr(0, colon);
    rest.remove_prefix(colon + 1);
    if (!trimmed) fl = TextFlavor::kPerfScript;
    if (!kvm) name = {};
  }
  if (flavor != nullptr) *flavor = fl;

  out->ts = stamp;
  out->cpu = static_cast<uint32_t>(cpu);
  out->tid = static_cast<int32_t>(tid);
  out->tgid = tgid;
  out->type = KvmEventFromName(name);
  if (out->type == KvmEventType::kOther) return TextLineKind::kRecord;
  if (!ParsePayload(out->type, rest, options, out)) return TextLineKind::kBad;
  if (trimmed && out->vcpu_id >= 0 &&
      (out->type == KvmEventType::kExit || out->type == KvmEventType::kEntry ||
       out->type == KvmEventType::kPageFault)) {
    out->tid = static_cast<int32_t>(out->vcpu_id);
  }
  return TextLineKind::kRecord;
}

Result<std::unique_ptr<TraceText>> TraceText::Open(const std::string& path, TextOptions options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot stat: {}", path, std::strerror(e)));
  }
  std::unique_ptr<TraceText> t(new TraceText());
  t->name_ = path;
  t->options_ = options;
  t->size_ = static_cast<size_t>(st.st_size);
  if (t->size_ > 0) {
    void* m = ::mmap(nullptr, t->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return Fail(ErrorCode::kIo, fmt::format("{}: cannot map: {}", path, std::strerror(e)));
    }
    ::madvise(m, t->size_, MADV_SEQUENTIAL);
    t->map_ = m;
    t->data_ = static_cast<const char*>(m);
  }
  ::close(fd);
  EXITSCOPE_RETURN_IF_ERROR(t->Detect());
  return t;
}

Result<std::unique_ptr<TraceText>> TraceText::FromString(std::string text, std::string name,
                                                         TextOptions options) {
  std::unique_ptr<TraceText> t(new TraceText());
  t->name_ = std::move(name);
  t->options_ = options;
  t->owned_ = std::move(text);
  t->data_ = t->owned_.data();
  t->size_ = t->owned_.size();
  EXITSCOPE_RETURN_IF_ERROR(t->Detect());
  return t;
}

TraceText::~TraceText() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

Status TraceText::Detect() {
  // The first event line decides the flavour and whether timestamps are a raw counter. Only
  // the lines starting in the first 64 KiB are looked at, and a line's end is looked for at
  // most 64 KiB on: a multi-GB file with no newline (or no event line) near its start is
  // refused without reading the rest (issue 28: a 6 GB junk file was scanned whole before
  // its line 1 was refused).
  constexpr size_t kDetectBytes = 64u << 10;
  size_t pos = 0, line_no = 0;
  KvmRecord rec;
  int64_t lost = 0;
  while (pos < size_ && pos < kDetectBytes) {
    const size_t stop = std::min(size_, pos + kDetectBytes);
    const char* nl = static_cast<const char*>(std::memchr(data_ + pos, '\n', stop - pos));
    if (nl == nullptr && stop < size_) {
      return Fail(ErrorCode::kCorrupt,
                  fmt::format("{}: line {} (offset {}): no line end within {} bytes: not a "
                              "trace-cmd report / ftrace / perf script event line",
                              name_, line_no + 1, pos, kDetectBytes));
    }
    const size_t end = nl ? static_cast<size_t>(nl - data_) : size_;
    SV line(data_ + pos, end - pos);
    ++line_no;
    TextFlavor fl = TextFlavor::kAuto;
    const TextLineKind k = ParseTraceLine(line, options_, &rec, &lost, &fl);
    if (k == TextLineKind::kRecord) {
      flavor_ = fl;
      // Integer timestamp: find the ts token again (cheap: only once).
      SV s = fl == TextFlavor::kTimestampOnly ? line : line.substr(line.find(']') + 1);
      s = TrimLeft(s);
      SV ts = s.substr(0, s.find(':'));
      clock_ = ts.find('.') == SV::npos ? "x86-tsc" : "local";
      return {};
    }
    if (k == TextLineKind::kBad) {
      return Fail(ErrorCode::kCorrupt,
                  fmt::format("{}: line {} (offset {}): not a trace-cmd report / ftrace / perf "
                              "script event line",
                              name_, line_no, pos));
    }
    pos = end + 1;
  }
  return Fail(ErrorCode::kCorrupt,
              fmt::format("{}: offset {}: no trace event line found", name_, pos));
}

Status TraceText::ReadAll(KvmPairer* pairer) {
  KvmRecord rec;
  int64_t lost = 0;
  size_t pos = 0;
  lines_ = 0;
  records_ = 0;
  int32_t vcpu_tid = 0;  // timestamp-only lines: the thread of the last vCPU a line named
  while (pos < size_) {
    const char* nl = static_cast<const char*>(std::memchr(data_ + pos, '\n', size_ - pos));
    const size_t end = nl ? static_cast<size_t>(nl - data_) : size_;
    SV line(data_ + pos, end - pos);
    ++lines_;
    TextFlavor fl = TextFlavor::kAuto;
    const TextLineKind kind = ParseTraceLine(line, options_, &rec, &lost, &fl);
    if (kind == TextLineKind::kRecord && fl == TextFlavor::kTimestampOnly) {
      if (rec.tid >= 0) {
        vcpu_tid = rec.tid;
      } else {
        rec.tid = vcpu_tid;  // no vcpu field (kvm_pio, kvm_userspace_exit, ...)
      }
    }
    if (nl == nullptr && kind != TextLineKind::kSkip) {
      // The file ends inside this line: a cut record must not be read as a shorter one
      // ("val 0x4" for "val 0x41"), so a last event line without its newline is refused.
      pairer->Finish();
      return Fail(ErrorCode::kCorrupt,
                  fmt::format("{}: offset {}: truncated last line (line {}, from offset {}, "
                              "ends without a newline: the file was cut mid-line)",
                              name_, size_, lines_, pos));
    }
    switch (kind) {
      case TextLineKind::kRecord:
        ++records_;
        pairer->Feed(rec);
        break;
      case TextLineKind::kLost:
        pairer->OnLost(rec.cpu, lost);
        break;
      case TextLineKind::kSkip:
        break;
      case TextLineKind::kBad:
        pairer->Finish();
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: line {} (offset {}): {}", name_, lines_, pos,
                                nl ? "malformed event line" : "truncated last line"));
    }
    pos = end + 1;
  }
  pairer->Finish();
  return {};
}

}  // namespace exitscope::sources
