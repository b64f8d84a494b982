// The version-3 exit record codec (recorder/exit_codec.h): every field survives a round trip
// at its extremes (times going backwards, 2^64-1, "none" indices, raw kinds), a run of exits
// at one register costs a few bytes each, and every malformed record is refused with a reason
// (never read past the end), directly and through ParseDump.
#include "recorder/exit_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "exitscope/dump.h"
#include "recorder/dump_format.h"

namespace exitscope::internal {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

bool Same(const DumpExit& a, const DumpExit& b) {
  return a.start_ns == b.start_ns && a.duration_ns == b.duration_ns && a.addr == b.addr &&
         a.value == b.value && a.vcpu == b.vcpu && a.device == b.device && a.reg == b.reg &&
         a.reg_element == b.reg_element && a.reg_delta == b.reg_delta && a.kind == b.kind &&
         a.size == b.size && a.dir == b.dir && a.flags == b.flags && a.map == b.map;
}

std::string Encode(const std::vector<DumpExit>& xs) {
  std::string out(xs.size() * kMaxCodedExit, '\0');
  ExitEncoder enc;
  char* p = out.data();
  for (const DumpExit& e : xs) {
    char* q = enc.Put(e, p);
    EXPECT_LE(static_cast<size_t>(q - p), kMaxCodedExit);
    EXPECT_GE(static_cast<size_t>(q - p), kMinCodedExit);
    p = q;
  }
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

std::vector<DumpExit> Decode(const std::string& b, size_t n, uint32_t vcpu, std::string* why) {
  std::vector<DumpExit> out;
  ExitDecoder dec;
  const char* p = b.data();
  for (size_t i = 0; i < n; ++i) {
    DumpExit e;
    if (!dec.Get(&p, b.data() + b.size(), vcpu, &e)) {
      *why = dec.why();
      return out;
    }
    out.push_back(e);
  }
  if (p != b.data() + b.size()) *why = "bytes left";
  return out;
}

TEST(ExitCodec, ExtremesRoundTrip) {
  std::vector<DumpExit> xs;
  DumpExit e;
  e.vcpu = 5;
  xs.push_back(e);  // all defaults: the "previous" of the first record
  e.start_ns = kMax;
  e.duration_ns = kMax;
  e.addr = kMax;
  e.value = kMax;
  e.device = 0xfffffffeu;
  e.reg = 0;
  e.reg_element = 0xffffffffu;
  e.reg_delta = 0xffffffffu;
  e.map = 0;
  e.kind = static_cast<ExitKind>(255);
  e.size = 255;
  e.dir = static_cast<AccessDir>(255);
  e.flags = 255;
  xs.push_back(e);
  e.start_ns = 1;  // backwards by 2^64 - 2
  e.addr = 0;
  e.device = kUnassigned;
  e.reg = kNoRegister;
  e.map = kNoRegister;
  xs.push_back(e);
  e.start_ns = 0x8000000000000000ull;  // a difference of exactly 2^63 - 1, then -2^63
  xs.push_back(e);
  e.start_ns = 0;
  xs.push_back(e);
  xs.push_back(e);  // identical to the one before: tag and two bytes... plus its value
  std::string why;
  const std::vector<DumpExit> back = Decode(Encode(xs), xs.size(), 5, &why);
  ASSERT_EQ(why, "");
  ASSERT_EQ(back.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(Same(back[i], xs[i])) << i;
}

TEST(ExitCodec, RandomRecordsRoundTrip) {
  std::mt19937_64 rng(12);
  std::vector<DumpExit> xs;
  for (int i = 0; i < 20000; ++i) {
    DumpExit e;
    const uint64_t r = rng();
    // Mostly small changes, sometimes anything.
    e.start_ns = (r & 1) ? rng() : 1000000 + static_cast<uint64_t>(i) * 3000 + (r >> 50);
    e.duration_ns = (r & 2) ? rng() >> (r % 64) : 0;
    e.addr = (r & 4) ? rng() : 0xfebf1000 + (r >> 60) * 4;
    e.value = (r & 8) ? rng() >> (r % 64) : 0;
    e.vcpu = 3;
    e.device = (r & 16) ? static_cast<uint32_t>(rng()) : 1;
    e.reg = (r & 32) ? static_cast<uint32_t>(rng()) : kNoRegister;
    e.reg_element = static_cast<uint32_t>((r >> 20) & 3);
    e.reg_delta = (r & 64) ? static_cast<uint32_t>(rng()) : 0;
    e.map = (r & 128) ? static_cast<uint32_t>(rng()) : kNoRegister;
    e.kind = static_cast<ExitKind>((r >> 8) % 16);
    e.size = static_cast<uint8_t>(r >> 16);
    e.dir = static_cast<AccessDir>((r >> 24) % 4);
    e.flags = static_cast<uint8_t>((r >> 28) & 0x1f);
    xs.push_back(e);
  }
  std::string why;
  const std::vector<DumpExit> back = Decode(Encode(xs), xs.size(), 3, &why);
  ASSERT_EQ(why, "");
  ASSERT_EQ(back.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_TRUE(Same(back[i], xs[i])) << i;
}

TEST(ExitCodec, ARunAtOneRegisterCostsAFewBytesAnExit) {
  std::vector<DumpExit> xs;
  for (int i = 0; i < 1000; ++i) {
    DumpExit e;
    e.start_ns = 5'000'000'000ull + static_cast<uint64_t>(i) * 4'100;  // every 4.1 us
    e.duration_ns = 900 + static_cast<uint64_t>(i % 7) * 10;           // ~1 us
    e.addr = 0xfebf1008;
    e.device = 0;
    e.reg = 3;
    e.kind = ExitKind::kMmio;
    e.size = 4;
    e.dir = AccessDir::kWrite;
    xs.push_back(e);
  }
  const std::string b = Encode(xs);
  // tag + 2-byte start delta + 2-byte duration; the first record carries everything.
  EXPECT_LE(b.size(), 5 * xs.size() + kMaxCodedExit);
  std::printf("1000 MMIO writes at one doorbell: %zu bytes (%.1f a record; 60 in version 2)\n",
              b.size(), static_cast<double>(b.size()) / 1000);
}

// A vCPU cycling over up to 8 accesses (a guest driver polling a status register, ringing a
// doorbell, reading a port...) names each from the history: a tag and two small numbers. A
// cycle of 9 misses the history every time and codes each access against the previous one.
TEST(ExitCodec, AHistoryOfEightAccesses) {
  auto cycle = [](int n) {
    std::vector<DumpExit> xs;
    for (int i = 0; i < 8000; ++i) {
      DumpExit e;
      e.start_ns = 1'000'000 + static_cast<uint64_t>(i) * 2'000;
      e.duration_ns = 700;
      const int k = i % n;
      e.kind = k % 3 == 0 ? ExitKind::kPio : ExitKind::kMmio;
      e.addr = k % 3 == 0 ? 0x3f8 + static_cast<uint64_t>(k) : 0xfebf0000 + 0x1000ull * k;
      e.device = static_cast<uint32_t>(k % 3);
      e.reg = static_cast<uint32_t>(k);
      e.size = k % 3 == 0 ? 1 : 4;
      e.dir = k % 2 == 0 ? AccessDir::kRead : AccessDir::kWrite;
      xs.push_back(e);
    }
    const std::string b = Encode(xs);
    std::string why;
    const std::vector<DumpExit> back = Decode(b, xs.size(), 0, &why);
    EXPECT_EQ(why, "");
    EXPECT_EQ(back.size(), xs.size());
    for (size_t i = 0; i < xs.size() && i < back.size(); ++i) EXPECT_TRUE(Same(back[i], xs[i]));
    return static_cast<double>(b.size()) / static_cast<double>(xs.size());
  };
  const double eight = cycle(8), nine = cycle(9);
  std::printf("a cycle of 8 accesses: %.2f bytes a record; of 9: %.2f\n", eight, nine);
  EXPECT_LT(eight, 5.1);  // tag, 2-byte start delta, 2-byte duration (+ the first 8 in full)
  EXPECT_GT(nine, 10.0);
}

// The history's order is a move-to-front list: checked against a plain one.
TEST(ExitCodec, HistoryIsMoveToFront) {
  AccessHistory h;
  std::vector<ExitAccess> ref(AccessHistory::kSize);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    if (rng() % 3 == 0) {
      ExitAccess a;
      a.addr = rng() % 64;
      a.kind = static_cast<uint8_t>(rng() % 3);
      h.Insert(a);
      ref.pop_back();
      ref.insert(ref.begin(), a);
    } else {
      const int pos = static_cast<int>(rng() % AccessHistory::kSize);
      h.Touch(pos);
      const ExitAccess a = ref[pos];
      ref.erase(ref.begin() + pos);
      ref.insert(ref.begin(), a);
    }
    for (int p = 0; p < AccessHistory::kSize; ++p) ASSERT_TRUE(h.at(p) == ref[p]) << i << " " << p;
  }
}

TEST(ExitCodec, MalformedRecordsAreRefusedWithAReason) {
  DumpExit e;
  e.start_ns = 1;
  auto get = [](const std::string& b) {
    ExitDecoder dec;
    const char* p = b.data();
    DumpExit out;
    const bool ok = dec.Get(&p, b.data() + b.size(), 0, &out);
    return ok ? std::string("ok") : std::string(dec.why());
  };
  EXPECT_EQ(get(std::string("\x00\x02\x00", 3)), "ok");
  EXPECT_EQ(get(""), "the record's tag is past the end");
  EXPECT_EQ(get(std::string("\x80\x02\x00", 3)), "tag has the reserved bit set");
  EXPECT_EQ(get(std::string("\x70\x02\x00", 3)), "ok");  // position 7 of the history
  EXPECT_EQ(get(std::string("\x00\x82", 2)), "a number runs past the end");
  EXPECT_EQ(get(std::string("\x00\x02", 2)), "a number runs past the end");
  // 10 bytes of continuation, and a 10th byte above 1: more than 64 bits either way.
  EXPECT_EQ(get(std::string(1, '\0') + std::string(10, '\x80') + std::string(2, '\0')),
            "a number is longer than 64 bits");
  EXPECT_EQ(get(std::string(1, '\0') + std::string(9, '\xff') + "\x02" + std::string(1, '\0')),
            "a number is longer than 64 bits");
  EXPECT_EQ(get(std::string(1, '\0') + std::string(9, '\xff') + "\x01" + std::string(1, '\0')),
            "ok");
  // A u32 field of 2^32.
  EXPECT_EQ(get(std::string("\x04\x02\x00\x80\x80\x80\x80\x10\x00\x00\x00\x00", 12)),
            "a device or register field is 2^32 or more");
  EXPECT_EQ(get(std::string("\x08\x02\x00\x01\x02", 5)),
            "the record's kind, size, direction and flags are past the end");
}

// Through ParseDump: a record cut short inside the exits section, and bytes after the last
// record, are refused at the exact offset.
TEST(ExitCodec, ParseDumpNamesTheBadRecord) {
  Dump d;
  d.vcpus.resize(1);
  for (int i = 0; i < 3; ++i) {
    DumpExit e;
    e.start_ns = 1000 + static_cast<uint64_t>(i) * 50;  // deltas of one byte
    e.kind = ExitKind::kHlt;
    d.vcpus[0].exits.push_back(e);
  }
  d.vcpus[0].counters.written = 3;
  d.vcpus[0].counters.capacity = 4;
  const std::string good = SerializeDump(d);
  auto ok = ParseDump(good, "good");
  ASSERT_TRUE(ok) << ok.error().message;
  ASSERT_EQ(ok->vcpus[0].exits.size(), 3u);
  EXPECT_EQ(ok->vcpus[0].exits[2].start_ns, 1100u);
  EXPECT_EQ(ok->vcpus[0].exits[2].kind, ExitKind::kHlt);
  // The exits are the file's last section: patch its last byte (the third record's duration,
  // 0) into a continuation byte, then fix the checksums the way a writer would.
  auto le = [&](const std::string& b, size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[at + i])} << (8 * i);
    return v;
  };
  size_t entry = 0;
  for (size_t e = 64; e < 64 + 32 * le(good, 20, 4); e += 32) {
    if (le(good, e, 4) == 7) entry = e;
  }
  ASSERT_NE(entry, 0u);
  const uint64_t off = le(good, entry + 8, 8), len = le(good, entry + 16, 8);
  EXPECT_EQ(off + len, good.size());
  std::string bad = good;
  bad.back() = '\x80';
  auto reseal = [&](std::string& b) {
    const size_t n = le(b, 20, 4);
    for (size_t e = 64; e < 64 + 32 * n; e += 32) {
      const uint32_t c = Crc32(std::string_view(b).substr(le(b, e + 8, 8), le(b, e + 16, 8)));
      std::memcpy(b.data() + e + 24, &c, 4);
    }
    const uint32_t t = Crc32(std::string_view(b).substr(64, 32 * n));
    std::memcpy(b.data() + 32, &t, 4);
    std::memset(b.data() + 36, 0, 4);
    const uint32_t h = Crc32(std::string_view(b).substr(0, 64));
    std::memcpy(b.data() + 36, &h, 4);
  };
  reseal(bad);
  auto r = ParseDump(bad, "bad.esdump");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
  // Records 0 and 1 decoded; record 2 starts at len - 3 (tag, start delta, duration).
  EXPECT_EQ(r.error().message, "bad.esdump: section 'exits' is corrupt at offset " +
                                   std::to_string(off + len - 3) +
                                   ": exit record 2: a number runs past the end");
  // The counts say 2 exits (the section's total and the vCPU's count): the third record's
  // bytes are left over.
  std::string extra = good;
  const uint64_t two = 2;
  std::memcpy(extra.data() + off, &two, 8);
  size_t vcpus = 0;
  for (size_t e = 64; e < 64 + 32 * le(good, 20, 4); e += 32) {
    if (le(good, e, 4) == 6) vcpus = le(good, e + 8, 8);
  }
  std::memcpy(extra.data() + vcpus + 4 + 4 + 4 * 8, &two, 8);  // n, vcpu, 4 counters, count
  reseal(extra);
  r = ParseDump(extra, "extra.esdump");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message,
            "extra.esdump: section 'exits' has 3 bytes after its last exit "
            "record (offset " +
                std::to_string(off + len - 3) + ")");
}

}  // namespace
}  // namespace exitscope::internal
