#include "exitscope/register_map.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace exitscope {
namespace {

std::shared_ptr<const RegisterMap> Builtin(std::string_view name) {
  auto m = RegisterMap::Builtin(name);
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().message);
  return m ? *m : nullptr;
}

std::string Name(const RegisterMap& m, uint64_t off, uint32_t size, AccessDir dir) {
  return m.Format(m.Resolve(off, size, dir), size);
}

TEST(RegisterMapTest, BuiltinsParseAndMatchDataFiles) {
  const auto names = RegisterMap::BuiltinNames();
  ASSERT_GE(names.size(), 4u);
  for (const char* n : {"uart16550", "nvme", "pci-config", "virtio-mmio"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  for (const std::string& n : names) {
    auto b = Builtin(n);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->name(), n);
    // The compiled-in text is the shipped file.
    auto loaded = RegisterMap::Load(std::string(EXITSCOPE_DATA_DIR) + "/regmaps/" + n + ".map");
    ASSERT_TRUE(loaded.has_value()) << loaded.error().message;
    EXPECT_EQ(loaded->ToText(), b->ToText());
  }
  auto missing = RegisterMap::Builtin("no-such-device");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("nvme"), std::string::npos);
}

TEST(RegisterMapTest, NvmeRegistersAndDoorbells) {
  auto m = Builtin("nvme");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(Name(*m, 0x0, 8, AccessDir::kRead), "CAP");
  EXPECT_EQ(Name(*m, 0x4, 4, AccessDir::kRead), "CAP+4");
  EXPECT_EQ(Name(*m, 0x8, 4, AccessDir::kRead), "VS");
  EXPECT_EQ(Name(*m, 0xc, 4, AccessDir::kWrite), "INTMS");
  EXPECT_EQ(Name(*m, 0x10, 4, AccessDir::kWrite), "INTMC");
  EXPECT_EQ(Name(*m, 0x14, 4, AccessDir::kWrite), "CC");
  EXPECT_EQ(Name(*m, 0x16, 2, AccessDir::kRead), "CC+2");  // partial access
  EXPECT_EQ(Name(*m, 0x14, 2, AccessDir::kRead), "CC+0");  // other width at the start
  EXPECT_EQ(Name(*m, 0x1c, 4, AccessDir::kRead), "CSTS");
  EXPECT_EQ(Name(*m, 0x20, 4, AccessDir::kWrite), "NSSR");
  EXPECT_EQ(Name(*m, 0x24, 4, AccessDir::kWrite), "AQA");
  EXPECT_EQ(Name(*m, 0x28, 8, AccessDir::kWrite), "ASQ");
  EXPECT_EQ(Name(*m, 0x2c, 4, AccessDir::kWrite), "ASQ+4");
  EXPECT_EQ(Name(*m, 0x30, 8, AccessDir::kWrite), "ACQ");
  EXPECT_EQ(Name(*m, 0x18, 4, AccessDir::kRead), "");  // reserved hole
  EXPECT_EQ(Name(*m, 0x1000, 4, AccessDir::kWrite), "SQ0TDBL");
  EXPECT_EQ(Name(*m, 0x1004, 4, AccessDir::kWrite), "CQ0HDBL");
  EXPECT_EQ(Name(*m, 0x1008, 4, AccessDir::kWrite), "SQ1TDBL");
  EXPECT_EQ(Name(*m, 0x100c, 4, AccessDir::kWrite), "CQ1HDBL");
  EXPECT_EQ(Name(*m, 0x100a, 2, AccessDir::kWrite), "SQ1TDBL+2");
  const RegisterHit h = m->Resolve(0x1000 + 2 * 7 * 4, 4, AccessDir::kWrite);
  ASSERT_TRUE(h.found());
  EXPECT_EQ(h.element, 7u);
  EXPECT_EQ(h.delta, 0u);
  EXPECT_EQ(m->registers()[h.reg].ElementName(h.element), "SQ7TDBL");
  // Last doorbell and one past it.
  EXPECT_EQ(Name(*m, 0x1000 + 65535ull * 8 + 4, 4, AccessDir::kWrite), "CQ65535HDBL");
  EXPECT_EQ(Name(*m, 0x1000 + 65536ull * 8, 4, AccessDir::kWrite), "");
}

TEST(RegisterMapTest, UartAliasesByDirection) {
  auto m = Builtin("uart16550");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(Name(*m, 0, 1, AccessDir::kRead), "RBR");
  EXPECT_EQ(Name(*m, 0, 1, AccessDir::kWrite), "THR");
  EXPECT_EQ(Name(*m, 1, 1, AccessDir::kWrite), "IER");
  EXPECT_EQ(Name(*m, 2, 1, AccessDir::kRead), "IIR");
  EXPECT_EQ(Name(*m, 2, 1, AccessDir::kWrite), "FCR");
  EXPECT_EQ(Name(*m, 5, 1, AccessDir::kRead), "LSR");
  EXPECT_EQ(Name(*m, 7, 1, AccessDir::kWrite), "SCR");
  EXPECT_EQ(Name(*m, 8, 1, AccessDir::kWrite), "");
}

TEST(RegisterMapTest, PciAndVirtio) {
  auto pci = Builtin("pci-config");
  ASSERT_NE(pci, nullptr);
  EXPECT_EQ(Name(*pci, 0x0, 2, AccessDir::kRead), "VENDOR_ID");
  EXPECT_EQ(Name(*pci, 0x0, 4, AccessDir::kRead), "VENDOR_ID+0");
  EXPECT_EQ(Name(*pci, 0x10, 4, AccessDir::kWrite), "BAR0");
  EXPECT_EQ(Name(*pci, 0x24, 4, AccessDir::kWrite), "BAR5");
  EXPECT_EQ(Name(*pci, 0x3c, 1, AccessDir::kWrite), "INTERRUPT_LINE");
  auto v = Builtin("virtio-mmio");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(Name(*v, 0x50, 4, AccessDir::kWrite), "QUEUE_NOTIFY");
  EXPECT_EQ(Name(*v, 0x70, 4, AccessDir::kRead), "STATUS");
  EXPECT_EQ(Name(*v, 0x105, 1, AccessDir::kRead), "CONFIG1+1");
}

TEST(RegisterMapTest, ParseArraysAndDescriptions) {
  auto m = RegisterMap::Parse(
      "# test\n"
      "map dev\n"
      "reg CTRL 0x0 4 RW  Control register   # trailing comment\n"
      "array Q{}_DB 0x100 4 W count=4 stride=0x10  Queue doorbell\n",
      "t.map");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  ASSERT_EQ(m->registers().size(), 2u);
  EXPECT_EQ(m->registers()[0].description, "Control register");
  EXPECT_EQ(Name(*m, 0x130, 4, AccessDir::kWrite), "Q3_DB");
  EXPECT_EQ(Name(*m, 0x134, 4, AccessDir::kWrite), "");  // gap between elements
  EXPECT_EQ(Name(*m, 0x140, 4, AccessDir::kWrite), "");  // past the last element
  auto again = RegisterMap::Parse(m->ToText(), "roundtrip");
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->ToText(), m->ToText());
}

void ExpectParseError(std::string_view text, std::string_view expected) {
  auto m = RegisterMap::Parse(text, "bad.map");
  ASSERT_FALSE(m.has_value()) << text;
  EXPECT_EQ(m.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(m.error().message.find(expected), std::string::npos)
      << "got: " << m.error().message << "\nwanted: " << expected;
}

TEST(RegisterMapTest, ErrorsNameFileAndLine) {
  ExpectParseError("map d\nreg A 0 3 RW\n", "bad.map:2: bad width '3'");
  ExpectParseError("map d\n\nreg A 0 4 RX\n", "bad.map:3: bad access 'RX'");
  ExpectParseError("map d\nreg A zz 4 R\n", "bad.map:2: bad offset 'zz'");
  ExpectParseError("reg A 0 4 R\n", "bad.map:1: 'reg' before the 'map NAME' line");
  ExpectParseError("map d\nfoo\n", "bad.map:2: unknown directive 'foo'");
  ExpectParseError("map d\narray A{} 0 4 R count=2\n",
                   "bad.map:2: array needs count=N and stride=S");
  ExpectParseError("map d\narray A 0 4 R count=2 stride=4\n", "bad.map:2: register name 'A'");
  ExpectParseError("map d\narray A{} 0 4 R count=2 stride=2\n",
                   "bad.map:2: register A{}: stride 2");
  ExpectParseError("map d\nreg A 0 4 RW\nreg B 2 4 RW\n",
                   "bad.map:3: register B at 0x2 overlaps A");
  ExpectParseError("map d\nreg A 0 4 RW\n# x\nreg A 8 4 RW\n",
                   "bad.map:2: register A is defined twice");
  ExpectParseError("", "bad.map:1: no 'map NAME' line");
  ExpectParseError("map d\nmap e\n", "bad.map:2: second 'map' directive");
  ExpectParseError(std::string_view("map d\nreg A\0 0 4 R\n", 19), "bad.map:2: control character");
  ExpectParseError(
      "map d\narray A{} 0 4 RW count=4 stride=8\narray B{} 0x1a 4 RW count=4 stride=8\n",
      "bad.map:3: register B{} at 0x1a overlaps A{}");
  ExpectParseError(
      "map d\narray A{} 0 4 RW count=4 stride=8\narray B{} 0x6 4 RW count=4 stride=8\n",
      "overlaps");  // B's elements straddle into A's next element
  EXPECT_TRUE(RegisterMap::Parse("map d\narray A{} 0 4 RW count=4 stride=8\n"
                                 "array B{} 0x4 4 RW count=4 stride=8\n",
                                 "ok")
                  .has_value());
  // Same offset is fine when directions differ or one is an alias.
  EXPECT_TRUE(RegisterMap::Parse("map d\nreg A 0 4 R\nreg B 0 4 W\nreg C 0 4 RW alias\n", "ok")
                  .has_value());
}

// The lookup tables give exactly what the reference search gives, for every builtin map,
// direction and offset (dense part, periodic doorbell region, its edges and beyond).
TEST(RegisterMapTest, TablesMatchSearch) {
  for (const std::string& n : RegisterMap::BuiltinNames()) {
    auto m = Builtin(n);
    ASSERT_NE(m, nullptr);
    std::vector<uint64_t> offsets;
    for (uint64_t o = 0; o < 0x3000; ++o) offsets.push_back(o);
    for (uint64_t o = 0x81000 - 0x40; o < 0x81000 + 0x40; ++o) offsets.push_back(o);
    for (uint64_t o : {0x7fff8ull, 0x100000ull, ~0ull}) offsets.push_back(o);
    for (uint64_t o : offsets) {
      for (AccessDir d : {AccessDir::kNone, AccessDir::kRead, AccessDir::kWrite}) {
        const RegisterHit a = m->Resolve(o, 4, d);
        const RegisterHit b = m->ResolveBySearch(o, 4, d);
        ASSERT_EQ(a.reg, b.reg) << n << " offset " << o;
        if (b.found()) {
          ASSERT_EQ(a.element, b.element) << n << " offset " << o;
          ASSERT_EQ(a.delta, b.delta) << n << " offset " << o;
        }
      }
    }
  }
  // A map with a spilling array (element crosses the stride boundary) and a non-power-of-two one.
  auto m = RegisterMap::Parse(
      "map t\narray A{} 0x2000 4 W count=100 stride=8\narray B{} 0x2006 4 R count=100 stride=8\n"
      "array C{} 0x10 2 RW count=10 stride=6\n",
      "t.map");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  for (uint64_t o = 0; o < 0x2400; ++o) {
    for (AccessDir d : {AccessDir::kNone, AccessDir::kRead, AccessDir::kWrite}) {
      const RegisterHit a = m->Resolve(o, 4, d), b = m->ResolveBySearch(o, 4, d);
      ASSERT_EQ(a.reg, b.reg) << o;
      ASSERT_EQ(a.element, b.element) << o;
      ASSERT_EQ(a.delta, b.delta) << o;
    }
  }
  EXPECT_EQ(m->Format(m->Resolve(0x2008 + 6, 4, AccessDir::kRead), 4), "B1");
  EXPECT_EQ(m->Format(m->Resolve(0x2008 + 8, 2, AccessDir::kRead), 2), "B1+2");
}

TEST(RegisterMapTest, LoadMissingFile) {
  auto m = RegisterMap::Load("/nonexistent/x.map");
  ASSERT_FALSE(m.has_value());
  EXPECT_EQ(m.error().code, ErrorCode::kNotFound);
  EXPECT_NE(m.error().message.find("/nonexistent/x.map"), std::string::npos);
}

}  // namespace
}  // namespace exitscope
