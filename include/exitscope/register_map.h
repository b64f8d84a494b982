// exitscope/register_map.h: the registers of one device range, by offset.
//
// A RegisterMap names the registers at offsets inside one MMIO or PIO range so that an exit
// can be reported as "nvme0.SQ1TDBL" rather than "0xfebf1008". Registers have a name, offset,
// width in bytes and an access mode; an array (e.g. NVMe doorbells) is one definition with a
// name pattern holding "{}" for the index, a count and a stride.
//
// Resolution rules (Resolve):
//  - the register whose [offset, offset + width) holds the first byte of the access wins;
//  - several registers may share offsets (16550: RBR is read-only and THR write-only at 0).
//    A register whose access mode matches the direction is preferred, then one that is not an
//    alias, then the first in file order. Definitions marked `alias` (16550 DLL/DLM, reached
//    when LCR.DLAB=1, a state the map cannot see) are listed for documentation and chosen only
//    when nothing else covers the offset;
//  - an access that does not start at the register's first byte or has another width is
//    formatted "NAME+delta" (a 2-byte read at CC+2 -> "CC+2"; a 2-byte read at CC -> "CC+0").
//
// Text format (data/regmaps/*.map, docs/recorder.md):
//
//   # comment; blank lines ignored; numbers decimal or 0x-hex
//   map nvme                                  # first directive: the map's name
//   reg CAP   0x00 8 R   Controller Capabilities    # name offset width access [description]
//   reg CC    0x14 4 RW  Controller Configuration
//   array SQ{}TDBL 0x1000 4 W count=1024 stride=8   Submission Queue y Tail Doorbell
//   reg DLL   0x0 1 RW alias  Divisor Latch Low (DLAB=1)
//
// Width is 1, 2, 4 or 8; access R, W or RW. Overlapping definitions are refused unless their
// access modes do not overlap (R vs W) or one is marked alias. Errors name "file:line: reason".
//
// Thread-safety: immutable after construction; share it as std::shared_ptr<const RegisterMap>.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/exit_record.h"
#include "exitscope/export.h"
#include "exitscope/status.h"

namespace exitscope {

enum class RegAccess : uint8_t { kRead = 1, kWrite = 2, kReadWrite = 3 };
// "R", "W", "RW".
std::string_view ToString(RegAccess a) noexcept;

// One register or register array.
struct RegisterDef {
  std::string name{};   // "CC"; for arrays a pattern with "{}", e.g. "SQ{}TDBL"
  uint64_t offset = 0;  // byte offset of (the first element of) the register in the range
  uint32_t width = 4;   // bytes: 1, 2, 4 or 8
  RegAccess access = RegAccess::kReadWrite;
  uint32_t count = 1;   // > 1 for arrays
  uint64_t stride = 0;  // bytes between array elements (>= width); 0 for plain registers
  bool alias = false;   // an alternative view of another register's bytes (see above)
  std::string description{};

  // End of the last element: offset + (count - 1) * stride + width.
  uint64_t end() const noexcept { return offset + (count > 1 ? (count - 1) * stride : 0) + width; }
  // Name of element `i` ("SQ3TDBL"); the plain name for non-arrays.
  std::string ElementName(uint32_t i) const;
};

// Where an access landed inside a register map.
struct RegisterHit {
  uint32_t reg = kNoRegister;  // index into RegisterMap::registers()
  uint32_t element = 0;        // array element
  uint32_t delta = 0;          // byte offset of the access inside that element
  bool found() const noexcept { return reg != kNoRegister; }
};

class EXITSCOPE_EXPORT RegisterMap {
 public:
  // Validates and indexes `defs` (any order). Errors name the offending registers.
  static Result<RegisterMap> Create(std::string name, std::vector<RegisterDef> defs);

  // Parses the text format above. `origin` names the input in errors ("nvme.map:12: ...").
  static Result<RegisterMap> Parse(std::string_view text, std::string_view origin);
  // Reads and parses a file; errors name the path.
  static Result<RegisterMap> Load(const std::string& path);
  // A map shipped with exitscope and compiled into the library: "uart16550", "nvme",
  // "pci-config", "virtio-mmio" (see BuiltinNames()). kNotFound for other names.
  static Result<std::shared_ptr<const RegisterMap>> Builtin(std::string_view name);
  static std::vector<std::string> BuiltinNames();
  // The text of a builtin map (as shipped in data/regmaps/), empty when unknown.
  static std::string_view BuiltinText(std::string_view name) noexcept;

  RegisterMap() = default;

  const std::string& name() const noexcept { return name_; }
  const std::vector<RegisterDef>& registers() const noexcept { return defs_; }

  // Which register holds byte `offset` for an access of `size` bytes in direction `dir`.
  // noexcept, no allocation; O(log n) plus the number of overlapping definitions.
  // Constant time for offsets in the first 4 KiB and inside a periodic register-array region
  // (NVMe doorbells), from tables built at creation; a binary search elsewhere.
  RegisterHit Resolve(uint64_t offset, uint32_t size, AccessDir dir) const noexcept {
    const int dc = dir == AccessDir::kRead ? 1 : dir == AccessDir::kWrite ? 2 : 0;
    if (offset < dense_end_) {
      const uint16_t i = dense_[dc][offset];
      return i == 0 ? RegisterHit{} : HitAt(i - 1u, offset);
    }
    if (offset >= period_first_ && offset < period_last_) {
      const uint16_t i = period_[dc][(offset - period_base_) & period_mask_];
      return i == 0 ? RegisterHit{} : HitAt(i - 1u, offset);
    }
    return ResolveBySearch(offset, size, dir);
  }
  // The reference resolution by binary search over the definitions (what the tables are built
  // from and tested against). Same result as Resolve.
  RegisterHit ResolveBySearch(uint64_t offset, uint32_t size, AccessDir dir) const noexcept;

  // "SQ1TDBL", "CC+2", or "" when !hit.found(). `size` is the access size (0 = unknown: no
  // "+0" suffix for accesses at the register start).
  std::string Format(const RegisterHit& hit, uint32_t size) const;

  // Serialises back to the text format (Parse(ToText()) gives an equal map).
  std::string ToText() const;

 private:
  // The fields Resolve needs, packed (one cache line holds 1.6 registers instead of 0.5).
  struct Hot {
    uint64_t offset;
    uint64_t end;
    uint64_t stride;
    uint32_t count;
    uint8_t width;
    uint8_t access;
    uint8_t alias;
    uint8_t stride_shift;  // log2(stride) when stride is a power of two, else 0xff
  };

  std::string name_;
  std::vector<RegisterDef> defs_;       // sorted by offset, then file order
  std::vector<Hot> hot_;                // parallel to defs_
  std::vector<uint64_t> max_end_upto_;  // max end() over defs_[0..i]

  // Lookup tables, per direction class (0 none, 1 read, 2 write): definition index + 1, 0 = no
  // register. dense_ covers offsets [0, dense_end_); period_ covers one stride of a region where
  // only arrays of one power-of-two stride live, valid for [period_first_, period_last_).
  void BuildTables();
  RegisterHit HitAt(uint32_t def, uint64_t offset) const noexcept {
    const Hot& d = hot_[def];
    RegisterHit hit;
    hit.reg = def;
    uint64_t delta = offset - d.offset;
    if (d.stride != 0) {
      if (d.stride_shift != 0xff) {
        hit.element = static_cast<uint32_t>(delta >> d.stride_shift);
        delta &= d.stride - 1;
      } else {
        hit.element = static_cast<uint32_t>(delta / d.stride);
        delta %= d.stride;
      }
    }
    hit.delta = static_cast<uint32_t>(delta);
    return hit;
  }
  uint64_t dense_end_ = 0;
  std::vector<uint16_t> dense_[3];
  uint64_t period_base_ = 0;
  uint64_t period_first_ = 0;
  uint64_t period_last_ = 0;
  uint64_t period_mask_ = 0;
  std::vector<uint16_t> period_[3];
};

// Formats a register name for a hit in `map` (nullptr map -> ""). Shared by live and dumps.
EXITSCOPE_EXPORT std::string FormatRegister(const RegisterMap* map, const RegisterHit& hit,
                                            uint32_t size);

}  // namespace exitscope
