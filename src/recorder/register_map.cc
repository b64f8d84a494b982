// RegisterMap: validation, the text format parser, resolution and formatting.
#include "exitscope/register_map.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "base/file_read.h"
#include "base/text.h"
#include "recorder/builtin_maps.h"

namespace exitscope {
namespace {

using base::Hex;

constexpr uint64_t kMaxOffset = 1ull << 48;

bool ValidName(std::string_view n, bool array) {
  if (n.empty() || n.size() > 63) return false;
  for (char c : n) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-' || c == '{' || c == '}';
    if (!ok) return false;
  }
  const size_t p = n.find("{}");
  const size_t braces = static_cast<size_t>(std::count(n.begin(), n.end(), '{') +
                                            std::count(n.begin(), n.end(), '}'));
  if (array) return p != std::string_view::npos && braces == 2;
  return braces == 0;
}

// Does some element of `a` share a byte with some element of `b`?
bool ElementsOverlap(const RegisterDef& a, const RegisterDef& b) {
  if (a.end() <= b.offset || b.end() <= a.offset) return false;
  if (a.count > 1 && b.count > 1 && a.stride == b.stride) {
    // Same stride: the layout repeats every stride, so compare residues (O(1); NVMe has two
    // 65536-element doorbell arrays).
    const RegisterDef& lo = a.offset <= b.offset ? a : b;
    const RegisterDef& hi = a.offset <= b.offset ? b : a;
    const uint64_t rel = (hi.offset - lo.offset) % lo.stride;
    return rel < lo.width || lo.stride - rel < hi.width;
  }
  const RegisterDef& small = a.count <= b.count ? a : b;
  const RegisterDef& big = a.count <= b.count ? b : a;
  for (uint32_t i = 0; i < small.count; ++i) {
    const uint64_t s = small.offset + (small.count > 1 ? i * small.stride : 0);
    const uint64_t e = s + small.width;  // [s, e)
    if (e <= big.offset || s >= big.end()) continue;
    if (big.count <= 1) return true;
    // Elements of `big` intersecting [s, e): those starting in (s - width, e).
    const uint64_t lo = s + 1 > big.offset + big.width ? (s + 1 - big.width - big.offset) : 0;
    uint64_t k = (lo + big.stride - 1) / big.stride;
    for (; k < big.count; ++k) {
      const uint64_t bs = big.offset + k * big.stride;
      if (bs >= e) break;
      if (bs + big.width > s) return true;
    }
  }
  return false;
}

bool ParseU64(std::string_view s, uint64_t* out) {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, base);
  return ec == std::errc() && p == s.data() + s.size();
}

std::vector<std::string_view> Tokens(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i >= line.size()) break;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

std::string_view ToString(RegAccess a) noexcept {
  switch (a) {
    case RegAccess::kRead:
      return "R";
    case RegAccess::kWrite:
      return "W";
    default:
      return "RW";
  }
}

std::string RegisterDef::ElementName(uint32_t i) const {
  const size_t p = name.find("{}");
  if (p == std::string::npos) return name;
  return name.substr(0, p) + std::to_string(i) + name.substr(p + 2);
}

Result<RegisterMap> RegisterMap::Create(std::string name, std::vector<RegisterDef> defs) {
  if (!ValidName(name, false)) {
    return Fail(ErrorCode::kInvalidArgument, "register map name '" + name + "' is not valid");
  }
  for (RegisterDef& d : defs) {
    const bool array = d.count > 1 || d.name.find('{') != std::string::npos;
    if (!ValidName(d.name, array)) {
      return Fail(ErrorCode::kInvalidArgument,
                  "register name '" + d.name + "' is not valid" +
                      (array ? " (an array needs exactly one \"{}\" for the index)"
                             : " (letters, digits, _ . - only)"));
    }
    if (d.width != 1 && d.width != 2 && d.width != 4 && d.width != 8) {
      return Fail(
          ErrorCode::kInvalidArgument,
          "register " + d.name + ": width " + std::to_string(d.width) + " is not 1, 2, 4 or 8");
    }
    if (static_cast<uint8_t>(d.access) < 1 || static_cast<uint8_t>(d.access) > 3) {
      return Fail(ErrorCode::kInvalidArgument, "register " + d.name + ": bad access mode");
    }
    if (d.count == 0) {
      return Fail(ErrorCode::kInvalidArgument, "register " + d.name + ": count must be >= 1");
    }
    if (array && d.count == 1 && d.stride == 0) d.stride = d.width;
    if (d.count > 1 && d.stride < d.width) {
      return Fail(ErrorCode::kInvalidArgument,
                  "register " + d.name + ": stride " + std::to_string(d.stride) +
                      " is smaller than width " + std::to_string(d.width));
    }
    if (d.count <= 1) {
      if (!array) d.stride = 0;
      d.count = 1;
    }
    if (d.offset >= kMaxOffset || d.stride >= kMaxOffset || d.count > (1u << 20) ||
        d.end() > kMaxOffset) {
      return Fail(ErrorCode::kInvalidArgument, "register " + d.name + ": offset " +
                                                   base::Hex(d.offset) + " or extent out of range");
    }
  }
  std::stable_sort(defs.begin(), defs.end(),
                   [](const RegisterDef& a, const RegisterDef& b) { return a.offset < b.offset; });
  // Overlap check: defs sorted by offset; compare each with the later ones starting before its end.
  for (size_t i = 0; i < defs.size(); ++i) {
    for (size_t j = i + 1; j < defs.size() && defs[j].offset < defs[i].end(); ++j) {
      const RegisterDef& a = defs[i];
      const RegisterDef& b = defs[j];
      if (a.name == b.name) {
        return Fail(ErrorCode::kInvalidArgument, "register " + a.name + " is defined twice");
      }
      if (a.alias || b.alias) continue;
      const auto aa = static_cast<uint8_t>(a.access), ba = static_cast<uint8_t>(b.access);
      if ((aa & ba) == 0) continue;
      if (ElementsOverlap(a, b)) {
        return Fail(ErrorCode::kInvalidArgument,
                    "register " + b.name + " at " + base::Hex(b.offset) + " overlaps " + a.name +
                        " at " + base::Hex(a.offset) +
                        " with the same access direction (mark one `alias` if intended)");
      }
    }
  }
  for (size_t i = 0; i < defs.size(); ++i) {
    for (size_t j = i + 1; j < defs.size(); ++j) {
      if (defs[i].name == defs[j].name) {
        return Fail(ErrorCode::kInvalidArgument, "register " + defs[i].name + " is defined twice");
      }
    }
  }
  RegisterMap m;
  m.name_ = std::move(name);
  m.defs_ = std::move(defs);
  m.max_end_upto_.resize(m.defs_.size());
  m.hot_.resize(m.defs_.size());
  uint64_t mx = 0;
  for (size_t i = 0; i < m.defs_.size(); ++i) {
    const RegisterDef& d = m.defs_[i];
    mx = std::max(mx, d.end());
    m.max_end_upto_[i] = mx;
    Hot& h = m.hot_[i];
    h.offset = d.offset;
    h.end = d.end();
    h.stride = d.count > 1 ? d.stride : 0;
    h.count = d.count;
    h.width = static_cast<uint8_t>(d.width);
    h.access = static_cast<uint8_t>(d.access);
    h.alias = d.alias ? 1 : 0;
    h.stride_shift = 0xff;
    if (h.stride != 0 && (h.stride & (h.stride - 1)) == 0) {
      h.stride_shift = static_cast<uint8_t>(__builtin_ctzll(h.stride));
    }
  }
  m.BuildTables();
  return m;
}

Result<RegisterMap> RegisterMap::Parse(std::string_view text, std::string_view origin) {
  std::string map_name;
  std::vector<RegisterDef> defs;
  std::vector<int> def_lines;
  int lineno = 0;
  auto err = [&](const std::string& why) {
    return Fail(ErrorCode::kInvalidArgument,
                std::string(origin) + ":" + std::to_string(lineno) + ": " + why);
  };
  base::LineSplitter lines(text);
  for (std::string_view line; lines.Next(&line);) {
    lineno = static_cast<int>(lines.number());
    if (const size_t hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    for (char c : line) {
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t')
        return err("control character in line");
    }
    std::vector<std::string_view> t = Tokens(line);
    if (t.empty()) continue;
    if (t[0] == "map") {
      if (!map_name.empty()) return err("second 'map' directive");
      if (t.size() != 2) return err("expected 'map NAME'");
      map_name = std::string(t[1]);
      if (!ValidName(map_name, false)) return err("map name '" + map_name + "' is not valid");
      continue;
    }
    if (t[0] != "reg" && t[0] != "array") {
      return err("unknown directive '" + std::string(t[0]) + "' (expected map, reg or array)");
    }
    if (map_name.empty()) return err("'" + std::string(t[0]) + "' before the 'map NAME' line");
    const bool array = t[0] == "array";
    if (t.size() < 5) {
      return err(array ? "expected 'array NAME{} OFFSET WIDTH ACCESS count=N stride=S [alias] "
                         "[description]'"
                       : "expected 'reg NAME OFFSET WIDTH ACCESS [alias] [description]'");
    }
    RegisterDef d;
    d.name = std::string(t[1]);
    if (!ValidName(d.name, array)) {
      return err("register name '" + d.name + "' is not valid" +
                 (array ? " (an array name needs exactly one \"{}\")" : ""));
    }
    if (!ParseU64(t[2], &d.offset)) return err("bad offset '" + std::string(t[2]) + "'");
    uint64_t w = 0;
    if (!ParseU64(t[3], &w) || (w != 1 && w != 2 && w != 4 && w != 8)) {
      return err("bad width '" + std::string(t[3]) + "' (1, 2, 4 or 8)");
    }
    d.width = static_cast<uint32_t>(w);
    if (t[4] == "R" || t[4] == "RO") {
      d.access = RegAccess::kRead;
    } else if (t[4] == "W" || t[4] == "WO") {
      d.access = RegAccess::kWrite;
    } else if (t[4] == "RW") {
      d.access = RegAccess::kReadWrite;
    } else {
      return err("bad access '" + std::string(t[4]) + "' (R, W or RW)");
    }
    size_t i = 5;
    bool have_count = false, have_stride = false;
    for (; i < t.size(); ++i) {
      if (t[i] == "alias") {
        d.alias = true;
      } else if (t[i].rfind("count=", 0) == 0) {
        uint64_t v = 0;
        if (!array) return err("count= on a plain register (use 'array')");
        if (!ParseU64(t[i].substr(6), &v) || v == 0 || v > (1u << 20)) {
          return err("bad count '" + std::string(t[i].substr(6)) + "' (1..1048576)");
        }
        d.count = static_cast<uint32_t>(v);
        have_count = true;
      } else if (t[i].rfind("stride=", 0) == 0) {
        uint64_t v = 0;
        if (!array) return err("stride= on a plain register (use 'array')");
        if (!ParseU64(t[i].substr(7), &v) || v == 0) {
          return err("bad stride '" + std::string(t[i].substr(7)) + "'");
        }
        d.stride = v;
        have_stride = true;
      } else {
        break;
      }
    }
    if (array && (!have_count || !have_stride)) return err("array needs count=N and stride=S");
    for (size_t k = i; k < t.size(); ++k) {
      if (!d.description.empty()) d.description += ' ';
      d.description += t[k];
    }
    defs.push_back(std::move(d));
    def_lines.push_back(lineno);
  }
  if (map_name.empty()) {  // named at the last line read (line 1 of an empty file)
    return Fail(
        ErrorCode::kInvalidArgument,
        std::string(origin) + ":" + std::to_string(std::max(lineno, 1)) + ": no 'map NAME' line");
  }
  // Names of defs -> lines, to point whole-map errors at a line.
  std::map<std::string, int> line_of;
  for (size_t k = 0; k < defs.size(); ++k) line_of.emplace(defs[k].name, def_lines[k]);
  auto m = Create(map_name, defs);
  if (!m) {
    // Find the line: the last register named in the message that we know.
    int best = 0;
    size_t best_pos = std::string::npos;
    for (const auto& [n, l] : line_of) {
      size_t p = m.error().message.find("register " + n + " ");
      if (p == std::string::npos) p = m.error().message.find("register " + n + ":");
      if (p != std::string::npos && p < best_pos) {
        best_pos = p;
        best = l;
      }
    }
    if (best == 0) best = lineno;
    return Fail(ErrorCode::kInvalidArgument,
                std::string(origin) + ":" + std::to_string(best) + ": " + m.error().message);
  }
  return m;
}

Result<RegisterMap> RegisterMap::Load(const std::string& path) {
  constexpr uint64_t kMaxBytes = 16u << 20;  // checked before reading, and while reading
  auto text = base::ReadBoundedFile(path, kMaxBytes, "register map", ErrorCode::kInvalidArgument);
  if (!text) return Propagate(text);
  return Parse(*text, path);
}

std::vector<std::string> RegisterMap::BuiltinNames() {
  std::vector<std::string> out;
  for (size_t i = 0; i < internal::kBuiltinMapCount; ++i) {
    out.emplace_back(internal::kBuiltinMaps[i].name);
  }
  return out;
}

std::string_view RegisterMap::BuiltinText(std::string_view name) noexcept {
  for (size_t i = 0; i < internal::kBuiltinMapCount; ++i) {
    if (internal::kBuiltinMaps[i].name == name) return internal::kBuiltinMaps[i].text;
  }
  return {};
}

Result<std::shared_ptr<const RegisterMap>> RegisterMap::Builtin(std::string_view name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const RegisterMap>, std::less<>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  const std::string_view text = BuiltinText(name);
  if (text.empty()) {
    std::string known;
    for (const std::string& n : BuiltinNames()) known += (known.empty() ? "" : ", ") + n;
    return Fail(ErrorCode::kNotFound,
                "no builtin register map '" + std::string(name) + "' (known: " + known + ")");
  }
  auto m = Parse(text, "builtin:" + std::string(name) + ".map");
  if (!m) return Propagate(m);
  auto p = std::make_shared<const RegisterMap>(std::move(*m));
  cache.emplace(std::string(name), p);
  return p;
}

RegisterHit RegisterMap::ResolveBySearch(uint64_t offset, uint32_t size,
                                         AccessDir dir) const noexcept {
  (void)size;
  RegisterHit best;
  const size_t n = hot_.size();
  const Hot* h = hot_.data();
  if (n == 0 || offset < h[0].offset) return best;
  // Last def with offset <= `offset` (branch-light).
  size_t lo = 0, len = n;
  while (len > 1) {
    const size_t half = len / 2;
    lo = (h[lo + half].offset <= offset) ? lo + half : lo;
    len -= half;
  }
  const uint8_t want = dir == AccessDir::kRead ? 1 : dir == AccessDir::kWrite ? 2 : 3;
  int best_score = -1;
  for (size_t j = lo + 1; j-- > 0;) {
    if (max_end_upto_[j] <= offset) break;
    const Hot& d = h[j];
    if (offset >= d.end) continue;
    uint64_t delta = offset - d.offset;
    uint32_t element = 0;
    if (d.stride != 0) {
      if (d.stride_shift != 0xff) {
        element = static_cast<uint32_t>(delta >> d.stride_shift);
        delta &= d.stride - 1;
      } else {
        element = static_cast<uint32_t>(delta / d.stride);
        delta %= d.stride;
      }
    }
    if (delta >= d.width) continue;
    const int score = ((d.access & want) != 0 ? 2 : 0) + (d.alias ? 0 : 1);
    if (score >= best_score) {  // scanning backwards: ">=" keeps the earliest on ties
      best_score = score;
      best.reg = static_cast<uint32_t>(j);
      best.element = element;
      best.delta = static_cast<uint32_t>(delta);
    }
  }
  return best;
}

void RegisterMap::BuildTables() {
  constexpr uint64_t kDenseMax = 4096;
  constexpr AccessDir kDirs[3] = {AccessDir::kNone, AccessDir::kRead, AccessDir::kWrite};
  if (hot_.empty() || hot_.size() >= 0xffff) return;
  dense_end_ = std::min<uint64_t>(max_end_upto_.back(), kDenseMax);
  // Same rule as ResolveBySearch: highest score wins, the lowest index on ties (definitions
  // are visited in index order and only a strictly better score replaces).
  constexpr uint8_t kWant[3] = {3, 1, 2};
  std::vector<int8_t> best[3];
  for (int dc = 0; dc < 3; ++dc) {
    dense_[dc].assign(dense_end_, 0);
    best[dc].assign(dense_end_, -1);
  }
  for (size_t j = 0; j < hot_.size(); ++j) {
    const Hot& d = hot_[j];
    for (uint32_t e = 0; e < d.count; ++e) {
      const uint64_t start = d.offset + e * d.stride;
      if (start >= dense_end_) break;
      for (uint64_t o = start; o < start + d.width && o < dense_end_; ++o) {
        for (int dc = 0; dc < 3; ++dc) {
          const int8_t score =
              static_cast<int8_t>(((d.access & kWant[dc]) != 0 ? 2 : 0) + (d.alias ? 0 : 1));
          if (score > best[dc][o]) {
            best[dc][o] = score;
            dense_[dc][o] = static_cast<uint16_t>(j + 1);
          }
        }
      }
      if (d.stride == 0) break;
    }
  }
  // Periodic region: every definition reaching past the dense part is an array with the same
  // power-of-two stride S and count C, all starting within one stride of the first.
  uint64_t base = ~0ull, stride = 0;
  uint32_t count = 0;
  for (const Hot& d : hot_) {
    if (d.end <= dense_end_) continue;
    if (d.stride == 0 || d.stride_shift == 0xff) return;
    if (stride == 0) {
      stride = d.stride;
      count = d.count;
    } else if (d.stride != stride || d.count != count) {
      return;
    }
    base = std::min(base, d.offset);
  }
  if (stride == 0 || count < 3 || base < dense_end_ || stride > 4096) return;
  for (const Hot& d : hot_) {
    if (d.end > dense_end_ && d.offset >= base + stride) return;
  }
  period_base_ = base;
  period_mask_ = stride - 1;
  period_first_ = base + stride;               // element 0 may be partial: searched
  period_last_ = base + (count - 1) * stride;  // so is the last element
  for (int dc = 0; dc < 3; ++dc) {
    period_[dc].assign(stride, 0);
    for (uint64_t r = 0; r < stride; ++r) {
      const RegisterHit h = ResolveBySearch(period_first_ + r, 0, kDirs[dc]);
      if (h.found()) period_[dc][r] = static_cast<uint16_t>(h.reg + 1);
    }
  }
}

std::string RegisterMap::Format(const RegisterHit& hit, uint32_t size) const {
  if (!hit.found() || hit.reg >= defs_.size()) return {};
  const RegisterDef& d = defs_[hit.reg];
  std::string s = d.ElementName(hit.element);
  if (hit.delta != 0 || (size != 0 && size != d.width)) s += "+" + std::to_string(hit.delta);
  return s;
}

std::string RegisterMap::ToText() const {
  std::ostringstream o;
  o << "map " << name_ << "\n";
  for (const RegisterDef& d : defs_) {
    o << (d.count > 1 || d.name.find("{}") != std::string::npos ? "array " : "reg ") << d.name
      << " " << base::Hex(d.offset) << " " << d.width << " " << ToString(d.access);
    if (d.count > 1 || d.name.find("{}") != std::string::npos) {
      o << " count=" << d.count << " stride=" << base::Hex(d.stride);
    }
    if (d.alias) o << " alias";
    if (!d.description.empty()) o << " " << d.description;
    o << "\n";
  }
  return o.str();
}

std::string FormatRegister(const RegisterMap* map, const RegisterHit& hit, uint32_t size) {
  return map == nullptr ? std::string() : map->Format(hit, size);
}

}  // namespace exitscope
