// A real Prometheus (Debian's `prometheus`, installed by scripts/install-deps.sh) scrapes
// exitscope's endpoint every second, and the p99 exit latency by device and register that it
// computes names the register whose exits were delayed:
//
//   histogram_quantile(0.99, sum by (le, device, register)
//                                (rate(exitscope_exit_duration_seconds_bucket[10s])))
//
// for nvme0 / SQ1TDBL >= 20 ms, with every 4th SQ1TDBL exit delayed by 30 ms. With /dev/kvm the
// endpoint is `exitscope run --guest blk --inject delay:nvme0.SQ1TDBL:30:4 --metrics ...`;
// without it, the library in a small test VMM in this process (a thread recording the same
// exits). Prometheus and exitscope run on 127.0.0.1 with free ports, a temporary storage
// directory and a config written here; both are stopped at the end, also when the test fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/metrics.h"
#include "exitscope/recorder.h"
#include "metrics_text.h"
#include "nlohmann/json.hpp"
#include "support/run.h"

namespace exitscope {
namespace {

namespace fs = std::filesystem;
using test::FreePort;
using testing::HttpGet;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kQuery =
    "histogram_quantile(0.99, sum by (le, device, register) "
    "(rate(exitscope_exit_duration_seconds_bucket[10s])))";

bool HaveKvm() {
  const int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// A child process, stopped (SIGTERM, then SIGKILL after 10 s) when this goes out of scope.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Child() { Stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool running() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string UrlEncode(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// The test VMM where there is no /dev/kvm: a recorder with nvme0, and one "vCPU" thread that
// records doorbell exits to SQ1TDBL (every 4th held for 30 ms, as --inject delay:...:30:4) and
// to CQ1HDBL, served on `port`.
class LibraryVmm {
 public:
  explicit LibraryVmm(uint16_t port) {
    RecorderOptions o;
    o.num_vcpus = 1;
    o.start_watchdog = false;
    o.slow_exit.log = false;
    auto r = Recorder::Create(o);
    if (!r) {
      error_ = r.error().message;
      return;
    }
    rec_ = std::move(*r);
    AddressSpace& as = rec_->address_space();
    const uint32_t nvme = *as.AddDevice({.name = "nvme0", .kind = "nvme"});
    if (auto st =
            as.AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme, *RegisterMap::Builtin("nvme"));
        !st) {
      error_ = st.error().message;
      return;
    }
    MetricsOptions mo;
    mo.listen = "127.0.0.1:" + std::to_string(port);
    auto e = MetricsExporter::Start(*rec_, mo);
    if (!e) {
      error_ = e.error().message;
      return;
    }
    exporter_ = std::move(*e);
    thread_ = std::thread([this] {
      for (uint64_t n = 0; !stop_.load(); ++n) {
        rec_->BeginExit(0, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, n);
        if (n % 4 == 3) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        rec_->EndExit(0);
        rec_->BeginExit(0, ExitKind::kMmio, 0xfebf100c, 4, AccessDir::kWrite, n);
        rec_->EndExit(0);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  ~LibraryVmm() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    exporter_.reset();
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
  std::unique_ptr<Recorder> rec_;
  std::unique_ptr<MetricsExporter> exporter_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(PrometheusScrape, P99ByDeviceAndRegisterNamesTheDelayedRegister) {
  if (::access(kPrometheus, X_OK) != 0)
    GTEST_SKIP() << kPrometheus << " not found: Debian's prometheus could not be installed by "
                 << "scripts/install-deps.sh";
  const uint16_t es_port = FreePort(), prom_port = FreePort();
  ASSERT_NE(es_port, 0);
  ASSERT_NE(prom_port, 0);
  char tmpl[] = "/tmp/exitscope-prom-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  struct RemoveDir {
    fs::path p;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};

  {
    std::ofstream cfg(dir / "prometheus.yml");
    cfg << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n  - job_name: exitscope\n    scrape_interval: 1s\n"
        << "    static_configs:\n      - targets: ['127.0.0.1:" << es_port << "']\n";
  }

  // The endpoint: exitscope run on KVM, else the library in this process.
  std::unique_ptr<Child> run;
  std::unique_ptr<LibraryVmm> lib;
  // EXITSCOPE_METRICS_TEST_LIBRARY=1 takes the no-KVM path on a KVM host too.
  const bool kvm = HaveKvm() && std::getenv("EXITSCOPE_METRICS_TEST_LIBRARY") == nullptr;
  if (kvm) {
    run = std::make_unique<Child>(
        std::vector<std::string>{
            std::string(EXITSCOPE_BINARY_DIR) + "/exitscope", "run", "--guest", "blk",
            "--guest-arg", "1000000", "--disk", (dir / "disk.img").string(), "--inject",
            "delay:nvme0.SQ1TDBL:30:4", "--metrics", "127.0.0.1:" + std::to_string(es_port),
            "--duration", "90", "--no-dump", "--serial", (dir / "serial.txt").string()},
        (dir / "run.log").string());
  } else {
    std::printf("no /dev/kvm here: the endpoint is the library in a test VMM in this process\n");
    lib = std::make_unique<LibraryVmm>(es_port);
    ASSERT_TRUE(lib->error().empty()) << lib->error();
  }
  Child prom({kPrometheus, "--config.file=" + (dir / "prometheus.yml").string(),
              "--storage.tsdb.path=" + (dir / "data").string(),
              "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"},
             (dir / "prometheus.log").string());

  const std::string url = "/api/v1/query?query=" + UrlEncode(kQuery);
  double p99 = -1;
  std::string last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ASSERT_TRUE(prom.running()) << "prometheus exited:\n" << Slurp(dir / "prometheus.log");
    if (run) {
      ASSERT_TRUE(run->running()) << "exitscope run exited:\n" << Slurp(dir / "run.log");
    }
    auto body = HttpGet("127.0.0.1", prom_port, url);
    if (!body) continue;
    last = *body;
    const nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") continue;
    for (const auto& r : j["data"]["result"]) {
      const auto& m = r["metric"];
      if (m.value("device", "") != "nvme0" || m.value("register", "") != "SQ1TDBL") continue;
      const double v = std::strtod(r["value"][1].get<std::string>().c_str(), nullptr);
      if (std::isfinite(v)) p99 = v;
    }
    if (p99 >= 0.020) break;
  }
  EXPECT_GE(p99, 0.020) << "p99 of nvme0/SQ1TDBL per Prometheus; last answer: " << last
                        << "\nexitscope: " << (run ? Slurp(dir / "run.log") : "(library)")
                        << "\nprometheus log:\n"
                        << Slurp(dir / "prometheus.log");
  std::printf("Prometheus p99 of nvme0/SQ1TDBL: %.1f ms (%s)\n", p99 * 1e3,
              kvm ? "exitscope run on KVM" : "library test VMM");
  // Both servers stop here (Child destructors), whatever happened above.
}

TEST(PrometheusScrape, RunMetricsFlagUsageErrors) {
  struct Case {
    const char* args;
    const char* needle;
  } cases[] = {
      {"--metrics nonsense", "--metrics address 'nonsense'"},
      {"--metrics 127.0.0.1:99999", "port must be 0..65535"},
      {"--metrics :9464 --no-record", "--metrics: needs the recorder"},
      {"--linger 5", "--linger: only with --metrics"},
  };
  for (const Case& c : cases) {
    const std::string cmd =
        std::string(EXITSCOPE_BINARY_DIR) + "/exitscope run " + c.args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = ::pclose(p);
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 2) << c.args << ": " << out;
    EXPECT_NE(out.find(c.needle), std::string::npos) << c.args << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << c.args << ": " << out;
  }
}

}  // namespace
}  // namespace exitscope
