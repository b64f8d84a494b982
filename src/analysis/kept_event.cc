#include "analysis/kept_event.h"

#include <utility>

#include "recorder/describe.h"

namespace exitscope::analysis {

KeptExit::KeptExit(const ExitEvent& e, std::string row_key)
    : ExitEvent(e), key(std::move(row_key)) {
  Own();
}
KeptExit::KeptExit(const KeptExit& o) : ExitEvent(o), key(o.key) {
  Own();
}
KeptExit::KeptExit(KeptExit&& o) noexcept
    : ExitEvent(o),
      key(std::move(o.key)),
      reason_(std::move(o.reason_)),
      device_(std::move(o.device_)),
      reg_(std::move(o.reg_)),
      user_reason_(std::move(o.user_reason_)) {
  Repoint();
  o.Repoint();
}
KeptExit& KeptExit::operator=(const KeptExit& o) {
  if (this != &o) *this = KeptExit(o);
  return *this;
}
KeptExit& KeptExit::operator=(KeptExit&& o) noexcept {
  static_cast<ExitEvent&>(*this) = o;
  key = std::move(o.key);
  reason_ = std::move(o.reason_);
  device_ = std::move(o.device_);
  reg_ = std::move(o.reg_);
  user_reason_ = std::move(o.user_reason_);
  Repoint();
  o.Repoint();
  return *this;
}
void KeptExit::Own() {
  reason_ = reason;
  device_ = device;
  reg_ = reg;
  user_reason_ = user_reason;
  Repoint();
}
void KeptExit::Repoint() noexcept {
  reason = reason_;
  device = device_;
  reg = reg_;
  user_reason = user_reason_;
}

std::string DescribeExit(const KeptExit& e) {
  return internal::DescribeExit(e.kind, e.dir, e.size, e.subkey, e.device, e.reg);
}

KeptFinding::KeptFinding(const Finding& f) : Finding(f) {
  Own();
}
KeptFinding::KeptFinding(const KeptFinding& o) : Finding(o), in_flight(o.in_flight) {
  Own();
}
KeptFinding::KeptFinding(KeptFinding&& o) noexcept
    : Finding(o),
      in_flight(std::move(o.in_flight)),
      device_(std::move(o.device_)),
      reg_(std::move(o.reg_)),
      text_(std::move(o.text_)),
      stack_(std::move(o.stack_)) {
  o.stack_.reset();
  Repoint();
  o.Repoint();
}
KeptFinding& KeptFinding::operator=(const KeptFinding& o) {
  if (this != &o) *this = KeptFinding(o);
  return *this;
}
KeptFinding& KeptFinding::operator=(KeptFinding&& o) noexcept {
  if (this == &o) return *this;
  static_cast<Finding&>(*this) = o;
  in_flight = std::move(o.in_flight);
  device_ = std::move(o.device_);
  reg_ = std::move(o.reg_);
  text_ = std::move(o.text_);
  stack_ = std::move(o.stack_);
  o.stack_.reset();
  Repoint();
  o.Repoint();
  return *this;
}
void KeptFinding::Own() {
  device_ = device;
  reg_ = reg;
  text_ = text;
  if (stack != nullptr) {
    stack_ = *stack;
  } else {
    stack_.reset();
  }
  Repoint();
}
void KeptFinding::Repoint() noexcept {
  device = device_;
  reg = reg_;
  text = text_;
  stack = stack_ ? &*stack_ : nullptr;
}

}  // namespace exitscope::analysis
