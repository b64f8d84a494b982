#include "base/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace exitscope::base {
namespace {

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string> out;
  LineSplitter lines(text);
  for (std::string_view l; lines.Next(&l);) {
    out.emplace_back(l);
    EXPECT_EQ(lines.number(), out.size());
  }
  return out;
}

TEST(LineSplitter, LastLineWithAndWithoutNewline) {
  EXPECT_EQ(Split("a\nb\n"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Split("a\nb"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Split(""), (std::vector<std::string>{}));
  EXPECT_EQ(Split("\n"), (std::vector<std::string>{""}));
}

TEST(LineSplitter, KeepsEmptyLinesAndNumbersThem) {
  LineSplitter lines("x\n\n\ny\n");
  std::string_view l;
  ASSERT_TRUE(lines.Next(&l));
  ASSERT_TRUE(lines.Next(&l));
  ASSERT_TRUE(lines.Next(&l));
  ASSERT_TRUE(lines.Next(&l));
  EXPECT_EQ(l, "y");
  EXPECT_EQ(lines.number(), 4u);
  EXPECT_FALSE(lines.Next(&l));
  EXPECT_EQ(lines.rest(), "");
}

TEST(LineSplitter, CrlfReadsAsLfOnlyOneCarriageReturn) {
  EXPECT_EQ(Split("a\r\nb\r\n"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Split("a\r\r\n"), (std::vector<std::string>{"a\r"}));
  EXPECT_EQ(Split("a\rb\n"), (std::vector<std::string>{"a\rb"}));
}

TEST(Text, HexAndUtf8) {
  EXPECT_EQ(Hex(0), "0x0");
  EXPECT_EQ(Hex(0x1f), "0x1f");
  EXPECT_TRUE(IsUtf8("n\xc3\xa9"));
  EXPECT_FALSE(IsUtf8("\xc0\x80"));          // overlong NUL
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
}

}  // namespace
}  // namespace exitscope::base
