// Dump names and descriptions: device and register names of a dump's exits, attributes, and
// the one-line exit description shared with the recorder's log lines.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "exitscope/dump.h"
#include "recorder/describe.h"

namespace exitscope {
namespace internal {

std::string DescribeExit(ExitKind kind, AccessDir dir, uint8_t size, uint64_t addr,
                         std::string_view device, std::string_view reg) {
  char buf[64];
  std::string s = "exit ";
  s += ToString(kind);
  if (kind == ExitKind::kMmio || kind == ExitKind::kPio) {
    if (dir != AccessDir::kNone) {
      s += ' ';
      s += ToString(dir);
    }
    s += ' ' + std::to_string(size) + "B ";
    s += dir == AccessDir::kRead ? "from " : "to ";
    if (device.empty()) {
      s += "unassigned";
    } else {
      s += device;
      if (!reg.empty()) {
        s += '.';
        s += reg;
      }
    }
    std::snprintf(buf, sizeof buf,
                  kind == ExitKind::kPio ? " (port 0x%" PRIx64 ")" : " (0x%" PRIx64 ")", addr);
    s += buf;
  } else if (kind == ExitKind::kHypercall || kind == ExitKind::kMsr || kind == ExitKind::kOther) {
    std::snprintf(buf, sizeof buf, " 0x%" PRIx64, addr);
    s += buf;
  }
  return s;
}

}  // namespace internal

// ---- Dump helpers ------------------------------------------------------------------------

std::string Dump::DeviceName(uint32_t index) const {
  if (index == kUnassigned) return {};
  if (index < devices.size()) return devices[index].name;
  return "#" + std::to_string(index);
}

const RegisterMap* Dump::MapFor(IoSpace space, uint64_t addr) const {
  for (const DumpRange& r : ranges) {
    if (r.space == space && addr >= r.base && addr - r.base < r.size) {
      return r.map < maps.size() ? &maps[r.map] : nullptr;
    }
  }
  return nullptr;
}

std::string Dump::RegisterName(uint32_t device, uint64_t addr, IoSpace space, uint32_t reg,
                               uint32_t element, uint32_t delta, uint32_t size) const {
  if (reg == kNoRegister || device == kUnassigned) return {};
  for (const DumpRange& r : ranges) {
    if (r.space == space && r.device == device && addr >= r.base && addr - r.base < r.size) {
      if (r.map >= maps.size()) return {};
      return maps[r.map].Format(RegisterHit{reg, element, delta}, size);
    }
  }
  return {};
}

const RegisterMap* Dump::MapFor(const DumpExit& e) const {
  if (e.kind != ExitKind::kMmio && e.kind != ExitKind::kPio) return nullptr;
  if (e.map != kNoRegister) return e.map < maps.size() ? &maps[e.map] : nullptr;
  return MapFor(SpaceOf(e.kind), e.addr);
}

std::string Dump::RegisterName(const DumpExit& e) const {
  if (e.kind != ExitKind::kMmio && e.kind != ExitKind::kPio) return {};
  if (e.map == kNoRegister) {  // version 1: the range holding the address at snapshot time
    return RegisterName(e.device, e.addr, SpaceOf(e.kind), e.reg, e.reg_element, e.reg_delta,
                        e.size);
  }
  if (e.reg == kNoRegister || e.device == kUnassigned || e.map >= maps.size()) return {};
  return maps[e.map].Format(RegisterHit{e.reg, e.reg_element, e.reg_delta}, e.size);
}

std::string Dump::Attribute(std::string_view key) const {
  for (const auto& [k, v] : attributes) {
    if (k == key) return v;
  }
  return {};
}

std::string Dump::DescribeExit(const DumpExit& e) const {
  return internal::DescribeExit(e.kind, e.dir, e.size, e.addr, DeviceName(e.device),
                                RegisterName(e));
}

}  // namespace exitscope
