// The HTML report's plots as data (html_report_data.h), and HtmlExitCollector (html_report.h),
// which keeps the exits the timeline and rate plots are drawn from. No markup here.
#include "report/html_report_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "base/histogram.h"

namespace exitscope::report {
namespace html {

using analysis::ExitRow;
using base::LatencyHistogram;
using nlohmann::json;

double Round(double v, double unit) {
  return std::round(v / unit) * unit;
}

// ---- histograms: the rows' own buckets, merged into 4 bins per octave ------------------

namespace {

// Bin of value v: octave n = floor(log2 v), quarter q of it; bin n*4 + q (v = 0 is bin 0,
// with 1). LatencyHistogram's buckets above 127 split each octave into 64 linear buckets, so
// each of them lies inside one quarter: the merge is exact.
size_t QuarterBin(uint64_t v) {
  if (v == 0) return 0;
  const int n = 63 - std::countl_zero(v);
  const uint64_t base = uint64_t{1} << n;
  const uint64_t q = n >= 2 ? ((v - base) >> (n - 2)) : ((v - base) * 4) >> n;
  return static_cast<size_t>(n) * 4 + static_cast<size_t>(q);
}

uint64_t QuarterLow(size_t bin) {
  const size_t n = bin / 4, q = bin % 4;
  return ((uint64_t{1} << n) * (4 + q)) / 4;
}

std::map<size_t, uint64_t> QuarterCounts(const LatencyHistogram& h) {
  std::map<size_t, uint64_t> m;
  if (h.count() == 0) return m;
  const size_t lo = LatencyHistogram::BucketOf(h.min()), hi = LatencyHistogram::BucketOf(h.max());
  for (size_t b = lo; b <= hi; ++b) {
    if (const uint64_t c = h.bucket_count(b)) m[QuarterBin(LatencyHistogram::BucketLow(b))] += c;
  }
  return m;
}

}  // namespace

std::vector<const ExitRow*> RowsOf(const analysis::ExitTable& t) {
  std::vector<const ExitRow*> v;
  for (const auto& r : t.rows) v.push_back(r.get());
  return v;
}

json HistogramPlot(std::string id, std::string title, std::vector<const ExitRow*> rows,
                   size_t series) {
  std::stable_sort(rows.begin(), rows.end(), [](const ExitRow* a, const ExitRow* b) {
    return a->stats.count() > b->stats.count();
  });
  size_t left_out = 0;
  std::vector<std::pair<std::string, std::map<size_t, uint64_t>>> s;
  for (const ExitRow* r : rows) {
    if (r->stats.count() == 0) continue;
    if (s.size() == series) {
      ++left_out;
      continue;
    }
    std::string name = r->key;
    if (!r->name.empty() && r->name != r->key) name += " (" + r->name + ")";
    s.emplace_back(std::move(name), QuarterCounts(r->stats.histogram()));
  }
  size_t lo = SIZE_MAX, hi = 0;
  for (const auto& [name, m] : s) {
    lo = std::min(lo, m.begin()->first);
    hi = std::max(hi, m.rbegin()->first);
  }
  json cats = json::array(), out_series = json::array(), octave = json::array();
  if (!s.empty()) {
    for (size_t b = lo; b <= hi; ++b) {
      cats.push_back(FormatDurationNs(QuarterLow(b)));
      octave.push_back(b % 4 == 0);  // the bin starts a power of two
    }
    for (const auto& [name, m] : s) {
      json data = json::array();
      for (size_t b = lo; b <= hi; ++b) {
        auto it = m.find(b);
        data.push_back(it == m.end() ? json(nullptr) : json(it->second));
      }
      out_series.push_back({{"name", name}, {"data", std::move(data)}});
    }
  }
  return {{"id", std::move(id)},           {"kind", "hist"},       {"title", std::move(title)},
          {"categories", std::move(cats)}, {"series", out_series}, {"octave", std::move(octave)},
          {"left_out", left_out}};
}

// ---- timeline and rate -----------------------------------------------------------------

Timeline TimelinePlots(const HtmlExitCollector& c, const HtmlPlotOptions& o,
                       std::string_view slow_rule) {
  using Point = HtmlExitCollector::Point;
  const auto& pts = c.points();
  const size_t tracks = std::max<size_t>(c.tracks(), 1);
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (const Point& p : pts) {
    t0 = std::min(t0, p.start_ns);
    t1 = std::max(t1, p.start_ns);
  }
  if (pts.empty()) t0 = t1 = 0;
  const uint64_t span = t1 - t0 + 1;
  const auto is_slow = [](const Point& p) { return p.slow != 0; };

  // Slow exits: all of them, or the longest max_slow_points.
  std::vector<uint32_t> slow;
  for (uint32_t i = 0; i < pts.size(); ++i)
    if (is_slow(pts[i])) slow.push_back(i);
  const size_t slow_total = slow.size();
  if (slow.size() > o.max_slow_points) {
    std::nth_element(
        slow.begin(), slow.begin() + static_cast<ptrdiff_t>(o.max_slow_points), slow.end(),
        [&](uint32_t a, uint32_t b) { return pts[a].duration_ns > pts[b].duration_ns; });
    slow.resize(o.max_slow_points);
  }
  // The others: per track and time bin, the longest and the shortest.
  const size_t bins = std::max<size_t>(1, o.max_points / (2 * tracks));
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<std::pair<uint32_t, uint32_t>> pick(tracks * bins, {kNone, kNone});
  const auto bin_of = [&](uint64_t t) {
    return static_cast<size_t>(
        std::min<unsigned __int128>(bins - 1, (unsigned __int128)(t - t0) * bins / span));
  };
  for (uint32_t i = 0; i < pts.size(); ++i) {
    const Point& p = pts[i];
    if (is_slow(p)) continue;
    auto& [lo, hi] = pick[p.track * bins + bin_of(p.start_ns)];
    if (lo == kNone || p.duration_ns < pts[lo].duration_ns) lo = i;
    if (hi == kNone || p.duration_ns > pts[hi].duration_ns) hi = i;
  }
  const auto point_json = [&](const Point& p) {
    return json::array({Round((p.start_ns - t0) / 1e9, 1e-6),
                        Round(std::max<uint64_t>(p.duration_ns, 1) / 1e3, 1e-3), p.label});
  };
  std::vector<json> normal(tracks, json::array()), slow_by_track(tracks, json::array());
  size_t drawn = 0;
  for (const auto& [lo, hi] : pick) {
    for (uint32_t i : {lo, hi}) {
      if (i == kNone || (i == hi && hi == lo)) continue;
      normal[pts[i].track].push_back(point_json(pts[i]));
      ++drawn;
    }
  }
  for (uint32_t i : slow) slow_by_track[pts[i].track].push_back(point_json(pts[i]));
  drawn += slow.size();

  uint64_t dmin = UINT64_MAX, dmax = 1;
  for (const Point& p : pts) {
    dmin = std::min(dmin, std::max<uint64_t>(p.duration_ns, 1));
    dmax = std::max(dmax, p.duration_ns);
  }
  if (pts.empty()) dmin = 1;

  Timeline t;
  const std::vector<std::string> names = c.TrackNames();
  json tr = json::array();
  for (size_t k = 0; k < tracks; ++k) {
    tr.push_back({{"name", k < names.size() ? names[k] : "vCPU"},
                  {"normal", std::move(normal[k])},
                  {"slow", std::move(slow_by_track[k])}});
  }
  // Log axis bounds: whole powers of ten around the data.
  const double ymin = std::pow(10.0, std::floor(std::log10(dmin / 1e3)));
  const double ymax = std::pow(10.0, std::ceil(std::log10(std::max(dmax / 1e3, ymin * 10))));
  t.chart = {{"id", "timeline"},
             {"kind", "timeline"},
             {"title", "Exits over time, per vCPU (log duration)"},
             {"tracks", std::move(tr)},
             {"labels", c.labels()},
             {"t1", Round((t1 - t0) / 1e9, 1e-6)},
             {"ymin", ymin},
             {"ymax", ymax}};
  t.note = fmt::format(
      "{} of {} exits drawn: every slow exit{} ({} slow; slow = {}), and of the others the "
      "longest and the shortest of each of {} time bins per vCPU ({} wide). The rate plot and "
      "the tables count every exit.",
      drawn, pts.size(),
      slow_total > slow.size() ? fmt::format(" up to {} (the longest)", o.max_slow_points) : "",
      slow_total, slow_rule, bins, FormatDurationNs(span / bins));

  // Rate: every exit, per track and bin.
  const size_t rb = std::max<size_t>(1, o.rate_bins);
  std::vector<std::vector<uint64_t>> count(tracks, std::vector<uint64_t>(rb, 0));
  std::vector<uint64_t> slow_count(rb, 0);
  const auto rbin = [&](uint64_t ts) {
    return static_cast<size_t>(
        std::min<unsigned __int128>(rb - 1, (unsigned __int128)(ts - t0) * rb / span));
  };
  for (const Point& p : pts) {
    ++count[p.track][rbin(p.start_ns)];
    if (is_slow(p)) ++slow_count[rbin(p.start_ns)];
  }
  const double width_s = static_cast<double>(span) / rb / 1e9;
  json series = json::array();
  const auto line = [&](std::string name, const std::vector<uint64_t>& v) {
    json data = json::array();
    for (size_t b = 0; b < rb; ++b)
      data.push_back(json::array(
          {Round((b + 0.5) * width_s, 1e-6), Round(static_cast<double>(v[b]) / width_s, 0.1)}));
    series.push_back({{"name", std::move(name)}, {"data", std::move(data)}});
  };
  for (size_t k = 0; k < tracks; ++k) line(k < names.size() ? names[k] : "vCPU", count[k]);
  if (slow_total > 0) line("slow exits (all vCPUs)", slow_count);
  t.rate = {{"id", "rate"},
            {"kind", "rate"},
            {"title", fmt::format("Exit rate over time ({} bins of {})", rb,
                                  FormatDurationNs(static_cast<uint64_t>(width_s * 1e9)))},
            {"series", std::move(series)}};
  return t;
}

// ---- the joint view's split -----------------------------------------------------------

Plot JointSplitPlot(std::string id, std::string_view what,
                    const std::vector<analysis::JointGroup>& groups, bool sched, size_t max_rows) {
  json cats = json::array(), counts = json::array(), parts = json::array(),
       total_mean = json::array();
  std::vector<std::pair<const char*, analysis::JointPart analysis::JointGroup::*>> defs = {
      {"kernel before", &analysis::JointGroup::before},
      {"handler (VMM)", &analysis::JointGroup::handler},
      {"kernel after", &analysis::JointGroup::after}};
  if (sched) defs.push_back({"off-CPU", &analysis::JointGroup::off_cpu});
  const size_t n = std::min(groups.size(), max_rows);
  for (size_t i = 0; i < n; ++i) {
    cats.push_back(groups[i].key);
    counts.push_back(groups[i].count);
    total_mean.push_back(
        Round(static_cast<double>(groups[i].total.sum_ns) / groups[i].count / 1e3, 1e-3));
  }
  for (const auto& [name, field] : defs) {
    json mean = json::array(), share = json::array(), p50 = json::array(), p99 = json::array();
    for (size_t i = 0; i < n; ++i) {
      const analysis::JointPart& part = groups[i].*field;
      mean.push_back(Round(static_cast<double>(part.sum_ns) / groups[i].count / 1e3, 1e-3));
      const uint64_t total = groups[i].total.sum_ns;
      share.push_back(total ? Round(100.0 * part.sum_ns / total, 0.01) : 0.0);
      p50.push_back(part.p50_ns);
      p99.push_back(part.p99_ns);
    }
    parts.push_back(
        {{"name", name}, {"mean_us", mean}, {"share", share}, {"p50", p50}, {"p99", p99}});
  }
  return {{{"id", std::move(id)},
           {"kind", "split"},
           {"title", fmt::format("Split of the kernel's exit time by {}", what)},
           {"categories", cats},
           {"counts", counts},
           {"mean_us", total_mean},
           {"parts", parts}},
          groups.size() > n ? fmt::format("{} of {} rows drawn.", n, groups.size()) : ""};
}

}  // namespace html

// ---- the collector ---------------------------------------------------------------------

HtmlExitCollector::HtmlExitCollector(analysis::SlowRule slow,
                                     std::function<bool(const ExitEvent&)> pass, bool group_targets)
    : slow_(slow), pass_(std::move(pass)) {
  if (group_targets) {
    devices_ = std::make_unique<analysis::ExitGrouper>(&by_device_);
    registers_ = std::make_unique<analysis::ExitGrouper>(&by_register_);
  }
}

void HtmlExitCollector::Finish() {
  analysis::SortInPlace(by_device_, analysis::RowOrder::kTime);
  analysis::SortInPlace(by_register_, analysis::RowOrder::kTime);
}

void HtmlExitCollector::OnExit(const ExitEvent& e) {
  if (e.end != ExitEnd::kSeen || e.kernel_access) return;
  if (pass_ && !pass_(e)) return;
  auto [it, fresh] = tracks_.try_emplace({e.vm, e.vcpu}, static_cast<uint32_t>(tracks_.size()));
  // The label: reason, and where the access went (device.register and direction).
  scratch_.assign(e.reason);
  if (e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio) {
    scratch_ += ' ';
    scratch_ += e.device.empty() ? fmt::format("unassigned {:#x}", e.subkey)
                                 : (e.reg.empty() ? std::string(e.device)
                                                  : fmt::format("{}.{}", e.device, e.reg));
    if (e.dir != AccessDir::kNone) {
      scratch_ += ' ';
      scratch_ += ToString(e.dir);
    }
  } else if (!e.device.empty()) {
    scratch_ += ' ';
    scratch_ += e.device;
  }
  auto [lit, lfresh] = label_index_.try_emplace(scratch_, static_cast<uint32_t>(labels_.size()));
  if (lfresh) labels_.push_back(scratch_);
  Point p{};
  p.start_ns = e.start_ns;
  p.duration_ns = e.duration_ns;
  // Tracks are numbered in first-seen order; TrackNames renumbers nothing.
  p.track = it->second;
  p.label = lit->second & 0x7fffffffu;
  p.slow = slow_.IsSlow(e) ? 1 : 0;
  points_.push_back(p);
  if (devices_ == nullptr) return;
  for (auto [k, g] : {std::pair{analysis::ExitKey::kDevice, devices_.get()},
                      std::pair{analysis::ExitKey::kRegister, registers_.get()}}) {
    analysis::RowKey key;
    if (!analysis::KeyOf(k, e, &key, &scratch_)) continue;
    const analysis::ExitKey kk = k;
    g->Add(g->Row(key, [&] { return analysis::RowText{analysis::KeyText(kk, key), {}}; }), e);
  }
}

std::vector<std::string> HtmlExitCollector::TrackNames() const {
  std::vector<std::string> names(tracks_.size());
  const bool several_vms =
      !tracks_.empty() && tracks_.begin()->first.first != tracks_.rbegin()->first.first;
  for (const auto& [key, index] : tracks_) {
    names[index] = several_vms ? fmt::format("VM {} vCPU {}", key.first, key.second)
                               : fmt::format("vCPU {}", key.second);
  }
  return names;
}

}  // namespace exitscope::report
