// recorder/exit_codec.h: the exit records of a version-3 dump (docs/dump-format.md, "Exit
// records"). A vCPU's exits repeat a few accesses (a doorbell, a status register, a port), so
// each record names its access as one of the vCPU's last 8 distinct ones, or codes it against
// the last one, and its start against the previous record's: a tag byte and two small
// numbers, instead of 60 bytes. Shared by the writer (dump_writer.cc, dump_stream.cc) and the
// reader (dump_reader_sections.cc). Not public API.
//
// The access of an exit: addr, device, reg, reg_element, reg_delta, map, kind, size,
// direction, flags (everything but start, duration, value and vCPU). Each vCPU keeps a history
// of 8 accesses, most recent first, all initially that of DumpExit{} (addr 0, no device,
// register or map, kind 0, size 0, direction none, flags 0). Record:
//   u8 tag: bits 0-3 the fields below, bits 4-6 a position P in the history, bit 7 reserved (0)
//   varint zigzag(start_ns - previous record's start_ns), varint duration_ns, then
//   [tag & kTagAddr]  varint zigzag(addr - A.addr)
//   [tag & kTagValue] varint value                          (absent: 0)
//   [tag & kTagWhere] varint device + 1, varint reg + 1, varint reg_element, varint reg_delta,
//                     varint map + 1   (u32 arithmetic: 0xffffffff, "none", is coded 0)
//   [tag & kTagShape] u8 kind, u8 size, u8 direction, u8 flags
// where A is the access at position P, and a field that is absent is A's. If the tag has none
// of kTagAddr, kTagWhere, kTagShape, the access is A and moves to the front of the history;
// else the access (A with those fields replaced) takes the place of the history's last one,
// at the front. Differences wrap modulo 2^64 (the first record's start is coded against 0).
// Varints are LEB128: 7 bits a byte, low first, at most 10 bytes; a u32 field's varint must be
// below 2^32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "exitscope/dump.h"

namespace exitscope::internal {

enum ExitTag : uint8_t {
  kTagAddr = 1u << 0,
  kTagValue = 1u << 1,
  kTagWhere = 1u << 2,
  kTagShape = 1u << 3,
  kTagAccess = kTagAddr | kTagWhere | kTagShape,  // a new access
  kTagPosShift = 4,                               // bits 4-6: the history position
  kTagReserved = 0x80,                            // a reader refuses it
};
// The longest record: tag, 4 u64 varints, 5 u32 varints, 4 bytes.
constexpr size_t kMaxCodedExit = 1 + 4 * 10 + 5 * 5 + 4;
// The shortest: tag and two one-byte varints.
constexpr size_t kMinCodedExit = 3;

// The access of an exit, and a vCPU's 8 most recent distinct ones.
struct ExitAccess {
  uint64_t addr = 0;
  uint32_t device = kUnassigned, reg = kNoRegister, reg_element = 0, reg_delta = 0;
  uint32_t map = kNoRegister;
  uint8_t kind = 0, size = 0, dir = 0, flags = 0;

  static ExitAccess Of(const DumpExit& e) noexcept {
    ExitAccess a;
    a.addr = e.addr;
    a.device = e.device;
    a.reg = e.reg;
    a.reg_element = e.reg_element;
    a.reg_delta = e.reg_delta;
    a.map = e.map;
    a.kind = static_cast<uint8_t>(e.kind);
    a.size = e.size;
    a.dir = static_cast<uint8_t>(e.dir);
    a.flags = e.flags;
    return a;
  }
  // Whether `e` has this access. Compared as words (DumpExit's device..reg_delta and
  // kind..flags lie in the same order as here): the coder compares every record with up to
  // 8 accesses, and straight from the DumpExit (no ExitAccess built first).
  bool Is(const DumpExit& e) const noexcept {
    return addr == e.addr && SameWhere(e) && SameShape(e);
  }
  bool SameWhere(const DumpExit& e) const noexcept {
    uint64_t a0, a1, b0, b1;
    std::memcpy(&a0, &device, 8);
    std::memcpy(&a1, &reg_element, 8);
    std::memcpy(&b0, &e.device, 8);
    std::memcpy(&b1, &e.reg_element, 8);
    return ((a0 ^ b0) | (a1 ^ b1) | (map ^ e.map)) == 0;
  }
  bool SameShape(const DumpExit& e) const noexcept {
    uint32_t a, b;
    std::memcpy(&a, &kind, 4);
    std::memcpy(&b, &e.kind, 4);
    return a == b;
  }
  bool operator==(const ExitAccess&) const noexcept = default;
};
static_assert(sizeof(ExitAccess) == 32);
static_assert(offsetof(ExitAccess, reg) == offsetof(ExitAccess, device) + 4 &&
              offsetof(ExitAccess, reg_element) == offsetof(ExitAccess, device) + 8 &&
              offsetof(ExitAccess, reg_delta) == offsetof(ExitAccess, device) + 12);
static_assert(offsetof(DumpExit, reg) == offsetof(DumpExit, device) + 4 &&
              offsetof(DumpExit, reg_element) == offsetof(DumpExit, device) + 8 &&
              offsetof(DumpExit, reg_delta) == offsetof(DumpExit, device) + 12);
static_assert(offsetof(ExitAccess, flags) == offsetof(ExitAccess, kind) + 3 &&
              offsetof(ExitAccess, size) == offsetof(ExitAccess, kind) + 1 &&
              offsetof(ExitAccess, dir) == offsetof(ExitAccess, kind) + 2);
static_assert(offsetof(DumpExit, flags) == offsetof(DumpExit, kind) + 3 &&
              offsetof(DumpExit, size) == offsetof(DumpExit, kind) + 1 &&
              offsetof(DumpExit, dir) == offsetof(DumpExit, kind) + 2 && sizeof(ExitKind) == 1 &&
              sizeof(AccessDir) == 1);

class AccessHistory {
 public:
  static constexpr int kSize = 8;
  // The position of `e`'s access (the lowest, if it is there twice: only the initial ones
  // can be), or -1.
  int Find(const DumpExit& e) const noexcept {
    for (int p = 0; p < kSize; ++p) {
      if (at(p).Is(e)) return p;
    }
    return -1;
  }
  const ExitAccess& at(int pos) const noexcept { return slot_[Id(pos)]; }
  // The access at `pos` becomes the most recent.
  void Touch(int pos) noexcept {
    const uint64_t id = Id(pos);
    const uint64_t below = pos == 0 ? 0 : order_ & (~0ull >> (64 - 8 * pos));
    const uint64_t above = pos == kSize - 1 ? 0 : order_ & (~0ull << (8 * (pos + 1)));
    order_ = above | (below << 8) | id;
  }
  // `a` replaces the least recent access and becomes the most recent.
  void Insert(const ExitAccess& a) noexcept {
    slot_[Id(kSize - 1)] = a;
    Touch(kSize - 1);
  }

 private:
  unsigned Id(int pos) const noexcept { return (order_ >> (8 * pos)) & 0xff; }
  ExitAccess slot_[kSize];
  uint64_t order_ = 0x0706050403020100ull;  // byte p: the slot at position p
};

inline char* PutVarint(char* p, uint64_t v) noexcept {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}
inline uint64_t Zigzag(uint64_t diff) noexcept {
  return (diff << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(diff) >> 63);
}
inline uint64_t Unzigzag(uint64_t z) noexcept {
  return (z >> 1) ^ (0 - (z & 1));
}

// Codes one vCPU's records, oldest first. `e` must already have its value dropped when the
// dump holds no guest data (value 0, kExitFlagValue clear): the codec stores what it is given.
class ExitEncoder {
 public:
  void NextVcpu() noexcept {
    start_ = 0;
    hist_ = AccessHistory();
  }
  // Writes at most kMaxCodedExit bytes at `p`; returns the end.
  char* Put(const DumpExit& e, char* p) noexcept {
    char* tag = p++;
    uint8_t t = 0;
    p = PutVarint(p, Zigzag(e.start_ns - start_));
    start_ = e.start_ns;
    p = PutVarint(p, e.duration_ns);
    const int pos = hist_.Find(e);
    const ExitAccess& base = hist_.at(0);
    if (pos < 0 && e.addr != base.addr) {
      t |= kTagAddr;
      p = PutVarint(p, Zigzag(e.addr - base.addr));
    }
    if (e.value != 0) {
      t |= kTagValue;
      p = PutVarint(p, e.value);
    }
    if (pos < 0 && !base.SameWhere(e)) {
      t |= kTagWhere;
      p = PutVarint(p, static_cast<uint32_t>(e.device + 1));
      p = PutVarint(p, static_cast<uint32_t>(e.reg + 1));
      p = PutVarint(p, e.reg_element);
      p = PutVarint(p, e.reg_delta);
      p = PutVarint(p, static_cast<uint32_t>(e.map + 1));
    }
    if (pos < 0 && !base.SameShape(e)) {
      t |= kTagShape;
      *p++ = static_cast<char>(e.kind);
      *p++ = static_cast<char>(e.size);
      *p++ = static_cast<char>(e.dir);
      *p++ = static_cast<char>(e.flags);
    }
    if (pos < 0) {
      hist_.Insert(ExitAccess::Of(e));  // position 0 in the tag
    } else {
      t |= static_cast<uint8_t>(pos << kTagPosShift);
      hist_.Touch(pos);
    }
    *tag = static_cast<char>(t);
    return p;
  }

 private:
  uint64_t start_ = 0;
  AccessHistory hist_;
};

// Decodes one vCPU's records from [p, end). Get returns false, with a reason in why(), on a
// record that runs past the end, a varint of more than 64 bits, a u32 field of 2^32 or more,
// or the reserved tag bit; *p then points at the record's first byte. Raw kind and direction
// values are stored as they are (the caller checks them).
class ExitDecoder {
 public:
  void NextVcpu() noexcept {
    start_ = 0;
    hist_ = AccessHistory();
  }
  bool Get(const char** p, const char* end, uint32_t vcpu, DumpExit* e) noexcept {
    const char* q = *p;
    if (q == end) return Bad("the record's tag is past the end");
    const uint8_t t = static_cast<uint8_t>(*q++);
    if ((t & kTagReserved) != 0) return Bad("tag has the reserved bit set");
    const int pos = (t >> kTagPosShift) & 7;
    uint64_t v, start, duration, value = 0;
    if (!Varint(&q, end, &v)) return false;
    start = start_ + Unzigzag(v);
    if (!Varint(&q, end, &duration)) return false;
    ExitAccess a = hist_.at(pos);
    if ((t & kTagAddr) != 0) {
      if (!Varint(&q, end, &v)) return false;
      a.addr += Unzigzag(v);
    }
    if ((t & kTagValue) != 0 && !Varint(&q, end, &value)) return false;
    if ((t & kTagWhere) != 0) {
      uint32_t w[5];
      for (uint32_t& f : w) {
        if (!Varint(&q, end, &v)) return false;
        if (v > 0xffffffffu) return Bad("a device or register field is 2^32 or more");
        f = static_cast<uint32_t>(v);
      }
      a.device = w[0] - 1;
      a.reg = w[1] - 1;
      a.reg_element = w[2];
      a.reg_delta = w[3];
      a.map = w[4] - 1;
    }
    if ((t & kTagShape) != 0) {
      if (end - q < 4) return Bad("the record's kind, size, direction and flags are past the end");
      a.kind = static_cast<uint8_t>(q[0]);
      a.size = static_cast<uint8_t>(q[1]);
      a.dir = static_cast<uint8_t>(q[2]);
      a.flags = static_cast<uint8_t>(q[3]);
      q += 4;
    }
    if ((t & kTagAccess) != 0) {
      hist_.Insert(a);
    } else {
      hist_.Touch(pos);
    }
    start_ = start;
    e->start_ns = start;
    e->duration_ns = duration;
    e->addr = a.addr;
    e->value = value;
    e->vcpu = vcpu;
    e->device = a.device;
    e->reg = a.reg;
    e->reg_element = a.reg_element;
    e->reg_delta = a.reg_delta;
    e->kind = static_cast<ExitKind>(a.kind);
    e->size = a.size;
    e->dir = static_cast<AccessDir>(a.dir);
    e->flags = a.flags;
    e->map = a.map;
    *p = q;
    return true;
  }
  const char* why() const noexcept { return why_; }

 private:
  bool Bad(const char* why) noexcept {
    why_ = why;
    return false;
  }
  bool Varint(const char** p, const char* end, uint64_t* out) noexcept {
    const char* q = *p;
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (q == end) return Bad("a number runs past the end");
      const uint8_t b = static_cast<uint8_t>(*q++);
      // The 10th byte holds bit 63 only, and ends the number.
      if (shift == 63 && b > 1) return Bad("a number is longer than 64 bits");
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *out = v;
        *p = q;
        return true;
      }
    }
  }
  uint64_t start_ = 0;
  AccessHistory hist_;
  const char* why_ = "";
};

}  // namespace exitscope::internal
