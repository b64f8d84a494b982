// The kernel side's one Prometheus path (cli/kernel_metrics.h), without root: single exits
// (OnExit, as kvm live's tee) and aggregates (OnSamples, as each scrape of kvm stat --bpf feeds
// the maps' entries) land in the same series, fetched over HTTP from an ephemeral loopback port.
#include "cli/kernel_metrics.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "base/histogram.h"
#include "metrics_text.h"

namespace exitscope {
namespace {

using testing::HttpGet;
using testing::ParseExposition;
using testing::Sample;
using testing::Select;

struct CountingSink final : EventSink {
  void OnExit(const ExitEvent&) override { ++exits; }
  void OnSamples(const ExitEvent&, const SampleBatch&) override { ++batches; }
  int exits = 0, batches = 0;
};

std::vector<Sample> Scrape(const cli::KernelMetrics& m) {
  const std::string& a = m.address();
  const auto port = static_cast<uint16_t>(std::atoi(a.substr(a.rfind(':') + 1).c_str()));
  auto body = HttpGet("127.0.0.1", port, "/metrics");
  EXPECT_TRUE(body.has_value());
  std::string error;
  auto samples = ParseExposition(body.value_or(""), &error);
  EXPECT_TRUE(error.empty()) << error;
  return samples;
}

double Value(const std::vector<Sample>& all, std::string_view name,
             const std::map<std::string, std::string>& want) {
  const auto got = Select(all, name, want);
  EXPECT_EQ(got.size(), 1u) << name;
  return got.empty() ? -1 : got[0].value;
}

ExitEvent Mmio(std::string_view device, std::string_view reg) {
  ExitEvent e;
  e.vm = 42;
  e.vcpu = 1;
  e.reason = "MMIO";
  e.subkey_kind = SubKeyKind::kMmio;
  e.subkey = 0xfebf1008;
  e.device = device;
  e.reg = reg;
  return e;
}

TEST(KernelMetrics, SingleExitsAreObservedAndHandedOn) {
  CountingSink next;
  auto m = cli::KernelMetrics::Start("127.0.0.1:0", &next, /*slow_ns=*/1'000'000,
                                     /*have_device_map=*/true);
  ASSERT_TRUE(m) << m.error().message;
  ExitEvent e = Mmio("nvme0", "SQ1TDBL");
  e.duration_ns = 2'000;
  (*m)->OnExit(e);
  e.duration_ns = 30'000'000;  // slow
  (*m)->OnExit(e);
  ExitEvent open = e;
  open.end = ExitEnd::kOpenAtEnd;  // no time: not observed
  (*m)->OnExit(open);
  ExitEvent unassigned = Mmio("", "");
  unassigned.duration_ns = 1'000;
  (*m)->OnExit(unassigned);
  EXPECT_EQ(next.exits, 4);

  auto page = Scrape(**m);
  const std::map<std::string, std::string> sq1 = {
      {"vm", "42"}, {"vcpu", "1"}, {"kind", "MMIO"}, {"device", "nvme0"}, {"register", "SQ1TDBL"}};
  EXPECT_EQ(Value(page, "exitscope_exit_duration_seconds_count", sq1), 2);
  EXPECT_EQ(Value(page, "exitscope_slow_exits_total", sq1), 1);
  EXPECT_EQ(Value(page, "exitscope_exit_duration_seconds_count",
                  {{"device", "unassigned"}, {"register", ""}}),
            1);
  const std::map<std::string, std::string> lost = {{"source", "kernel_trace"},
                                                   {"reason", "ring_overwritten"}};
  EXPECT_EQ(Value(page, "exitscope_lost_records_total", lost), 0);  // present from the start
  (*m)->SetLostEvents(5);
  (*m)->SetLostEvents(3);  // a total never goes back
  EXPECT_EQ(Value(Scrape(**m), "exitscope_lost_records_total", lost), 5);
}

// Each key's batch is its running total: fed again (the next scrape), only the growth counts;
// two keys with the same labels add up; a batch without a source_key is all new.
TEST(KernelMetrics, AggregatesAddWhatEachKeyGained) {
  CountingSink next;
  auto m = cli::KernelMetrics::Start("127.0.0.1:0", &next, 0, false);
  ASSERT_TRUE(m) << m.error().message;
  using base::LatencyHistogram;
  const uint32_t b2us = LatencyHistogram::BucketOf(2'000);        // (1 us, 2.5 us]
  const uint32_t b30ms = LatencyHistogram::BucketOf(30'000'000);  // (25 ms, 50 ms]
  const ExitEvent e = Mmio("nvme0", "SQ1TDBL");
  auto feed = [&](std::string_view key, uint64_t fast, uint64_t slow) {
    const std::vector<std::pair<uint32_t, uint64_t>> buckets = {{b2us, fast}, {b30ms, slow}};
    (*m)->OnSamples(e, {.buckets = buckets,
                        .timed = fast + slow,
                        .sum = fast * 2'000 + slow * 30'000'000,
                        .min = 0,
                        .max = 0,
                        .sum_squares = 0,
                        .untimed = 0,
                        .source_key = key});
  };
  feed("key-a", 10, 1);
  feed("key-b", 5, 0);
  feed("key-a", 10, 1);  // the next scrape, nothing new
  feed("key-a", 12, 2);  // grew by 2 fast, 1 slow
  feed("", 1, 0);        // no identity: counted as it comes
  EXPECT_EQ(next.batches, 5);

  auto page = Scrape(**m);
  const std::map<std::string, std::string> sq1 = {{"device", "nvme0"}, {"register", "SQ1TDBL"}};
  EXPECT_EQ(Value(page, "exitscope_exit_duration_seconds_count", sq1), 12 + 2 + 5 + 1);
  EXPECT_NEAR(Value(page, "exitscope_exit_duration_seconds_sum", sq1),
              (12 + 5 + 1) * 2e-6 + 2 * 30e-3, 1e-9);
  auto le = [&](std::string bound) {
    auto with = sq1;
    with["le"] = std::move(bound);
    return Value(page, "exitscope_exit_duration_seconds_bucket", with);
  };
  EXPECT_EQ(le("1e-06"), 0);
  EXPECT_EQ(le("2.5e-06"), 18);
  EXPECT_EQ(le("0.025"), 18);
  EXPECT_EQ(le("0.05"), 20);
}

}  // namespace
}  // namespace exitscope
