// exitscope/exit_record.h: the fixed-size record of one VM exit, and the small enums that
// describe an exit (kind, direction, address space).
//
// An ExitRecord is what the flight recorder stores per exit: 56 bytes, trivially copyable,
// timestamps in raw clock ticks (see clock.h; a Dump converts them to nanoseconds). Device and
// register are stored as indices resolved at BeginExit time (see address_space.h); names are
// recovered from the address space (live) or from the dump's tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace exitscope {

// Why the vCPU left the guest. Values are stable: they are stored in dumps.
enum class ExitKind : uint8_t {
  kUnknown = 0,
  kMmio = 1,       // KVM_EXIT_MMIO: addr is the guest-physical address
  kPio = 2,        // KVM_EXIT_IO: addr is the port
  kHlt = 3,        // KVM_EXIT_HLT
  kShutdown = 4,   // KVM_EXIT_SHUTDOWN (triple fault)
  kIntr = 5,       // KVM_EXIT_INTR (signal)
  kHypercall = 6,  // KVM_EXIT_HYPERCALL: addr is the hypercall number
  kMsr = 7,        // KVM_EXIT_X86_RDMSR / WRMSR: addr is the MSR index
  kDebug = 8,      // KVM_EXIT_DEBUG
  kSystemEvent = 9,
  kInternalError = 10,
  kFailEntry = 11,
  kOther = 12,  // anything else; addr may carry the raw exit reason
};
inline constexpr int kExitKindCount = 13;

// Direction of the access, seen from the guest: kWrite = the guest wrote (out / MMIO store).
enum class AccessDir : uint8_t { kNone = 0, kRead = 1, kWrite = 2 };

// The two address spaces a device range may live in.
enum class IoSpace : uint8_t { kMmio = 0, kPio = 1 };

// "MMIO", "PIO", "HLT", "SHUTDOWN", "INTR", "HYPERCALL", "MSR", ...; a value outside the enum
// (read from a dump) is "kind#99".
std::string_view ToString(ExitKind k) noexcept;
// "read", "write", "none".
std::string_view ToString(AccessDir d) noexcept;
// "mmio", "pio".
std::string_view ToString(IoSpace s) noexcept;
// Inverse of ToString(ExitKind), case-insensitive; false when unknown.
bool ParseExitKind(std::string_view s, ExitKind* out) noexcept;

// Index values meaning "none".
inline constexpr uint32_t kUnassigned = 0xffffffffu;  // no device covers the address
inline constexpr uint32_t kNoRegister = 0xffffffffu;  // no register map / no register there

// ExitRecord::flags bits.
enum ExitFlags : uint8_t {
  kExitFlagValue = 1u << 0,       // `value` holds guest data (a write's data or a read's result)
  kExitFlagSlow = 1u << 1,        // duration reached the SlowExitPolicy threshold
  kExitFlagStalled = 1u << 2,     // the watchdog reported this exit while it was in progress
  kExitFlagNoEnd = 1u << 3,       // BeginExit was followed by another BeginExit without EndExit
                                  // (duration is up to the next begin)
  kExitFlagUnresolved = 1u << 4,  // not yet resolved: `device` holds the address-space
                                  // generation of the access (Recorder::Resolve)
};

// One exit. Trivially copyable, fixed size; all fields meaningful only as documented.
struct ExitRecord {
  uint64_t start_ticks = 0;     // clock ticks at BeginExit (clock.h: Clock::ToNs)
  uint64_t duration_ticks = 0;  // ticks from BeginExit to EndExit
  uint64_t addr = 0;            // GPA (MMIO), port (PIO), MSR, hypercall nr, else 0
  uint64_t value = 0;           // guest data (valid when flags & kExitFlagValue)
  uint32_t vcpu = 0;
  uint32_t device = kUnassigned;  // index into the address space's device table
  uint32_t reg = kNoRegister;     // register definition index in the range's RegisterMap
  uint32_t reg_element = 0;       // element within a register array (0 for plain registers)
  uint32_t reg_delta = 0;         // byte offset of the access inside the register
  ExitKind kind = ExitKind::kUnknown;
  uint8_t size = 0;  // access size in bytes (0 when none)
  AccessDir dir = AccessDir::kNone;
  uint8_t flags = 0;  // ExitFlags
};
static_assert(sizeof(ExitRecord) == 56);
// Recorder::BeginExit writes these words directly (little-endian x86-64 layout).
static_assert(offsetof(ExitRecord, addr) == 16 && offsetof(ExitRecord, value) == 24);
static_assert(offsetof(ExitRecord, vcpu) == 32 && offsetof(ExitRecord, device) == 36);
static_assert(offsetof(ExitRecord, reg) == 40 && offsetof(ExitRecord, reg_element) == 44);
static_assert(offsetof(ExitRecord, reg_delta) == 48 && offsetof(ExitRecord, kind) == 52);
static_assert(offsetof(ExitRecord, size) == 53 && offsetof(ExitRecord, dir) == 54);
static_assert(offsetof(ExitRecord, flags) == 55);
static_assert(std::is_trivially_copyable_v<ExitRecord>);

}  // namespace exitscope
