// fuzz/device_map_scale.h: device maps at scale for the device_map and qmp targets, generated
// from a one-line directive so that a seed of 100,000 ranges stays a few bytes in the tree:
//
//   #!scale text 100000       a text device map ("devN x mmio ADDR 0x1000" per range)
//   #!scale mtree 100000      QEMU `info mtree -f` text (one i/o region per range)
//
// followed by anything: the rest of the input is appended after the generated ranges, so the
// mutations of a scale seed reach the parser after a large table. The count is capped at
// kMaxScaleRanges (about what the 16 MiB map and QMP limits allow).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace exitscope::fuzz {

inline constexpr size_t kMaxScaleRanges = 250000;

enum class ScaleKind { kNone, kText, kMtree };

// When `input` starts with a directive, returns its kind with the generated map in *out (the
// rest of the input appended); else kNone.
inline ScaleKind ExpandScaleDirective(std::string_view input, std::string* out) {
  constexpr std::string_view kTag = "#!scale ";
  if (!input.starts_with(kTag)) return ScaleKind::kNone;
  const size_t nl = input.find('\n');
  const std::string line(input.substr(
      kTag.size(), nl == std::string_view::npos ? std::string_view::npos : nl - kTag.size()));
  const std::string_view rest = nl == std::string_view::npos ? "" : input.substr(nl + 1);
  ScaleKind kind = ScaleKind::kNone;
  if (line.starts_with("text ")) kind = ScaleKind::kText;
  if (line.starts_with("mtree ")) kind = ScaleKind::kMtree;
  if (kind == ScaleKind::kNone) return kind;
  size_t n = std::strtoull(line.c_str() + line.find(' ') + 1, nullptr, 10);
  if (n > kMaxScaleRanges) n = kMaxScaleRanges;
  constexpr unsigned long long kBase = 0x100000000ull;
  out->clear();
  out->reserve(n * 64 + rest.size() + 128);
  char buf[128];
  if (kind == ScaleKind::kMtree) {
    out->append("FlatView #0\n AS \"memory\", root: system\n Root memory region: system\n");
  }
  for (size_t i = 0; i < n; ++i) {
    const unsigned long long b = kBase + 0x1000ull * i;
    if (kind == ScaleKind::kText) {
      std::snprintf(buf, sizeof buf, "dev%zu x mmio 0x%llx 0x1000\n", i, b);
    } else {
      std::snprintf(buf, sizeof buf, "  %016llx-%016llx (prio 0, i/o): r%zu\n", b, b + 0xfff, i);
    }
    out->append(buf);
  }
  out->append(rest);
  return kind;
}

}  // namespace exitscope::fuzz
