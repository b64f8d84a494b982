// A dump whose findings carry captured stacks (dump version 4), written to a file and read
// back, drawn by every renderer: the table lists each finding's frames ("k ..." kernel, "u ..."
// user, innermost first) and note, and the vCPUs' thread ids; JSON a "stack" object per
// finding and "vcpus" with their tids; CSV one "finding" row each with the frames joined by
// " <- "; HTML a <details> per stack; the timeline the frames in the finding's args.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/exit_summary.h"
#include "report/renderer.h"
#include "support/stack_dump.h"

namespace exitscope::report {
namespace {

using nlohmann::json;

// The frames as FormatFrame spells them (its spelling is its own, tested with it): kernel ones
// first, then user ones, innermost first.
std::vector<std::string> Frames(const ThreadStack& s) {
  std::vector<std::string> out;
  for (const StackFrame& f : s.kernel) out.push_back(FormatFrame(f));
  for (const StackFrame& f : s.user) out.push_back(FormatFrame(f));
  return out;
}

std::string Temp(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("report_stacks_" + std::to_string(getpid()) + "_" + name))
      .string();
}

class ReportStacks : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = Temp("dump.esdump");
    ASSERT_TRUE(WriteDumpFile(test::DumpWithStacks(), path));
    auto d = ReadDump(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(d) << d.error().message;
    dump_ = std::move(*d);
    health_.dump = &dump_;
    health_.options.source = "stacks.esdump";
    health_.options.events = true;  // the findings one by one, with their frames
    model_.health = &health_;
    model_.timeline.dump = &dump_;
  }
  Dump dump_;
  HealthModel health_;
  ReportModel model_;
};

// The kept finding owns its stack: copies and moves keep it, pointing into themselves.
TEST_F(ReportStacks, AKeptFindingOwnsItsStack) {
  analysis::ExitSummary s = analysis::Summarize(dump_, {});
  ASSERT_EQ(s.findings.size(), 4u);
  ASSERT_NE(s.findings[1].stack, nullptr);
  EXPECT_EQ(*s.findings[1].stack, dump_.findings[1].stack);
  EXPECT_NE(s.findings[1].stack, &dump_.findings[1].stack);
  EXPECT_EQ(s.findings[0].stack, nullptr);
  const analysis::KeptFinding copy = s.findings[1];
  EXPECT_EQ(*copy.stack, dump_.findings[1].stack);
  EXPECT_NE(copy.stack, s.findings[1].stack);
  analysis::KeptFinding moved = std::move(s.findings[1]);
  EXPECT_EQ(*moved.stack, dump_.findings[1].stack);
  EXPECT_EQ(s.findings[1].stack, nullptr);
  moved = copy;
  EXPECT_EQ(*moved.stack, dump_.findings[1].stack);
  EXPECT_NE(moved.stack, copy.stack);
}

TEST_F(ReportStacks, TheTableListsFramesNoteAndThreadIds) {
  auto t = RenderText(kTableRenderer, model_);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_NE(t->find("  threads   vCPU 0 tid 4300, vCPU 1 tid 4301\n"), std::string::npos) << *t;
  const std::vector<std::string> f = Frames(dump_.findings[1].stack);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[3],
            "exitscope::vmm::BlockDevice::Read+0x1f (src/vmm/devices/blk.cc:120) [exitscope]");
  EXPECT_EQ(f[4], "0x555500009999 [exitscope]");
  const std::string frames =
      "  +0.000002 s  vCPU 1: stuck in exit MMIO write 4B to vblk0 (0xd0000050) for 20 ms (still "
      "inside)\n"
      "      stack: thread 4301, state S, capture 1, 7 user frames not kept\n"
      "        k " +
      f[0] + "\n        k " + f[1] + "\n        u " + f[2] + "\n        u " + f[3] +
      "\n        u " + f[4] + "\n";
  EXPECT_NE(t->find(frames), std::string::npos) << *t;
  EXPECT_NE(t->find("      stack: thread 4301, state D, capture 2\n"
                    "      note: user stack unavailable: the thread is in uninterruptible "
                    "sleep (D)\n"),
            std::string::npos)
      << *t;
  EXPECT_NE(t->find("Stack captures: 2 attached to findings; 1 signal timeouts"),
            std::string::npos);
}

TEST_F(ReportStacks, JsonHasAStackPerFindingAndTheThreadIds) {
  auto text = RenderText(kJsonRenderer, model_);
  ASSERT_TRUE(text) << text.error().message;
  const json j = json::parse(*text);
  ASSERT_EQ(j["vcpus"].size(), 2u);
  EXPECT_EQ(j["vcpus"][1]["tid"], 4301);
  EXPECT_EQ(j["stack_counters"]["frames_dropped"], 17);
  const json& f = j["findings"];
  ASSERT_EQ(f.size(), 4u);
  EXPECT_TRUE(f[0]["stack"].is_null());
  const json& st = f[1]["stack"];
  EXPECT_EQ(st["tid"], 4301);
  EXPECT_EQ(st["state"], "S");
  EXPECT_EQ(st["capture"], 1);
  EXPECT_EQ(st["user_dropped"], 7);
  EXPECT_EQ(st["note"], "");
  ASSERT_EQ(st["kernel"].size(), 2u);
  EXPECT_EQ(st["kernel"][0]["function"], "anon_pipe_read");
  EXPECT_EQ(st["kernel"][0]["ip"], "0xffffffff81234567");
  EXPECT_EQ(st["kernel"][0]["offset"], 0x5c);
  ASSERT_EQ(st["user"].size(), 3u);
  EXPECT_EQ(st["user"][1]["function"], "exitscope::vmm::BlockDevice::Read");
  EXPECT_EQ(st["user"][1]["file"], "src/vmm/devices/blk.cc");
  EXPECT_EQ(st["user"][1]["line"], 120);
  EXPECT_EQ(st["user"][1]["module"], "/usr/bin/exitscope");
  EXPECT_EQ(f[2]["type"], "stuck-exit-stack");
  EXPECT_EQ(f[2]["stack"]["state"], "D");
  EXPECT_EQ(f[2]["stack"]["user"].size(), 0u);
  EXPECT_EQ(f[2]["stack"]["note"].get<std::string>().rfind("user stack unavailable", 0), 0u);
}

TEST_F(ReportStacks, CsvHasAFindingRowWithItsFrames) {
  auto csv = RenderText(kCsvRenderer, model_);
  ASSERT_TRUE(csv) << csv.error().message;
  EXPECT_EQ(csv->substr(0, csv->find('\n') + 1), CsvHeader());
  EXPECT_NE(CsvHeader().find(",p999_ns,stack\n"), std::string::npos);
  const std::vector<std::string> f = Frames(dump_.findings[1].stack);
  const std::string row =
      "\nfinding,,1,stuck-exit,vCPU 1: stuck in exit MMIO write 4B to vblk0 (0xd0000050) for 20 "
      "ms (still inside),1,,20000000,,,,,,,,," +
      f[0] + " <- " + f[1] + " <- " + f[2] + " <- " + f[3] + " <- " + f[4] + "\n";
  EXPECT_NE(csv->find(row), std::string::npos) << *csv;
  // Every line has the header's columns (no field here holds a quoted comma).
  std::istringstream in(*csv);
  const auto columns = [](const std::string& l) { return std::count(l.begin(), l.end(), ','); };
  size_t findings = 0;
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(columns(line), 16) << line;
    findings += line.rfind("finding,", 0) == 0;
  }
  EXPECT_EQ(findings, 4u);
}

TEST_F(ReportStacks, HtmlShowsEachStackInADetails) {
  auto html = RenderText(kHtmlRenderer, model_);
  ASSERT_TRUE(html) << html.error().message;
  const std::vector<std::string> f = Frames(dump_.findings[1].stack);
  // The page escapes the text; these frames hold nothing to escape.
  EXPECT_NE(html->find("<details><summary>Stack at +0.000002 s, stuck-exit of vCPU 1: thread "
                       "4301, state S, capture 1, 7 user frames not kept</summary><pre>k " +
                       f[0] + "\nk " + f[1] + "\nu " + f[2] + "\n"),
            std::string::npos)
      << *html;
  EXPECT_NE(html->find("note: user stack unavailable"), std::string::npos);
}

TEST_F(ReportStacks, TheTimelineFindingCarriesItsFrames) {
  const std::string path = Temp("timeline.json");
  auto st = WriteTimeline(model_.timeline, {}, path);
  ASSERT_TRUE(st) << st.error().message;
  std::ifstream f(path);
  const json j = json::parse(f);
  std::filesystem::remove(path);
  size_t with = 0;
  for (const json& e : j["traceEvents"]) {
    if (e.value("cat", "") != "finding" || !e["args"].contains("frames")) continue;
    ++with;
    if (e["args"]["frames"].empty()) {
      EXPECT_EQ(e["args"]["state"], "D");
      EXPECT_EQ(e["args"]["stack_note"].get<std::string>().rfind("user stack", 0), 0u);
      continue;
    }
    EXPECT_EQ(e["args"]["tid"], 4301);
    EXPECT_EQ(e["args"]["frames"], json(Frames(dump_.findings[1].stack)));
  }
  EXPECT_EQ(with, 2u);
}

}  // namespace
}  // namespace exitscope::report
