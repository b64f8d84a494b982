// report/renderer.h: every format registered once, the same names everywhere, an unknown one
// refused in one line naming the choices, and every text format drawing every model.
#include "report/renderer.h"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "analysis/joint_view.h"
#include "analysis/kvm_stats.h"
#include "sources/source.h"

namespace exitscope::report {
namespace {

std::string Data(const char* rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/" + rel;
}

TEST(Renderer, EveryFormatOnceInOneOrder) {
  std::string names;
  for (const Renderer* r : Renderers()) names += std::string(r->name) + " ";
  EXPECT_EQ(names, "table json csv html timeline ");
  EXPECT_EQ(FormatChoices(Need::kFile), "table | json | csv | html | timeline");
  EXPECT_EQ(FormatChoices(Need::kLive), "table | json | csv");
  for (const Renderer* r : Renderers()) {
    EXPECT_TRUE((r->text == nullptr) != (r->write == nullptr)) << r->name;
    EXPECT_FALSE(r->help.empty()) << r->name;
    EXPECT_FALSE(r->live && r->file) << r->name;  // a live refresh goes to a terminal
  }
}

TEST(Renderer, AnUnknownFormatIsOneLineNamingTheChoices) {
  auto r = FindRenderer("xml", Need::kFile);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().message, "--format 'xml': not one of table, json, csv, html, timeline");
  auto live = FindRenderer("html", Need::kLive);
  ASSERT_FALSE(live);
  EXPECT_EQ(live.error().message, "--format 'html': not one of table, json, csv");
  auto ok = FindRenderer("csv", Need::kLive);
  ASSERT_TRUE(ok);
  EXPECT_EQ((*ok)->name, "csv");
}

TEST(Renderer, TextFormatsDrawADumpsHealth) {
  auto d = ReadDump(Data("kvm-host/blk-backend-delay.esdump"));
  ASSERT_TRUE(d);
  HealthModel h{.dump = &*d};
  h.options.source = "blk-backend-delay.esdump";
  const ReportModel m{.health = &h};
  auto table = RenderText(kTableRenderer, m);
  ASSERT_TRUE(table);
  EXPECT_NE(table->find("nvme0"), std::string::npos);
  auto json = RenderText(kJsonRenderer, m);
  ASSERT_TRUE(json);
  EXPECT_TRUE(nlohmann::json::accept(*json));
  auto csv = RenderText(kCsvRenderer, m);
  ASSERT_TRUE(csv);
  EXPECT_EQ(csv->substr(0, csv->find('\n') + 1), CsvHeader());
  for (const char* scope : {"\nkind,", "\ndevice,", "\nregister,", "\nvcpu,"}) {
    EXPECT_NE(csv->find(scope), std::string::npos) << scope;
  }
  EXPECT_NE(csv->find("\ndevice,,,nvme0,"), std::string::npos) << *csv;
  // Streamed formats are not text.
  EXPECT_FALSE(RenderText(kTimelineRenderer, m));
}

TEST(Renderer, TextFormatsDrawAKernelTracesAnalysis) {
  auto src = sources::OpenSource(Data("kvm-host/joint-blk.dat"), {});
  ASSERT_TRUE(src);
  analysis::KvmAggregator agg({});
  ASSERT_TRUE((*src)->Run(&agg));
  agg.Finish();
  KvmModel k{.analysis = &agg.analysis()};
  k.context.pairing = (*src)->pairing();
  const ReportModel m{.kvm = &k};
  auto csv = RenderText(kCsvRenderer, m);
  ASSERT_TRUE(csv);
  EXPECT_EQ(*csv, RenderKvmCsv(agg.analysis(), k.context, k.render));  // the same bytes
  auto table = RenderText(kTableRenderer, m);
  ASSERT_TRUE(table);
  EXPECT_EQ(*table, RenderKvmTable(agg.analysis(), k.context, k.render));
  // html needs the per-exit collector: a live model has none.
  auto html = RenderText(kHtmlRenderer, m);
  EXPECT_FALSE(html);
}

TEST(Renderer, TextFormatsDrawTheJointView) {
  const std::string dpath = Data("kvm-host/joint-blk.esdump");
  const std::string tpath = Data("kvm-host/joint-blk.dat");
  auto d = ReadDump(dpath);
  ASSERT_TRUE(d);
  auto v = analysis::BuildJointViewFromTrace(*d, dpath, tpath);
  ASSERT_TRUE(v) << v.error().message;
  JointModel j{.dump = &*d, .view = &*v};
  j.options.dump = dpath;
  j.options.trace = tpath;
  const ReportModel m{.joint = &j};
  auto table = RenderText(kTableRenderer, m);
  ASSERT_TRUE(table);
  EXPECT_NE(table->find("Joint view: " + dpath), std::string::npos);
  auto csv = RenderText(kCsvRenderer, m);
  ASSERT_TRUE(csv);
  EXPECT_EQ(csv->rfind("scope,key,count,total_p50_ns", 0), 0u);
  // One row per group: as many rows as the groups the view has.
  const analysis::JointGroups g = analysis::GroupJointExits(v->matched);
  size_t lines = 0;
  for (char c : *csv) lines += c == '\n';
  EXPECT_EQ(lines, 1 + g.by_kind.size() + g.by_device.size() + g.by_register.size());
  EXPECT_NE(csv->find("\nregister,"), std::string::npos);
}

}  // namespace
}  // namespace exitscope::report
