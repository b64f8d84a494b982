#include "analysis/kept_event.h"

#include <utility>

#include "recorder/describe.h"

namespace exitscope::analysis {

// A field added to ExitEvent or Finding belongs in KeptExit / KeptFinding, their constructors
// and view() too. Most additions change the size (one that fits in padding does not): then
// these fail to compile until the sizes are brought up to date here (64-bit builds).
static_assert(sizeof(void*) != 8 || sizeof(ExitEvent) == 160, "ExitEvent changed: update KeptExit");
static_assert(sizeof(void*) != 8 || sizeof(Finding) == 80, "Finding changed: update KeptFinding");

KeptExit::KeptExit(const ExitEvent& e, std::string row_key)
    : start_ns(e.start_ns),
      duration_ns(e.duration_ns),
      vcpu(e.vcpu),
      vm(e.vm),
      isa(e.isa),
      reason(e.reason),
      subkey_kind(e.subkey_kind),
      subkey(e.subkey),
      size(e.size),
      dir(e.dir),
      userspace(e.userspace),
      device(e.device),
      reg(e.reg),
      device_offset(e.device_offset),
      tid(e.tid),
      guest_rip(e.guest_rip),
      value(e.value),
      user_reason(e.user_reason),
      failed_vmentry(e.failed_vmentry),
      end(e.end),
      kernel_access(e.kernel_access),
      kind(e.kind),
      flags(e.flags),
      key(std::move(row_key)) {}

ExitEvent KeptExit::view() const noexcept {
  ExitEvent e;
  e.start_ns = start_ns;
  e.duration_ns = duration_ns;
  e.vcpu = vcpu;
  e.vm = vm;
  e.isa = isa;
  e.reason = reason;
  e.subkey_kind = subkey_kind;
  e.subkey = subkey;
  e.size = size;
  e.dir = dir;
  e.userspace = userspace;
  e.device = device;
  e.reg = reg;
  e.device_offset = device_offset;
  e.tid = tid;
  e.guest_rip = guest_rip;
  e.value = value;
  e.user_reason = user_reason;
  e.failed_vmentry = failed_vmentry;
  e.end = end;
  e.kernel_access = kernel_access;
  e.kind = kind;
  e.flags = flags;
  return e;
}

std::string DescribeExit(const KeptExit& e) {
  return internal::DescribeExit(e.kind, e.dir, e.size, e.subkey, e.device, e.reg);
}

KeptFinding::KeptFinding(const Finding& f)
    : time_ns(f.time_ns),
      type(f.type),
      vcpu(f.vcpu),
      duration_ns(f.duration_ns),
      device(f.device),
      reg(f.reg),
      io_id(f.io_id),
      text(f.text) {}

Finding KeptFinding::view() const noexcept {
  Finding f;
  f.time_ns = time_ns;
  f.type = type;
  f.vcpu = vcpu;
  f.duration_ns = duration_ns;
  f.device = device;
  f.reg = reg;
  f.io_id = io_id;
  f.text = text;
  return f;
}

}  // namespace exitscope::analysis
