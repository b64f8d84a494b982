// sources/tracefs_settings.cc: the byte-for-byte snapshot of a buffer's settings and its
// restore (TracefsSettings), and the buffer_size_kb forms they compare (ParseBufferSizeKb,
// SameBufferSize).
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string_view>

#include "base/clock_name.h"
#include "fmt/format.h"
#include "sources/tracefs_session.h"
#include "sources/tracefs_session_internal.h"

namespace exitscope::sources {

using tracefs_internal::Exists;
using tracefs_internal::ListDir;
using tracefs_internal::ParseDecimal;
using tracefs_internal::Trim;

namespace {

// Files a restore writes, in the order it writes them. Lower rank first.
int RestoreRank(const std::string& rel) {
  // events/SYS/EVENT/enable; events/SYS/enable only summarises its events ("X" when mixed).
  if (rel.ends_with("/enable")) return std::count(rel.begin(), rel.end(), '/') == 3 ? 0 : -1;
  if (rel.ends_with("/filter")) return 1;
  if (rel == "set_event_pid") return 2;
  if (rel == "options/event-fork") return 3;
  if (rel == "trace_clock") return 4;
  if (rel == "buffer_size_kb") return 5;
  if (rel.starts_with("per_cpu/")) return 6;
  if (rel == "tracing_on") return 7;
  return -1;  // derived: compared, never written
}

bool IsBufferSizeFile(const std::string& rel) {
  return rel == "buffer_size_kb" ||
         (rel.starts_with("per_cpu/") && rel.ends_with("/buffer_size_kb"));
}

// What to write to `rel` so that reading it gives `content` back (for a buffer that was never
// expanded: the size it expands to, see TracefsSettings).
std::string RestoreValue(const std::string& rel, const std::string& content) {
  const std::string t = Trim(content);
  if (rel.ends_with("/filter")) return t == "none" ? "0" : t;
  if (rel == "trace_clock") return base::SelectedClock(content);
  if (rel == "set_event_pid") {
    std::string v = t;
    std::replace(v.begin(), v.end(), '\n', ' ');
    return v;
  }
  if (IsBufferSizeFile(rel)) {
    if (auto size = ParseBufferSizeKb(t); size && !size->mixed)
      return std::to_string(size->expanded_kb.value_or(size->kb));
    return t;
  }
  if (rel.ends_with("/enable")) return t.substr(0, 1);  // "1*" (soft mode) -> "1"
  return t;
}

// Bytes of data per page from an events/header_page file ("field: char data; offset:16;
// size:4080; ..."); 0 when it does not say.
uint64_t HeaderPageDataBytes(const std::string& header_page) {
  const size_t field = header_page.find("char data;");
  if (field == std::string::npos) return 0;
  const size_t size = header_page.find("size:", field);
  if (size == std::string::npos) return 0;
  const size_t end = header_page.find(';', size);
  if (end == std::string::npos) return 0;
  return ParseDecimal(std::string_view(header_page).substr(size + 5, end - size - 5)).value_or(0);
}

uint64_t PagesFor(uint64_t kb, uint64_t page_data_bytes) {
  return (kb * 1024 + page_data_bytes - 1) / page_data_bytes;
}

}  // namespace

Result<BufferSizeKb> ParseBufferSizeKb(std::string_view content) {
  std::string_view t = content;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
  BufferSizeKb out;
  if (t == "X") {
    out.mixed = true;
    return out;
  }
  std::string_view kb = t;
  constexpr std::string_view kExpanded = " (expanded: ";
  if (const size_t at = t.find(kExpanded); at != std::string_view::npos) {
    kb = t.substr(0, at);
    std::string_view rest = t.substr(at + kExpanded.size());
    if (rest.ends_with(')')) out.expanded_kb = ParseDecimal(rest.substr(0, rest.size() - 1));
    if (!out.expanded_kb) kb = {};  // refused below
  }
  const std::optional<uint64_t> v = ParseDecimal(kb);
  if (!v) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("buffer_size_kb '{}': expected KB, 'KB (expanded: KB)' or 'X'", t));
  }
  out.kb = *v;
  return out;
}

bool SameBufferSize(std::string_view saved, std::string_view now, uint64_t page_data_bytes) {
  auto a = ParseBufferSizeKb(saved), b = ParseBufferSizeKb(now);
  if (!a || !b) return saved == now;
  if (a->mixed || b->mixed) return a->mixed && b->mixed;
  if (a->expanded_kb && !b->expanded_kb && page_data_bytes > 0)
    return PagesFor(*a->expanded_kb, page_data_bytes) == PagesFor(b->kb, page_data_bytes);
  return a->kb == b->kb && a->expanded_kb == b->expanded_kb;
}

// ---------------------------------------------------------------------------------------------
// TracefsSettings

Result<TracefsSettings> TracefsSettings::Capture(const std::string& buffer_dir,
                                                 const std::vector<std::string>& systems) {
  TracefsSettings s;
  s.dir_ = buffer_dir;
  std::vector<std::string> rels = {"tracing_on",    "trace_clock",        "buffer_size_kb",
                                   "set_event_pid", "options/event-fork", "set_event",
                                   "current_tracer"};
  for (const std::string& cpu : ListDir(buffer_dir + "/per_cpu", true))
    rels.push_back("per_cpu/" + cpu + "/buffer_size_kb");
  for (const std::string& sys : systems) {
    rels.push_back("events/" + sys + "/enable");
    for (const std::string& ev : ListDir(buffer_dir + "/events/" + sys, true)) {
      rels.push_back("events/" + sys + "/" + ev + "/enable");
      rels.push_back("events/" + sys + "/" + ev + "/filter");
    }
  }
  for (const std::string& rel : rels) {
    const std::string path = buffer_dir + "/" + rel;
    if (!Exists(path)) continue;
    auto content = ReadTracefsFile(path);
    if (!content) return Propagate(content);
    s.files_.emplace_back(rel, std::move(*content));
  }
  // Page geometry, to compare an unexpanded size with the size the kernel expands it to.
  uint64_t data_bytes = 0;
  if (auto hp = ReadTracefsFile(buffer_dir + "/events/header_page")) {
    data_bytes = HeaderPageDataBytes(*hp);
  }
  if (data_bytes == 0) {
    uint64_t subbuf = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (auto kb = ReadTracefsFile(buffer_dir + "/buffer_subbuf_size_kb"))
      if (auto v = ParseDecimal(Trim(*kb)); v && *v > 0) subbuf = *v * 1024;
    data_bytes = subbuf - 16;  // the page header: u64 timestamp, local_t commit
  }
  s.page_data_bytes_ = data_bytes;
  return s;
}

const std::string* TracefsSettings::Find(const std::string& rel) const {
  for (const auto& f : files_)
    if (f.first == rel) return &f.second;
  return nullptr;
}

Status TracefsSettings::Restore() const {
  std::vector<const std::pair<std::string, std::string>*> order;
  for (const auto& f : files_)
    if (RestoreRank(f.first) >= 0) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return RestoreRank(a->first) < RestoreRank(b->first);
  });
  // An unexpanded buffer: the total is restored to the expanded size on every CPU, and the
  // per-CPU files, which read the 7 KiB placeholder, are left alone (writing "7" there is
  // what shrank the host's buffer).
  const std::string* total = Find("buffer_size_kb");
  const auto total_size = total ? ParseBufferSizeKb(*total) : Result<BufferSizeKb>(BufferSizeKb{});
  const bool unexpanded = total_size && total_size->expanded_kb.has_value();
  Status first_error;
  for (const auto* f : order) {
    const std::string path = dir_ + "/" + f->first;
    // "X": per-CPU sizes differ; they are restored one by one.
    if (f->first == "buffer_size_kb" && total_size && total_size->mixed) continue;
    if (unexpanded && f->first.starts_with("per_cpu/")) continue;
    auto now = ReadTracefsFile(path);
    // Read again at its turn: per-CPU sizes follow the total once that is restored.
    if (now && *now == f->second) continue;
    if (now && IsBufferSizeFile(f->first) && SameBufferSize(f->second, *now, page_data_bytes_))
      continue;
    Status st = WriteTracefsFile(path, RestoreValue(f->first, f->second));
    if (!st && first_error) first_error = st;
  }
  return first_error;
}

std::vector<std::string> TracefsSettings::Diff(const TracefsSettings& other) const {
  std::vector<std::string> out;
  // The expanded size an unexpanded buffer promised, for its per-CPU placeholder sizes.
  std::optional<uint64_t> promised;
  if (const std::string* total = Find("buffer_size_kb"))
    if (auto size = ParseBufferSizeKb(*total); size) promised = size->expanded_kb;
  for (const auto& [rel, content] : files_) {
    auto it = std::find_if(other.files_.begin(), other.files_.end(),
                           [&](const auto& f) { return f.first == rel; });
    if (it == other.files_.end()) {
      out.push_back(fmt::format("{}: missing in the other snapshot", rel));
    } else if (it->second == content) {
      continue;
    } else if (IsBufferSizeFile(rel)) {
      std::string saved = content;
      if (promised && rel != "buffer_size_kb")
        saved = fmt::format("{} (expanded: {})", Trim(content), *promised);
      if (!SameBufferSize(saved, it->second, page_data_bytes_))
        out.push_back(fmt::format("{}: '{}' -> '{}'", rel, Trim(content), Trim(it->second)));
    } else {
      out.push_back(fmt::format("{}: '{}' -> '{}'", rel, Trim(content), Trim(it->second)));
    }
  }
  for (const auto& [rel, content] : other.files_) {
    if (std::none_of(files_.begin(), files_.end(), [&](const auto& f) { return f.first == rel; }))
      out.push_back(fmt::format("{}: new in the other snapshot", rel));
  }
  return out;
}
}  // namespace exitscope::sources
