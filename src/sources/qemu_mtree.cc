#include "sources/qemu_mtree.h"

#include <charconv>

#include <fmt/format.h>

#include "base/text.h"

namespace exitscope::sources {
namespace {

// A line without its indentation (spaces or tabs: QEMU's, or a ticket's) and trailing blanks.
std::string_view Body(std::string_view line) noexcept {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
    line.remove_suffix(1);
  }
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  return line;
}

bool StartsWith(std::string_view s, std::string_view p) noexcept {
  return s.substr(0, p.size()) == p;
}

bool ParseHex(std::string_view s, uint64_t* v) noexcept {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

bool IsHex16(std::string_view s) noexcept {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}

// A quoted excerpt of a bad line for an error message.
std::string QuotedExcerpt(std::string_view line) {
  std::string s(line.substr(0, 60));
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return line.size() > 60 ? "'" + s + "...'" : "'" + s + "'";
}

// "  <start>-<last> (prio <p>, <type>): <name>[ @<offset>][ owner:{..}][ KVM]".
bool ParseRangeLine(std::string_view line, QemuFlatRange* r, std::string* why) {
  std::string_view s = line;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  const size_t dash = s.find('-');
  const size_t open = s.find(" (prio ");
  if (dash == std::string_view::npos || open == std::string_view::npos || dash > open) {
    *why = "expected `start-last (prio N, type): name`";
    return false;
  }
  if (!ParseHex(s.substr(0, dash), &r->start) ||
      !ParseHex(s.substr(dash + 1, open - dash - 1), &r->last)) {
    *why = "bad address range";
    return false;
  }
  if (r->last < r->start) {
    *why = "range ends before it starts";
    return false;
  }
  s.remove_prefix(open + 7);
  const size_t comma = s.find(", ");
  const size_t close = s.find("): ");
  if (comma == std::string_view::npos || close == std::string_view::npos || comma > close) {
    *why = "expected `(prio N, type): name`";
    return false;
  }
  std::string_view prio = s.substr(0, comma);
  const bool negative = !prio.empty() && prio.front() == '-';
  if (negative) prio.remove_prefix(1);
  unsigned p = 0;
  const auto [pp, ec] = std::from_chars(prio.data(), prio.data() + prio.size(), p);
  if (prio.empty() || ec != std::errc() || pp != prio.data() + prio.size() || p > 1u << 30) {
    *why = "bad priority";
    return false;
  }
  r->priority = negative ? -static_cast<int>(p) : static_cast<int>(p);
  r->type = std::string(s.substr(comma + 2, close - comma - 2));
  if (r->type.empty()) {
    *why = "empty region type";
    return false;
  }
  std::string_view name = s.substr(close + 3);
  while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
  // `-o` appends the owner after the offset: " owner:{...}", " parent:{...}", " orphan".
  for (std::string_view tag : {std::string_view(" owner:{"), std::string_view(" parent:{")}) {
    if (const size_t at = name.find(tag); at != std::string_view::npos) name = name.substr(0, at);
  }
  if (name.ends_with(" orphan")) name.remove_suffix(7);
  // The accelerator's name, once per address space whose memory slots hold the range.
  while (name.ends_with(" KVM")) name.remove_suffix(4);
  r->region_offset = 0;
  if (name.size() >= 18 && name[name.size() - 18] == ' ' && name[name.size() - 17] == '@' &&
      IsHex16(name.substr(name.size() - 16))) {
    ParseHex(name.substr(name.size() - 16), &r->region_offset);
    name.remove_suffix(18);
  }
  if (name.empty()) {
    *why = "empty region name";
    return false;
  }
  r->name = std::string(name);
  return true;
}

// "<hex>-<hex> (prio ...": a range line of either tree (`info mtree` with or without -f).
bool IsRangeLine(std::string_view body) noexcept {
  const size_t dash = body.find('-');
  const size_t open = body.find(" (prio ");
  uint64_t v = 0;
  return dash != std::string_view::npos && open != std::string_view::npos && dash < open &&
         ParseHex(body.substr(0, dash), &v) && ParseHex(body.substr(dash + 1, open - dash - 1), &v);
}

enum class Shape { kNone, kFlat, kTree };

// Whether `text` is QEMU's, by lines only QEMU's monitor prints (none of them is a valid line
// of the device-map format): the prompt "(qemu)", a view's header lines and ranges.
Shape Classify(std::string_view text) noexcept {
  bool qemu = false, tree = false;
  base::LineSplitter lines(text);
  for (std::string_view raw; lines.Next(&raw);) {
    const std::string_view line = Body(raw);
    if (StartsWith(line, "FlatView #")) return Shape::kFlat;
    if (StartsWith(line, "address-space: ")) {
      tree = true;
    } else if (StartsWith(line, "(qemu)") || StartsWith(line, "AS \"") ||
               StartsWith(line, "Root memory region: ") || IsRangeLine(line)) {
      qemu = true;
    }
  }
  return tree ? Shape::kTree : qemu ? Shape::kFlat : Shape::kNone;
}

}  // namespace

bool LooksLikeQemuMtreeFlat(std::string_view text) noexcept {
  return Classify(text) == Shape::kFlat;
}

bool LooksLikeQemuMtreeTree(std::string_view text) noexcept {
  return Classify(text) == Shape::kTree;
}

Result<std::vector<QemuFlatView>> ParseQemuMtreeFlat(std::string_view text,
                                                     std::string_view origin) {
  std::vector<QemuFlatView> views;
  bool in_dispatch = false;  // inside a view's "Dispatch" section (`info mtree -f -d`)
  size_t ended_at = 0;       // the line of the monitor prompt after the tree (0: none yet)
  base::LineSplitter lines(text);
  for (std::string_view raw; lines.Next(&raw);) {
    const size_t line_no = lines.number();
    // Indentation is dropped: each line says what it is by its content.
    const std::string_view line = Body(raw);
    if (line.empty()) continue;
    const auto fail = [&](const std::string& why) {
      return Fail(ErrorCode::kInvalidArgument,
                  fmt::format("{}:{}: {} in QEMU's `info mtree -f` output: {}", origin, line_no,
                              why, QuotedExcerpt(line)));
    };
    // The monitor's prompt: "(qemu) info mtree -f" before the tree, "(qemu)" after it.
    if (StartsWith(line, "(qemu)")) {
      const std::string_view command = Body(line.substr(6));
      if (views.empty() && !command.empty() && !StartsWith(command, "info mtree")) {
        return fail(
            "a monitor command other than `info mtree -f` (paste only that command "
            "and what it printed)");
      }
      if (!views.empty() && ended_at == 0) ended_at = line_no;
      continue;
    }
    if (ended_at != 0) {
      return fail(
          fmt::format("text after the monitor prompt of line {}, which ended the tree", ended_at));
    }
    if (StartsWith(line, "FlatView #")) {
      views.emplace_back();
      in_dispatch = false;
      continue;
    }
    if (views.empty()) return fail("expected a `FlatView #N` header first");
    if (in_dispatch) continue;
    QemuFlatView& v = views.back();
    if (StartsWith(line, "AS \"")) {
      const size_t end = line.find('"', 4);
      if (end == std::string_view::npos) return fail("unterminated address-space name");
      v.address_spaces.emplace_back(line.substr(4, end - 4));
      continue;
    }
    if (StartsWith(line, "Root memory region: ")) {
      const std::string_view root = line.substr(20);
      v.root = root == "(none)" ? std::string() : std::string(root);
      continue;
    }
    if (line == "No rendered FlatView") continue;
    if (line == "Dispatch") {
      in_dispatch = true;
      continue;
    }
    QemuFlatRange r;
    std::string why;
    if (!ParseRangeLine(line, &r, &why)) return fail(why);
    if (!v.ranges.empty() && r.start <= v.ranges.back().last) {
      return fail(fmt::format("range starts at {:#x}, inside the previous one (ends at {:#x})",
                              r.start, v.ranges.back().last));
    }
    v.ranges.push_back(std::move(r));
  }
  if (views.empty()) {
    return Fail(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: no `FlatView #N` in it: not QEMU's `info mtree -f` output", origin));
  }
  return views;
}

const QemuFlatView* FindQemuView(const std::vector<QemuFlatView>& views,
                                 std::string_view as) noexcept {
  for (const QemuFlatView& v : views) {
    for (const std::string& a : v.address_spaces) {
      if (a == as) return &v;
    }
  }
  return nullptr;
}

std::string_view QemuRegisterMapFor(std::string_view region, uint64_t end) noexcept {
  if (region == "serial") return end <= 8 ? "uart16550" : "";
  if (region == "nvme") return "nvme";
  if (StartsWith(region, "virtio-pci-common-")) return "virtio-pci-common";
  if (region == "virtio-mmio") return "virtio-mmio";
  if (region == kQemuEcamRegion) return "pci-config";
  return "";
}

std::string QemuEcamFunction(uint64_t offset) {
  return fmt::format("{:02x}:{:02x}.{:x}", (offset >> 20) & 0xff, (offset >> 15) & 0x1f,
                     (offset >> 12) & 0x7);
}

}  // namespace exitscope::sources
