#include "sources/event.h"

namespace exitscope {

std::string_view ToString(Isa isa) noexcept {
  switch (isa) {
    case Isa::kVmx:
      return "VMX";
    case Isa::kSvm:
      return "SVM";
    case Isa::kPvm:
      return "PVM";
    case Isa::kUnknown:
      break;
  }
  return "unknown";
}

std::string_view ToString(SubKeyKind k) noexcept {
  switch (k) {
    case SubKeyKind::kPort:
      return "port";
    case SubKeyKind::kMmio:
      return "mmio";
    case SubKeyKind::kMsr:
      return "msr";
    case SubKeyKind::kHypercall:
      return "hypercall";
    case SubKeyKind::kNone:
      break;
  }
  return "none";
}

std::string_view ToString(Direction d) noexcept {
  switch (d) {
    case Direction::kRead:
      return "read";
    case Direction::kWrite:
      return "write";
    case Direction::kNone:
      break;
  }
  return "none";
}

std::string_view ToString(ExitEnd e) noexcept {
  switch (e) {
    case ExitEnd::kOpenAtEnd:
      return "open_at_end";
    case ExitEnd::kNotTraced:
      return "not_traced";
    case ExitEnd::kSeen:
      break;
  }
  return "seen";
}

std::string_view ToString(DeviceEventKind k) noexcept {
  switch (k) {
    case DeviceEventKind::kIoSubmit:
      return "io_submit";
    case DeviceEventKind::kIoComplete:
      return "io_complete";
    case DeviceEventKind::kQueueFull:
      return "queue_full";
    case DeviceEventKind::kBackendError:
      return "backend_error";
    case DeviceEventKind::kNote:
      break;
  }
  return "note";
}

std::string_view ToString(FindingKind k) noexcept {
  switch (k) {
    case FindingKind::kStuckExitBegin:
      return "stuck_exit";
    case FindingKind::kStuckExitEnd:
      return "stuck_exit_end";
    case FindingKind::kAgedIo:
      break;
  }
  return "aged_io";
}

}  // namespace exitscope
