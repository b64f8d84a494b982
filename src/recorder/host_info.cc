// Process and host information carried in snapshots and dumps (ProcessInfo, HostInfo), read
// from /proc and uname(2).
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "exitscope/dump.h"
#include "recorder/describe.h"

namespace exitscope {
namespace internal {

namespace {
std::string ReadSmallFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

ProcessInfo ReadProcessInfo() {
  ProcessInfo p;
  p.pid = getpid();
  p.comm = ReadSmallFile("/proc/self/comm");
  while (!p.comm.empty() && (p.comm.back() == '\n' || p.comm.back() == '\0')) p.comm.pop_back();
  const std::string cmdline = ReadSmallFile("/proc/self/cmdline");
  size_t i = 0;
  while (i < cmdline.size()) {
    size_t z = cmdline.find('\0', i);
    if (z == std::string::npos) z = cmdline.size();
    p.argv.push_back(cmdline.substr(i, z - i));
    i = z + 1;
  }
  // Start time: field 22 of /proc/self/stat (after the ")" of comm) + btime of /proc/stat.
  const std::string stat = ReadSmallFile("/proc/self/stat");
  const size_t rp = stat.rfind(')');
  if (rp != std::string::npos) {
    std::istringstream in(stat.substr(rp + 1));
    std::string field;
    unsigned long long start_ticks = 0;
    for (int f = 3; f <= 22 && (in >> field); ++f) {
      if (f == 22) start_ticks = std::strtoull(field.c_str(), nullptr, 10);
    }
    std::istringstream ps(ReadSmallFile("/proc/stat"));
    std::string line;
    unsigned long long btime = 0;
    while (std::getline(ps, line)) {
      if (line.rfind("btime ", 0) == 0) btime = std::strtoull(line.c_str() + 6, nullptr, 10);
    }
    const long hz = sysconf(_SC_CLK_TCK);
    if (btime != 0 && hz > 0) {
      p.start_realtime_ns = btime * 1000000000ull +
                            start_ticks * (1000000000ull / static_cast<unsigned long long>(hz));
    }
  }
  return p;
}

HostInfo ReadHostInfo() {
  HostInfo h;
  utsname u;
  if (uname(&u) == 0) {
    h.sysname = u.sysname;
    h.nodename = u.nodename;
    h.release = u.release;
    h.version = u.version;
    h.machine = u.machine;
  }
  std::istringstream in(ReadSmallFile("/proc/cpuinfo"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos)
        h.cpu_model = line.substr(c + 1 + (c + 1 < line.size() && line[c + 1] == ' '));
      break;
    }
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  h.cpus = n > 0 ? static_cast<uint32_t>(n) : 0;
  return h;
}

}  // namespace internal
}  // namespace exitscope
