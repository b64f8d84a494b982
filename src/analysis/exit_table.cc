#include "analysis/exit_table.h"

#include <algorithm>
#include <charconv>

#include "base/text.h"

namespace exitscope::analysis {
namespace {

using base::Hex;  // the one Hex(): "0x1f", "0x0"

bool HasTarget(const ExitEvent& e) {
  return e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio;
}

uint64_t KeyNumber(const std::string& key) {
  uint64_t v = 0;
  std::from_chars(key.data(), key.data() + key.size(), v);
  return v;
}

double OrderValue(const ExitRow* r, RowOrder order) {
  const LatencyStats& s = r->stats;
  switch (order) {
    case RowOrder::kSample:
      return static_cast<double>(s.count());
    case RowOrder::kTime:
      return static_cast<double>(s.sum());
    case RowOrder::kMax:
      return static_cast<double>(s.max());
    case RowOrder::kMin:
      return static_cast<double>(s.min());
    case RowOrder::kAvg:
      return s.mean();
    case RowOrder::kP50:
      return static_cast<double>(s.Quantile(0.5));
    case RowOrder::kP99:
      return static_cast<double>(s.Quantile(0.99));
    case RowOrder::kP999:
      return static_cast<double>(s.Quantile(0.999));
    case RowOrder::kKeyNumber:
      break;
  }
  return 0;
}

bool Before(const ExitRow* a, const ExitRow* b, RowOrder order) {
  if (order == RowOrder::kKeyNumber) {
    const uint64_t na = KeyNumber(a->key), nb = KeyNumber(b->key);
    if (na != nb) return na < nb;
    return a->key < b->key;
  }
  const double va = OrderValue(a, order), vb = OrderValue(b, order);
  if (va != vb) return va > vb;
  return a->key < b->key;
}

}  // namespace

ExitRow* ExitGrouper::Find(const RowKey& key) const {
  for (const Recent& r : recent_) {
    if (r.row != nullptr && r.key == key) return r.row;
  }
  const auto it = rows_.find(key);
  return it == rows_.end() ? nullptr : it->second;
}

ExitGrouper::Index::iterator ExitGrouper::Insert(const RowKey& key, RowText text) {
  auto row = std::make_unique<ExitRow>();
  row->key = std::move(text.key);
  row->name = std::move(text.name);
  RowKey stored = key;
  if (!stored.name.empty()) {
    // Own the bytes the index key views: the row's key text when it is the name itself,
    // else a copy kept beside the rows.
    if (row->key == key.name) {
      stored.name = row->key;
    } else {
      names_.push_back(std::make_unique<std::string>(key.name));
      stored.name = *names_.back();
    }
  }
  const auto it = rows_.emplace(stored, row.get()).first;
  table_->rows.push_back(std::move(row));
  return it;
}

void ExitGrouper::Add(ExitRow& row, const ExitEvent& e) noexcept {
  ExitTable& t = *table_;
  ++t.samples;
  if (e.kernel_access || !e.userspace) {
    ++row.in_kernel;
    ++t.in_kernel;
  }
  if (e.end != ExitEnd::kSeen) {
    ++row.untimed;
    ++t.untimed;
    return;
  }
  row.stats.Add(e.duration_ns);
  t.time_ns += e.duration_ns;
}

void ExitGrouper::Add(ExitRow& row, const ExitEvent& e, const SampleBatch& b) noexcept {
  ExitTable& t = *table_;
  uint64_t timed = 0;
  if (b.timed != 0) {
    const uint64_t before = row.stats.count();
    row.stats.MergeBuckets(b.buckets, b.sum, b.min, b.max, b.sum_squares);
    timed = row.stats.count() - before;
    t.time_ns += b.sum;
  }
  const uint64_t n = timed + b.untimed;
  t.samples += n;
  row.untimed += b.untimed;
  t.untimed += b.untimed;
  if (e.kernel_access || !e.userspace) {
    row.in_kernel += n;
    t.in_kernel += n;
  }
}

std::string TargetName(const ExitEvent& e) {
  if (!HasTarget(e)) return std::string(e.reason);
  if (e.device.empty()) return "unassigned " + Hex(e.subkey);
  std::string s(e.device);
  if (!e.reg.empty()) return s + "." + std::string(e.reg);
  if (e.device_offset != ExitEvent::kNoOffset) return s + "+" + Hex(e.device_offset);
  return s + " " + Hex(e.subkey);
}

bool KeyOf(ExitKey k, const ExitEvent& e, RowKey* key, std::string* scratch) {
  *key = RowKey{};
  switch (k) {
    case ExitKey::kReason:
      key->name = e.reason;
      return true;
    case ExitKey::kDevice:
      if (!HasTarget(e)) return false;
      key->name = e.device.empty() ? std::string_view("unassigned") : e.device;
      return true;
    case ExitKey::kRegister:
      if (!HasTarget(e)) return false;
      *scratch = TargetName(e);
      *scratch += ' ';
      *scratch += ToString(e.dir);
      key->name = *scratch;
      return true;
    case ExitKey::kVcpu:
      key->sub = e.vcpu;
      return true;
    case ExitKey::kVm:
      key->sub = e.vm;
      return true;
  }
  return false;
}

std::string KeyText(ExitKey k, const RowKey& key) {
  switch (k) {
    case ExitKey::kReason:
    case ExitKey::kDevice:
    case ExitKey::kRegister:
      return std::string(key.name);
    case ExitKey::kVcpu:
    case ExitKey::kVm:
      return std::to_string(key.sub);
  }
  return {};
}

std::vector<const ExitRow*> SortedRows(const ExitTable& t, RowOrder order) {
  std::vector<const ExitRow*> rows;
  rows.reserve(t.rows.size());
  for (const auto& r : t.rows) rows.push_back(r.get());
  std::stable_sort(rows.begin(), rows.end(),
                   [order](const ExitRow* a, const ExitRow* b) { return Before(a, b, order); });
  return rows;
}

void SortInPlace(ExitTable& t, RowOrder order) {
  std::stable_sort(t.rows.begin(), t.rows.end(),
                   [order](const std::unique_ptr<ExitRow>& a, const std::unique_ptr<ExitRow>& b) {
                     return Before(a.get(), b.get(), order);
                   });
}

}  // namespace exitscope::analysis
