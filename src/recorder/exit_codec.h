// recorder/exit_codec.h: the exit records of a version-3 dump (docs/dump-format.md, "Exit
// records"): each record is coded against the one before it on the same vCPU, so a run of
// exits at one register costs a tag byte and two small numbers (start and duration deltas)
// instead of 60 bytes. Shared by the writer (dump_writer.cc, dump_stream.cc) and the reader
// (dump_reader.cc). Not public API.
//
// Record: u8 tag, varint zigzag(start_ns - previous start_ns), varint duration_ns, then
//   [tag & kTagAddr]  varint zigzag(addr - previous addr)
//   [tag & kTagValue] varint value
//   [tag & kTagWhere] varint device + 1, varint reg + 1, varint reg_element, varint reg_delta,
//                     varint map + 1   (u32 arithmetic: 0xffffffff, "none", is coded 0)
//   [tag & kTagShape] u8 kind, u8 size, u8 direction, u8 flags
// A bit that is clear means "as the previous record" (value: 0). Differences wrap modulo 2^64.
// The first record of each vCPU is coded against DumpExit{} (start 0, addr 0, no device,
// register or map, kind 0, size 0, direction none, flags 0). Varints are LEB128: 7 bits a
// byte, low first, at most 10 bytes; a u32 field's varint must be below 2^32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exitscope/dump.h"

namespace exitscope::internal {

enum ExitTag : uint8_t {
  kTagAddr = 1u << 0,
  kTagValue = 1u << 1,
  kTagWhere = 1u << 2,
  kTagShape = 1u << 3,
  kTagKnown = 0x0f,  // other bits are reserved: a reader refuses them
};
// The longest record: tag, 4 u64 varints, 5 u32 varints, 4 bytes.
constexpr size_t kMaxCodedExit = 1 + 4 * 10 + 5 * 5 + 4;
// The shortest: tag and two one-byte varints.
constexpr size_t kMinCodedExit = 3;

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
  void NextVcpu() noexcept { prev_ = DumpExit{}; }
  // Writes at most kMaxCodedExit bytes at `p`; returns the end.
  char* Put(const DumpExit& e, char* p) noexcept {
    char* tag = p++;
    uint8_t t = 0;
    p = PutVarint(p, Zigzag(e.start_ns - prev_.start_ns));
    p = PutVarint(p, e.duration_ns);
    if (e.addr != prev_.addr) {
      t |= kTagAddr;
      p = PutVarint(p, Zigzag(e.addr - prev_.addr));
    }
    if (e.value != 0) {
      t |= kTagValue;
      p = PutVarint(p, e.value);
    }
    if (e.device != prev_.device || e.reg != prev_.reg || e.reg_element != prev_.reg_element ||
        e.reg_delta != prev_.reg_delta || e.map != prev_.map) {
      t |= kTagWhere;
      p = PutVarint(p, static_cast<uint32_t>(e.device + 1));
      p = PutVarint(p, static_cast<uint32_t>(e.reg + 1));
      p = PutVarint(p, e.reg_element);
      p = PutVarint(p, e.reg_delta);
      p = PutVarint(p, static_cast<uint32_t>(e.map + 1));
    }
    if (e.kind != prev_.kind || e.size != prev_.size || e.dir != prev_.dir ||
        e.flags != prev_.flags) {
      t |= kTagShape;
      *p++ = static_cast<char>(e.kind);
      *p++ = static_cast<char>(e.size);
      *p++ = static_cast<char>(e.dir);
      *p++ = static_cast<char>(e.flags);
    }
    *tag = static_cast<char>(t);
    prev_ = e;
    return p;
  }

 private:
  DumpExit prev_;
};

// Decodes one vCPU's records from [p, end). Get returns false, with a reason in why(), on a
// record that runs past the end, a varint of more than 64 bits, a u32 field of 2^32 or more, or a
// reserved tag bit; *p then points at the record's first byte. Raw kind and direction values
// are stored as they are (the caller checks them).
class ExitDecoder {
 public:
  void NextVcpu() noexcept { prev_ = DumpExit{}; }
  bool Get(const char** p, const char* end, uint32_t vcpu, DumpExit* e) noexcept {
    const char* q = *p;
    if (q == end) return Bad("the record's tag is past the end");
    const uint8_t t = static_cast<uint8_t>(*q++);
    if ((t & ~kTagKnown) != 0) return Bad("tag has reserved bits set");
    DumpExit x = prev_;
    uint64_t v;
    if (!Varint(&q, end, &v)) return false;
    x.start_ns = prev_.start_ns + Unzigzag(v);
    if (!Varint(&q, end, &x.duration_ns)) return false;
    if ((t & kTagAddr) != 0) {
      if (!Varint(&q, end, &v)) return false;
      x.addr = prev_.addr + Unzigzag(v);
    }
    x.value = 0;
    if ((t & kTagValue) != 0 && !Varint(&q, end, &x.value)) return false;
    if ((t & kTagWhere) != 0) {
      uint32_t w[5];
      for (uint32_t& f : w) {
        if (!Varint(&q, end, &v)) return false;
        if (v > 0xffffffffu) return Bad("a device or register field is 2^32 or more");
        f = static_cast<uint32_t>(v);
      }
      x.device = w[0] - 1;
      x.reg = w[1] - 1;
      x.reg_element = w[2];
      x.reg_delta = w[3];
      x.map = w[4] - 1;
    }
    if ((t & kTagShape) != 0) {
      if (end - q < 4) return Bad("the record's kind, size, direction and flags are past the end");
      x.kind = static_cast<ExitKind>(static_cast<uint8_t>(q[0]));
      x.size = static_cast<uint8_t>(q[1]);
      x.dir = static_cast<AccessDir>(static_cast<uint8_t>(q[2]));
      x.flags = static_cast<uint8_t>(q[3]);
      q += 4;
    }
    x.vcpu = vcpu;
    prev_ = x;
    *e = x;
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
  DumpExit prev_;
  const char* why_ = "";
};

}  // namespace exitscope::internal
