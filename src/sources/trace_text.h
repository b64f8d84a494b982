// sources/trace_text.h: kvm records from text traces: `trace-cmd report` output, the ftrace
// `trace` file, and `perf script` output of kvm tracepoints.
//
// One line per record; the line layouts read are
//
//   trace-cmd report:  pvmx-16330 [000]4396959646611: kvm_userspace_exit:   reason KVM_EXIT_IO (2)
//                      qemu-4711  [001]  1234.567890: kvm_exit: vcpu 0 reason HLT rip 0x...
//   ftrace trace:      CPU 0/KVM-4711 (   4700) [002] d..1.  1234.567890: kvm_fpu: load
//   perf script:       CPU 0/KVM  4711 [002]  1234.567890: kvm:kvm_pio: pio_write at 0x3f8 ...
//                      qemu 4700/4711 [002]  1234.567890: kvm:kvm_pio: ...
//
// i.e. a task (comm-tid, comm tid or comm pid/tid, optionally "(tgid)"), the CPU in
// brackets, optional latency flags, a timestamp ("sec.frac" in a nanosecond clock, or an
// integer counter such as x86-tsc cycles), the event name (with or without "kvm:") and its
// print-fmt text, parsed per kvm event with std::from_chars (no regex, no allocation).
// "CPU:N [LOST M EVENTS]" lines report ring-buffer losses. Comment lines ("#"), trace-cmd's
// "cpus=N" / "version = N" and "CPU N is empty" are skipped.
//
// Lines trimmed to their timestamp, as traces are quoted in mails, are read too:
//
//   trimmed:           220.696239: kvm_exit: vcpu 0 reason vintr rip 0x4004ae info1 0x0 ...
//
// They name no task and no CPU, so the thread is the vCPU: a record whose payload names one
// (kvm_exit, kvm_entry, kvm_page_fault: "vcpu N") is thread N of VM 0, any other record
// (kvm_pio, kvm_mmio, kvm_userspace_exit, ...) goes to the vCPU the last such line named
// (vCPU 0 before any): right for an excerpt of one vCPU, a guess where several interleave.
//
// Text does not carry kvm_exit's isa field, only the reason as the kernel printed it: VMX
// names decode as VMX, SVM names as SVM, HYPERCALL and HC_* names as PVM (HYPERCALL split by
// its info2 into HC_* as 0x20000 is), bare numbers as PVM when they are PVM reasons.
// PVM kernels print their reasons through the SVM table ("read_cr0" for DE excp), so a text
// trace known to come from a PVM host is read with TextOptions::isa = Isa::kPvm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "exitscope/status.h"
#include "sources/event.h"
#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"

namespace exitscope::sources {

enum class TextFlavor : uint8_t {
  kAuto = 0,
  kTraceCmdReport,
  kFtrace,
  kPerfScript,
  kTimestampOnly,  // lines trimmed to their timestamp (above)
};
std::string_view ToString(TextFlavor f) noexcept;

struct TextOptions {
  Isa isa = Isa::kUnknown;  // kUnknown: infer per record from the reason name (see above)
};

// What one line is.
enum class TextLineKind : uint8_t {
  kRecord = 0,  // an event line: `out` is filled (type kOther for events we do not decode)
  kLost,        // "CPU:N [LOST M EVENTS]": out->cpu and *lost (-1: count unknown) are set
  kSkip,        // blank, comment or header line
  kBad,         // looks like neither: malformed or truncated
};

// Parses one line (without its newline). For kRecord and a kvm event whose text does not
// match its print fmt, returns kBad.
TextLineKind ParseTraceLine(std::string_view line, const TextOptions& options, KvmRecord* out,
                            int64_t* lost, TextFlavor* flavor = nullptr) noexcept;

// A text trace, mapped into memory.
class TraceText {
 public:
  // Maps `path`; refuses a file that has no event line in its first 64 KiB of lines.
  static Result<std::unique_ptr<TraceText>> Open(const std::string& path, TextOptions options = {});
  // From text in memory (tests); `name` is used in messages.
  static Result<std::unique_ptr<TraceText>> FromString(std::string text, std::string name,
                                                       TextOptions options = {});
  ~TraceText();
  TraceText(const TraceText&) = delete;
  TraceText& operator=(const TraceText&) = delete;

  TextFlavor flavor() const noexcept { return flavor_; }
  // "x86-tsc" when timestamps are integers (a raw counter: trace-cmd prints x86-tsc and
  // counter clocks that way), else "local" (nanoseconds).
  const std::string& clock() const noexcept { return clock_; }

  // Streams every line into `pairer` (then Finish()). A malformed or truncated line stops
  // reading with an error naming the file, line number and byte offset.
  Status ReadAll(KvmPairer* pairer);
  uint64_t records_read() const noexcept { return records_; }
  uint64_t lines_read() const noexcept { return lines_; }

 private:
  TraceText() = default;
  Status Detect();

  std::string name_;
  TextOptions options_;
  const char* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;
  std::string owned_;
  TextFlavor flavor_ = TextFlavor::kAuto;
  std::string clock_ = "local";
  uint64_t records_ = 0;
  uint64_t lines_ = 0;
};

}  // namespace exitscope::sources
