// `exitscope inspect` on a dump whose findings carry captured stacks (dump version 4): every
// format shows the frames, the table and JSON the vCPUs' thread ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/run.h"
#include "support/stack_dump.h"

namespace {

using exitscope::test::RunExitscope;

class InspectStacks : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(testing::TempDir() + "/inspect_stacks_" + std::to_string(getpid()) +
                            ".esdump");
    ASSERT_TRUE(exitscope::WriteDumpFile(exitscope::test::DumpWithStacks(), *path_));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete path_;
  }
  static std::string* path_;
};
std::string* InspectStacks::path_ = nullptr;

TEST_F(InspectStacks, TableShowsFramesNoteAndThreadIds) {
  const auto o = RunExitscope("inspect --events " + *path_);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("  threads   vCPU 0 tid 4300, vCPU 1 tid 4301\n"), std::string::npos)
      << o.out;
  // Frames as FormatFrame spells them (its own tests fix the spelling).
  const exitscope::ThreadStack st = exitscope::test::DumpWithStacks().findings[1].stack;
  EXPECT_NE(o.out.find("      stack: thread 4301, state S, capture 1, 7 user frames not kept\n"
                       "        k " +
                       exitscope::FormatFrame(st.kernel[0]) + "\n        k " +
                       exitscope::FormatFrame(st.kernel[1]) + "\n        u " +
                       exitscope::FormatFrame(st.user[0]) + "\n        u " +
                       "exitscope::vmm::BlockDevice::Read+0x1f (src/vmm/devices/blk.cc:120) "
                       "[exitscope]\n"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("      note: user stack unavailable: the thread is in uninterruptible"),
            std::string::npos)
      << o.out;
}

TEST_F(InspectStacks, JsonCsvHtmlAndTimelineCarryTheFrames) {
  const auto json = RunExitscope("inspect " + *path_ + " --format json", false);
  ASSERT_EQ(json.status, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["vcpus"][0]["tid"], 4300);
  EXPECT_EQ(j["findings"][1]["stack"]["kernel"][0]["function"], "anon_pipe_read");
  EXPECT_EQ(j["findings"][1]["stack"]["user"][1]["line"], 120);

  const auto csv = RunExitscope("inspect " + *path_ + " --format csv", false);
  ASSERT_EQ(csv.status, 0) << csv.err;
  const exitscope::ThreadStack st = exitscope::test::DumpWithStacks().findings[1].stack;
  EXPECT_NE(csv.out.find("," + exitscope::FormatFrame(st.kernel[0]) + " <- " +
                         exitscope::FormatFrame(st.kernel[1]) + " <- " +
                         exitscope::FormatFrame(st.user[0]) + " <- "),
            std::string::npos)
      << csv.out;

  const std::string html = testing::TempDir() + "/inspect_stacks_" + std::to_string(getpid());
  const auto h = RunExitscope("inspect " + *path_ + " --format html -o " + html + ".html");
  ASSERT_EQ(h.status, 0) << h.out;
  std::ifstream hf(html + ".html");
  std::stringstream hs;
  hs << hf.rdbuf();
  std::filesystem::remove(html + ".html");
  EXPECT_NE(hs.str().find("</summary><pre>k " + exitscope::FormatFrame(st.kernel[0]) + "\n"),
            std::string::npos);

  const auto t = RunExitscope("inspect " + *path_ + " --format timeline -o " + html + ".json");
  ASSERT_EQ(t.status, 0) << t.out;
  std::ifstream tf(html + ".json");
  const auto tj = nlohmann::json::parse(tf);
  std::filesystem::remove(html + ".json");
  size_t frames = 0;
  for (const auto& e : tj["traceEvents"]) {
    if (e.value("cat", "") == "finding" && e["args"].contains("frames"))
      frames += e["args"]["frames"].size();
  }
  EXPECT_EQ(frames, 5u);
}

}  // namespace
