#include "report/row_json.h"

#include <bit>

#include "report/format.h"

namespace exitscope::report {

nlohmann::json RowJson(const analysis::ExitRow& r, const analysis::ExitTable& g, bool histogram) {
  using base::LatencyHistogram;
  const auto& s = r.stats;
  const bool timed = s.count() != 0;
  const auto t = [timed](auto v) { return timed ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json j = {
      {"key", r.key},
      {"name", r.name},
      {"samples", r.samples()},
      {"samples_pct", PercentOf(r.samples(), g.samples)},
      {"count", s.count()},
      {"timed_samples", s.count()},
      {"untimed_samples", r.untimed},
      {"to_vmm", r.to_vmm()},
      {"in_kernel", r.in_kernel},
      {"time_ns", s.sum()},
      {"total_ns", s.sum()},
      {"time_pct", PercentOf(s.sum(), g.time_ns)},
      {"min_ns", t(s.min())},
      {"max_ns", t(s.max())},
      {"mean_ns", t(s.mean())},
      {"stderr_pct", t(s.RelStdErrPercent())},
      {"p50_ns", t(s.Quantile(0.5))},
      {"p90_ns", t(s.Quantile(0.9))},
      {"p99_ns", t(s.Quantile(0.99))},
      {"p999_ns", t(s.Quantile(0.999))},
  };
  if (histogram) {
    // Power-of-two bins: [le_ns / 2, le_ns) -> count, empty bins omitted.
    nlohmann::json bins = nlohmann::json::array();
    const LatencyHistogram& h = s.histogram();
    uint64_t cur_le = 0, cur = 0;
    for (size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
      const uint64_t c = h.bucket_count(b);
      if (c == 0) continue;
      const uint64_t lo = LatencyHistogram::BucketLow(b);
      const uint64_t le = lo == 0 ? 1 : std::bit_floor(lo) << 1;
      if (le != cur_le && cur != 0) {
        bins.push_back({{"le_ns", cur_le}, {"count", cur}});
        cur = 0;
      }
      cur_le = le;
      cur += c;
    }
    if (cur != 0) bins.push_back({{"le_ns", cur_le}, {"count", cur}});
    j["histogram"] = std::move(bins);
  }
  return j;
}

}  // namespace exitscope::report
