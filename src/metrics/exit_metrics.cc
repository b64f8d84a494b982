#include "metrics/exit_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <CivetServer.h>

#include "prometheus/text_serializer.h"

namespace exitscope::metrics {
namespace {

constexpr char kSep = '\x1f';

void Join(std::string* key, std::initializer_list<std::string_view> parts) {
  key->clear();
  for (std::string_view p : parts) {
    key->append(p);
    key->push_back(kSep);
  }
}

// Buckets + _sum + _count.
uint64_t HistogramSeries() {
  return DurationBuckets().size() + 1 + 2;
}

// civetweb matches a handler's URI as a prefix: prometheus-cpp's "/metrics" handler also
// answered "/metricsX" and "/metrics/x" with 200. Called for every request before civetweb
// picks a handler: anything but "/metrics" itself is answered 404 here.
int OnlyTheMetricsUri(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri != nullptr && ri->local_uri != nullptr && std::strcmp(ri->local_uri, "/metrics") == 0)
    return 0;  // civetweb goes on to the handler
  mg_send_http_error(conn, 404, "%s", "not found: this exporter serves /metrics only\n");
  return 404;
}

const CivetCallbacks* Callbacks() {
  static const CivetCallbacks* const cb = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = OnlyTheMetricsUri;
    return c;
  }();
  return cb;
}

// Why `listen` ("ADDR:PORT", "[ADDR6]:PORT") cannot be bound, as civetweb says only "null
// context when constructing CivetServer": binds a socket of our own (SO_REUSEADDR, as civetweb
// does) and returns its errno, 0 when it binds (or the address is not one we can parse).
int BindErrno(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return 0;
  std::string host = listen.substr(0, colon);
  const int port = std::atoi(listen.c_str() + colon + 1);
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6->sin6_addr) != 1) return 0;
    len = sizeof *a6;
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    if (host.empty()) host = "0.0.0.0";
    if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) return 0;
    len = sizeof *a4;
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const int err = ::bind(fd, reinterpret_cast<const sockaddr*>(&ss), len) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

const std::vector<double>& DurationBuckets() {
  static const std::vector<double> b = [] {
    std::vector<double> v;
    double decade = 1e-7;
    for (int d = 0; d < 9; ++d, decade *= 10) {
      for (double m : {1.0, 2.5, 5.0}) v.push_back(m * decade);
    }
    v.push_back(100.0);
    return v;
  }();
  return b;
}

ExitMetrics::ExitMetrics(uint32_t max_registers_per_device)
    : max_regs_(max_registers_per_device), registry_(std::make_shared<prometheus::Registry>()) {
  exit_duration_ = &prometheus::BuildHistogram()
                        .Name("exitscope_exit_duration_seconds")
                        .Help(
                            "Time from a VM exit to the vCPU's next entry (as timed by the "
                            "recorder or the kernel trace), by vm, vcpu, kind, device, register")
                        .Register(*registry_);
  slow_ = &prometheus::BuildCounter()
               .Name("exitscope_slow_exits_total")
               .Help("Exits that reached the slow-exit threshold")
               .Register(*registry_);
  stuck_ = &prometheus::BuildCounter()
                .Name("exitscope_stuck_vcpu_total")
                .Help("Times the watchdog found a vCPU stuck inside one exit")
                .Register(*registry_);
  in_exit_ = &prometheus::BuildGauge()
                  .Name("exitscope_vcpu_exit_in_progress_seconds")
                  .Help("How long the vCPU has been inside its current exit (0: in the guest)")
                  .Register(*registry_);
  io_latency_ = &prometheus::BuildHistogram()
                     .Name("exitscope_io_latency_seconds")
                     .Help("Device I/O latency, from submit to complete")
                     .Register(*registry_);
  io_in_flight_ = &prometheus::BuildGauge()
                       .Name("exitscope_io_in_flight")
                       .Help("I/Os submitted and not yet completed")
                       .Register(*registry_);
  io_oldest_ = &prometheus::BuildGauge()
                    .Name("exitscope_io_oldest_in_flight_seconds")
                    .Help("Age of the oldest I/O in flight (0: none)")
                    .Register(*registry_);
  aged_io_ = &prometheus::BuildCounter()
                  .Name("exitscope_aged_io_total")
                  .Help("I/Os the watchdog found in flight past its age threshold")
                  .Register(*registry_);
  lost_ = &prometheus::BuildCounter()
               .Name("exitscope_lost_records_total")
               .Help(
                   "Records lost or not seen, by source (exits, device_events, findings, "
                   "kernel_trace) and reason")
               .Register(*registry_);
}

std::string_view ExitMetrics::BoundRegister(std::string_view vm, std::string_view device,
                                            std::string_view reg) {
  if (reg.empty()) return {};
  Join(&key_, {vm, device});
  auto dev = regs_.find(key_);
  if (dev == regs_.end())
    dev = regs_.emplace(key_, std::map<std::string, std::string, std::less<>>{}).first;
  auto& names = dev->second;
  if (auto it = names.find(reg); it != names.end()) return it->second;
  if (names.size() >= max_regs_) return kOtherRegisterLabel;
  return names.emplace(std::string(reg), std::string(reg)).first->second;
}

ExitMetrics::ExitSeries& ExitMetrics::Exit(std::string_view vm, uint32_t vcpu,
                                           std::string_view kind, std::string_view device,
                                           std::string_view reg) {
  const std::string_view bounded = BoundRegister(vm, device, reg);
  const std::string cpu = std::to_string(vcpu);
  Join(&key_, {vm, cpu, kind, device, bounded});
  if (auto it = exits_.find(key_); it != exits_.end()) return it->second;
  const prometheus::Labels labels{{"vm", std::string(vm)},
                                  {"vcpu", cpu},
                                  {"kind", std::string(kind)},
                                  {"device", std::string(device)},
                                  {"register", std::string(bounded)}};
  ExitSeries s;
  s.duration = &exit_duration_->Add(labels, DurationBuckets());
  s.slow = &slow_->Add(labels);
  series_ += HistogramSeries() + 1;
  return exits_.emplace(key_, s).first->second;
}

prometheus::Counter& ExitMetrics::Stuck(std::string_view vm, uint32_t vcpu) {
  const std::string cpu = std::to_string(vcpu);
  Join(&key_, {vm, cpu});
  if (auto it = stuck_series_.find(key_); it != stuck_series_.end()) return *it->second;
  ++series_;
  prometheus::Counter* c = &stuck_->Add({{"vm", std::string(vm)}, {"vcpu", cpu}});
  return *stuck_series_.emplace(key_, c).first->second;
}

prometheus::Gauge& ExitMetrics::InExit(std::string_view vm, uint32_t vcpu) {
  const std::string cpu = std::to_string(vcpu);
  Join(&key_, {vm, cpu});
  if (auto it = in_exit_series_.find(key_); it != in_exit_series_.end()) return *it->second;
  ++series_;
  prometheus::Gauge* g = &in_exit_->Add({{"vm", std::string(vm)}, {"vcpu", cpu}});
  return *in_exit_series_.emplace(key_, g).first->second;
}

ExitMetrics::IoSeries& ExitMetrics::Io(std::string_view vm, std::string_view device) {
  Join(&key_, {vm, device});
  if (auto it = io_series_.find(key_); it != io_series_.end()) return it->second;
  const prometheus::Labels labels{{"vm", std::string(vm)}, {"device", std::string(device)}};
  IoSeries s;
  s.latency = &io_latency_->Add(labels, DurationBuckets());
  s.in_flight = &io_in_flight_->Add(labels);
  s.oldest = &io_oldest_->Add(labels);
  s.aged = &aged_io_->Add(labels);
  series_ += HistogramSeries() + 3;
  return io_series_.emplace(key_, s).first->second;
}

prometheus::Counter& ExitMetrics::Lost(std::string_view vm, std::string_view source,
                                       std::string_view reason) {
  Join(&key_, {vm, source, reason});
  if (auto it = lost_series_.find(key_); it != lost_series_.end()) return *it->second;
  ++series_;
  prometheus::Counter* c = &lost_->Add(
      {{"vm", std::string(vm)}, {"source", std::string(source)}, {"reason", std::string(reason)}});
  return *lost_series_.emplace(key_, c).first->second;
}

void ExitMetrics::Mirror(prometheus::Counter& c, uint64_t value, uint64_t* last) {
  if (value > *last) c.Increment(static_cast<double>(value - *last));
  if (value > *last) *last = value;
}

std::string ExitMetrics::Render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

Result<Served> Serve(const std::string& listen,
                     const std::weak_ptr<prometheus::Collectable>& what) {
  try {
    Served s;
    // civetweb's defaults are 30 s to read a request and (prometheus-cpp's) 2 workers: two
    // idle connections stopped every scrape for 30 s.
    s.exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads",
                                 std::to_string(kHttpThreads), "request_timeout_ms",
                                 std::to_string(kRequestTimeoutMs), "enable_keep_alive", "no"},
        Callbacks());
    s.exposer->RegisterCollectable(what);
    const std::vector<int> ports = s.exposer->GetListeningPorts();
    if (ports.empty()) return Fail(ErrorCode::kIo, "metrics " + listen + ": not listening");
    s.port = static_cast<uint16_t>(ports.front());
    s.address = listen.substr(0, listen.rfind(':') + 1) + std::to_string(s.port);
    return s;
  } catch (const std::exception& ex) {
    // civetweb's own words ("null context when constructing CivetServer") say nothing: say
    // why the address cannot be bound.
    const int err = BindErrno(listen);
    if (err == EADDRINUSE) return Fail(ErrorCode::kIo, "metrics " + listen + ": port in use");
    if (err != 0) {
      return Fail(ErrorCode::kIo, "metrics " + listen + ": cannot listen: " + std::strerror(err));
    }
    return Fail(ErrorCode::kIo, "metrics " + listen + ": cannot listen (" + ex.what() + ")");
  }
}

}  // namespace exitscope::metrics
