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

}  // namespace exitscope
