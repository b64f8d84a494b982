// sources/tracecmd_dat_sandbox.cc: the event formats of a .dat parsed by libtraceevent, first
// in a capped child (tracecmd_dat_layout.h).

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <traceevent/event-parse.h>
extern "C" {
#include <traceevent/kbuffer.h>  // no extern "C" of its own
}
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "base/clock_name.h"
#include "base/text.h"
#include "sources/kvm_trace.h"
#include "sources/tracecmd_dat_layout.h"

namespace exitscope::sources::dat {

std::vector<size_t> FormatsToParse(const Layout& L) {
  std::vector<size_t> out;
  for (size_t i = 0; i < L.formats.size(); ++i) {
    const Layout::Format& f = L.formats[i];
    if (f.declared && KvmDecoderReads(f.system, f.name)) out.push_back(i);
  }
  if (out.empty() && !L.formats.empty()) out.push_back(0);
  return out;
}

bool ScanFormatHeader(std::string_view text, std::string_view* name, uint32_t* id) noexcept {
  bool have_name = false, have_id = false;
  // The header lines come first; "format:" ends them.
  for (int line = 0; line < 4 && !text.empty(); ++line) {
    const size_t nl = text.find('\n');
    std::string_view l = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (l.starts_with("name:")) {
      l.remove_prefix(5);
      while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
      while (!l.empty() && (l.back() == ' ' || l.back() == '\t' || l.back() == '\r')) {
        l.remove_suffix(1);
      }
      if (l.empty()) return false;
      *name = l;
      have_name = true;
    } else if (l.starts_with("ID:")) {
      l.remove_prefix(3);
      while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
      uint32_t v = 0;
      const auto [end, ec] = std::from_chars(l.data(), l.data() + l.size(), v);
      if (ec != std::errc() || end == l.data()) return false;
      *id = v;
      have_id = true;
    } else if (l.starts_with("format:")) {
      break;
    }
  }
  return have_name && have_id;
}

tep_handle* BuildTep(const Layout& L, volatile uint64_t* progress,
                     std::vector<FormatFailure>* failures) {
  tep_handle* tep = tep_alloc();
  if (tep == nullptr) return nullptr;
  tep_set_loglevel(TEP_LOG_NONE);
  tep_set_file_bigendian(tep, L.big ? TEP_BIG_ENDIAN : TEP_LITTLE_ENDIAN);
  tep_set_local_bigendian(
      tep, std::endian::native == std::endian::big ? TEP_BIG_ENDIAN : TEP_LITTLE_ENDIAN);
  tep_set_long_size(tep, static_cast<int>(L.long_size));
  tep_set_page_size(tep, static_cast<int>(L.page_size));
  std::string header = L.header_page;
  if (progress) *progress = L.header_page_offset;
  if (tep_parse_header_page(tep, header.data(), header.size(), static_cast<int>(L.long_size)) !=
          0 &&
      failures) {
    failures->push_back({L.header_page_offset, "header_page", 0});
  }
  for (const size_t i : FormatsToParse(L)) {
    const Layout::Format& f = L.formats[i];
    if (progress) *progress = f.offset;
    // A format libtraceevent refuses leaves its event undefined, as in trace-cmd report.
    const int rc = tep_parse_event(tep, f.text.data(), f.text.size(), f.system.c_str());
    if (rc != 0 && failures) failures->push_back({f.offset, f.system, rc});
  }
  return tep;
}

// Runs BuildTep in a child process first: libtraceevent crashes (SIGSEGV, SIGFPE) or loops
// on some corrupt formats. Returns the error for a child that did not exit cleanly.
Status ProbeFormatsInChild(const Layout& L, const std::string& path, uint64_t file_size) {
  void* shared =
      ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot map memory to check the event formats: {}",
                                            path, std::strerror(errno)));
  }
  auto* progress = static_cast<volatile uint64_t*>(shared);
  *progress = 0;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::munmap(shared, sizeof(uint64_t));
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot fork to check the event formats: {}", path,
                                            std::strerror(errno)));
  }
  if (pid == 0) {
    // The child's memory is bounded too: formats are at most 64 MiB per section.
    struct rlimit cpu {
      10, 10
    };
    ::setrlimit(RLIMIT_CPU, &cpu);
    ::alarm(30);
    // Whatever the child prints as it parses or dies (libtraceevent's warnings, a sanitizer's
    // report of the crash) is not for the user: the parent reports the outcome in one line.
    if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, 2);
    tep_handle* tep = BuildTep(L, progress);
    ::_exit(tep != nullptr ? 0 : 3);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const uint64_t last = *progress;
  const uint64_t at = std::min<uint64_t>(last, file_size);
  ::munmap(shared, sizeof(uint64_t));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  const std::string how = WIFSIGNALED(status)
                              ? fmt::format("died of {}", ::sigabbrev_np(WTERMSIG(status))
                                                              ? ::sigabbrev_np(WTERMSIG(status))
                                                              : "a signal")
                              : fmt::format("exited with status {}", WEXITSTATUS(status));
  return Fail(ErrorCode::kCorrupt,
              fmt::format("{}: offset {}: corrupt file: libtraceevent failed on the event format "
                          "at offset {} (its parser {} in a child process)",
                          path, at, at, how));
}

}  // namespace exitscope::sources::dat
