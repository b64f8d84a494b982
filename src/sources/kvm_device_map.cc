#include "sources/kvm_device_map.h"

#include <charconv>
#include <vector>

#include <fmt/format.h>

#include "base/file_read.h"
#include "base/text.h"
#include "exitscope/dump.h"
#include "exitscope/register_map.h"
#include "sources/input_format.h"
#include "sources/qemu_mtree.h"

namespace exitscope::sources {
namespace {

bool ParseNumber(std::string_view s, uint64_t* v) {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> w;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i >= line.size() || line[i] == '#') break;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    w.push_back(line.substr(i, j - i));
    i = j;
  }
  return w;
}

}  // namespace

Result<std::unique_ptr<KvmDeviceMap>> KvmDeviceMap::Parse(std::string_view text,
                                                          std::string_view origin,
                                                          const std::string& base_dir) {
  if (LooksLikeQemuMtreeFlat(text)) return FromQemuMtree(text, origin);
  if (LooksLikeQemuMtreeTree(text)) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: this is QEMU's `info mtree` without -f: a device map needs the "
                            "flat view, `info mtree -f`",
                            origin));
  }
  std::unique_ptr<KvmDeviceMap> m(new KvmDeviceMap());
  // One batch, one table: a map of n lines costs O(n log n) time and O(n) memory.
  AddressSpace::Batch batch = m->space_->BeginBatch();
  base::LineSplitter lines(text);
  for (std::string_view line; lines.Next(&line);) {
    const size_t line_no = lines.number();
    const std::vector<std::string_view> w = Words(line);
    if (w.empty()) continue;
    const auto fail = [&](const std::string& why) {
      return Fail(ErrorCode::kInvalidArgument, fmt::format("{}:{}: {}", origin, line_no, why));
    };
    if (w.size() < 5 || w.size() > 6) {
      return fail("expected `name kind mmio|pio base length [regmap]`");
    }
    IoSpace space;
    if (w[2] == "mmio")
      space = IoSpace::kMmio;
    else if (w[2] == "pio")
      space = IoSpace::kPio;
    else
      return fail(fmt::format("space must be mmio or pio, not '{}'", w[2]));
    uint64_t base = 0, length = 0;
    if (!ParseNumber(w[3], &base)) return fail(fmt::format("bad base '{}'", w[3]));
    if (!ParseNumber(w[4], &length) || length == 0) {
      return fail(fmt::format("bad length '{}'", w[4]));
    }
    std::shared_ptr<const RegisterMap> map;
    if (w.size() == 6) {
      auto builtin = RegisterMap::Builtin(w[5]);
      if (builtin) {
        map = *builtin;
      } else {
        std::string path(w[5]);
        if (!path.empty() && path[0] != '/') path = base_dir + "/" + path;
        auto loaded = RegisterMap::Load(path);
        if (!loaded) {
          return fail(
              fmt::format("regmap '{}' is no builtin map and: {}", w[5], loaded.error().message));
        }
        map = std::make_shared<const RegisterMap>(std::move(*loaded));
      }
    }
    uint32_t dev = 0;
    if (auto found = batch.FindDevice(w[0]); found) {
      dev = *found;
    } else {
      auto added = batch.AddDevice({.name = std::string(w[0]), .kind = std::string(w[1])});
      if (!added) return fail(added.error().message);
      dev = *added;
    }
    if (Status s = batch.AddRange(space, base, length, dev, std::move(map)); !s) {
      return fail(s.error().message);
    }
  }
  EXITSCOPE_RETURN_IF_ERROR(m->space_->Commit(std::move(batch)));
  for (const DeviceInfo& d : m->space_->Devices()) m->names_.push_back(d.name);
  return m;
}

Result<std::unique_ptr<KvmDeviceMap>> KvmDeviceMap::LoadText(const std::string& path) {
  auto text =
      base::ReadBoundedFile(path, kMaxDeviceMapBytes, "device map", ErrorCode::kInvalidArgument);
  if (!text) return Propagate(text);
  const size_t slash = path.rfind('/');
  return Parse(*text, path, slash == std::string::npos ? "." : path.substr(0, slash));
}

Result<std::unique_ptr<KvmDeviceMap>> KvmDeviceMap::LoadDump(const std::string& path) {
  auto dump = ReadDump(path);
  if (!dump) return Propagate(dump);
  std::unique_ptr<KvmDeviceMap> m(new KvmDeviceMap());
  AddressSpace::Batch batch = m->space_->BeginBatch();
  std::vector<std::shared_ptr<const RegisterMap>> maps;
  for (const RegisterMap& rm : dump->maps) maps.push_back(std::make_shared<const RegisterMap>(rm));
  for (const DeviceInfo& d : dump->devices) {
    auto added = batch.AddDevice({.name = d.name, .kind = d.kind, .id = d.id});
    if (!added) {
      return Fail(ErrorCode::kCorrupt,
                  fmt::format("{}: device '{}': {}", path, d.name, added.error().message));
    }
  }
  for (const DumpRange& r : dump->ranges) {
    std::shared_ptr<const RegisterMap> map;
    if (r.map != kNoRegister && r.map < maps.size()) map = maps[r.map];
    if (Status s = batch.AddRange(r.space, r.base, r.size, r.device, map); !s) {
      return Fail(ErrorCode::kCorrupt, fmt::format("{}: {}", path, s.error().message));
    }
  }
  EXITSCOPE_RETURN_IF_ERROR(m->space_->Commit(std::move(batch)));
  for (const DeviceInfo& d : m->space_->Devices()) m->names_.push_back(d.name);
  return m;
}

Result<std::unique_ptr<KvmDeviceMap>> KvmDeviceMap::Load(const std::string& path) {
  // Either loader checks the file (regular, size limit) before it reads it; a file the sniffer
  // cannot read goes to the text loader, whose message names the path.
  const auto format = SniffInputFile(path);
  const bool dump = format && *format == InputFormat::kDump;
  return dump ? LoadDump(path) : LoadText(path);
}

std::string KvmDeviceMap::ExtraRegisterName(IoSpace space, uint64_t addr, uint32_t size,
                                            AccessDir dir, const Resolution& r) const {
  if (r.map == nullptr || extras_.empty()) return AddressSpace::RegisterName(r, size);
  const auto it = extras_.find({static_cast<uint8_t>(space), addr - r.offset});
  if (it == extras_.end()) return AddressSpace::RegisterName(r, size);
  const uint64_t offset = r.offset + it->second.region_offset;
  if (!it->second.ecam) return FormatRegister(r.map, r.map->Resolve(offset, size, dir), size);
  const std::string reg = FormatRegister(r.map, r.map->Resolve(offset & 0xfff, size, dir), size);
  return reg.empty() ? QemuEcamFunction(offset) : QemuEcamFunction(offset) + "." + reg;
}

bool KvmDeviceMap::Resolve(SubKeyKind kind, uint64_t addr, uint32_t size, AccessDir dir,
                           std::string_view* device, std::string_view* reg) const {
  const IoSpace space = kind == SubKeyKind::kPort ? IoSpace::kPio : IoSpace::kMmio;
  const Key key{addr, size, static_cast<uint8_t>(space), static_cast<uint8_t>(dir)};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    Entry e;
    const Resolution r = space_->Lookup(space, addr, size, dir);
    if (r.assigned() && r.device < names_.size()) {
      e.found = true;
      e.device = names_[r.device];
      std::string name = ExtraRegisterName(space, addr, size, dir, r);
      if (!name.empty()) {
        regs_.push_back(std::move(name));
        e.reg = regs_.back();
      }
    }
    it = cache_.emplace(key, e).first;
  }
  *device = it->second.device;
  *reg = it->second.reg;
  return it->second.found;
}

}  // namespace exitscope::sources
