#include "vmm/fault_injection.h"

#include <charconv>

namespace exitscope::vmm {

namespace {

Result<uint64_t> Number(std::string_view spec, std::string_view field, std::string_view what,
                        uint64_t min) {
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
  if (field.empty() || ec != std::errc() || p != field.data() + field.size())
    return Fail(ErrorCode::kInvalidArgument, "--inject " + std::string(spec) + ": " +
                                                 std::string(what) + " '" + std::string(field) +
                                                 "' is not a number");
  if (v < min || v > 3'600'000)
    return Fail(ErrorCode::kInvalidArgument,
                "--inject " + std::string(spec) + ": " + std::string(what) + " " +
                    std::to_string(v) + " out of range (" + std::to_string(min) + "..3600000)");
  return v;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    out.push_back(
        s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}

}  // namespace

Result<InjectSpec> ParseInjectSpec(std::string_view text) {
  const std::string t(text);
  const std::vector<std::string_view> f = Split(text, ':');
  InjectSpec s;
  s.text = t;
  auto usage = [&](std::string_view why) {
    return Fail(ErrorCode::kInvalidArgument,
                "--inject " + t + ": " + std::string(why) +
                    " (expected delay:DEVICE[.REGISTER]:MS[:EVERY_N], "
                    "spin:DEVICE[.REGISTER]:MS[:EVERY_N], "
                    "backend-delay:DEVICE:MS[:EVERY_N], backend-error:DEVICE:EVERY_N or "
                    "lock:DEVICE:MS:EVERY_N)");
  };
  if (f.size() < 3) return usage("too few fields");
  if (f[1].empty()) return usage("empty device name");
  if (f[0] == "delay" || f[0] == "spin" || f[0] == "backend-delay") {
    if (f.size() > 4) return usage("too many fields");
    s.kind = f[0] == "delay"  ? InjectSpec::Kind::kDelay
             : f[0] == "spin" ? InjectSpec::Kind::kSpin
                              : InjectSpec::Kind::kBackendDelay;
    std::string_view target = f[1];
    if (s.kind != InjectSpec::Kind::kBackendDelay) {
      const size_t dot = target.find('.');
      if (dot != std::string_view::npos) {
        s.reg = std::string(target.substr(dot + 1));
        target = target.substr(0, dot);
        if (s.reg.empty() || target.empty()) return usage("empty device or register name");
      }
    } else if (target.find('.') != std::string_view::npos) {
      return usage("backend-delay takes a device, not a register");
    }
    s.device = std::string(target);
    auto ms = Number(t, f[2], "delay in ms", 1);
    if (!ms) return Propagate(ms);
    s.ms = *ms;
    if (f.size() == 4) {
      auto every = Number(t, f[3], "EVERY_N", 1);
      if (!every) return Propagate(every);
      s.every = *every;
    }
    return s;
  }
  if (f[0] == "backend-error") {
    if (f.size() != 3) return usage("backend-error takes exactly DEVICE:EVERY_N");
    s.kind = InjectSpec::Kind::kBackendError;
    s.device = std::string(f[1]);
    auto every = Number(t, f[2], "EVERY_N", 1);
    if (!every) return Propagate(every);
    s.every = *every;
    return s;
  }
  if (f[0] == "lock") {
    if (f.size() != 4) return usage("lock takes exactly DEVICE:MS:EVERY_N");
    if (f[1].find('.') != std::string_view::npos)
      return usage("lock takes a device, not a register");
    s.kind = InjectSpec::Kind::kLock;
    s.device = std::string(f[1]);
    auto ms = Number(t, f[2], "lock hold in ms", 1);
    if (!ms) return Propagate(ms);
    s.ms = *ms;
    auto every = Number(t, f[3], "EVERY_N", 1);
    if (!every) return Propagate(every);
    s.every = *every;
    return s;
  }
  return usage("unknown kind '" + std::string(f[0]) + "'");
}

Status CheckDeviceFaults(const std::vector<InjectSpec>& specs, const AddressSpace& space,
                         std::string_view device) {
  for (const InjectSpec& s : specs) {
    if (s.kind == InjectSpec::Kind::kDelay || s.kind == InjectSpec::Kind::kSpin) continue;
    if (!space.FindDevice(s.device))
      return Fail(ErrorCode::kInvalidArgument,
                  "--inject " + s.text + ": no device named '" + s.device + "'");
    if (s.device == device) continue;
    if (s.kind == InjectSpec::Kind::kLock)
      return Fail(ErrorCode::kInvalidArgument, "--inject " + s.text + ": device '" + s.device +
                                                   "' has no lock to contend (lock faults apply "
                                                   "to " +
                                                   std::string(device) + ")");
    return Fail(ErrorCode::kInvalidArgument, "--inject " + s.text + ": device '" + s.device +
                                                 "' has no backend (backend faults apply to " +
                                                 std::string(device) + ")");
  }
  return {};
}

Result<std::unique_ptr<ExitDelayInjector>> ExitDelayInjector::Bind(
    const std::vector<InjectSpec>& specs, const AddressSpace& space) {
  auto inj = std::unique_ptr<ExitDelayInjector>(new ExitDelayInjector());
  const std::vector<RangeInfo> ranges = space.Ranges();
  for (const InjectSpec& s : specs) {
    if (s.kind != InjectSpec::Kind::kDelay && s.kind != InjectSpec::Kind::kSpin) continue;
    auto dev = space.FindDevice(s.device);
    if (!dev)
      return Fail(ErrorCode::kInvalidArgument,
                  "--inject " + s.text + ": no device named '" + s.device + "'");
    Rule rule;
    rule.device = *dev;
    rule.ms = s.ms;
    rule.every = s.every;
    rule.spin = s.kind == InjectSpec::Kind::kSpin;
    rule.matches = std::make_unique<std::atomic<uint64_t>>(0);
    if (!s.reg.empty()) {
      bool found = false;
      for (const RangeInfo& r : ranges) {
        if (r.device != *dev || r.map == nullptr || found) continue;
        const auto& defs = r.map->registers();
        for (uint32_t i = 0; i < defs.size() && !found; ++i)
          for (uint32_t e = 0; e < defs[i].count && !found; ++e)
            if (defs[i].ElementName(e) == s.reg) {
              rule.map = r.map.get();
              rule.reg = i;
              rule.element = e;
              found = true;
            }
      }
      if (!found)
        return Fail(ErrorCode::kInvalidArgument, "--inject " + s.text + ": device '" + s.device +
                                                     "' has no register '" + s.reg + "'");
    }
    inj->rules_.push_back(std::move(rule));
  }
  return inj;
}

uint64_t ExitDelayInjector::DelayFor(const Resolution& res, bool* spin) noexcept {
  uint64_t ms = 0;
  for (Rule& r : rules_) {
    if (r.device != res.device) continue;
    if (r.reg != kNoRegister &&
        (res.map != r.map || res.reg.reg != r.reg || res.reg.element != r.element))
      continue;
    const uint64_t n = r.matches->fetch_add(1, std::memory_order_relaxed) + 1;
    if (n % r.every == 0) {
      ms += r.ms;
      if (spin != nullptr && r.spin) *spin = true;
    }
  }
  return ms;
}

}  // namespace exitscope::vmm
