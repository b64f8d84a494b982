#include "base/clock_name.h"

#include <gtest/gtest.h>

namespace exitscope::base {
namespace {

TEST(SelectedClock, TheBracketedName) {
  EXPECT_EQ(SelectedClock("local global counter uptime perf mono mono_raw boot [x86-tsc]\n"),
            "x86-tsc");
  EXPECT_EQ(SelectedClock("[local] global"), "local");
}

TEST(SelectedClock, OneBareWordIsThatClock) {
  EXPECT_EQ(SelectedClock("x86-tsc\n"), "x86-tsc");
  EXPECT_EQ(SelectedClock("  mono  "), "mono");
}

TEST(SelectedClock, NoneSelectedGivesEmpty) {
  EXPECT_EQ(SelectedClock("local global"), "");
  EXPECT_EQ(SelectedClock("local [global"), "");
  EXPECT_EQ(SelectedClock(""), "");
  EXPECT_EQ(SelectedClock(" \n"), "");
}

}  // namespace
}  // namespace exitscope::base
