// Benchmarks of the live tracefs pipeline on real kernel pages: the pages are produced once
// at start-up by this process (trace_marker writes into a private instance, with the kernel's
// own timestamps and layout), then
//   BM_DecodeRawPages      walks them with kbuffer into tep records (events/s),
//   BM_DecodeRawPagesKvm   same, plus kvm-analysis's KvmTepDecoder type lookup per record,
//   BM_WriteDatPages       appends them to a .dat writer (bytes/s),
//   BM_ReadTracePipeRaw    the kernel side: refills the buffer and reads trace_pipe_raw.
// tracefs is restored when the process exits (the private instance is removed).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "sources/kvm_trace.h"
#include "sources/tracefs_dat.h"
#include "sources/tracefs_reader.h"
#include "sources/tracefs_session.h"

extern "C" {
#include <event-parse.h>
}

namespace {

using namespace exitscope::sources;

struct Fixture {
  std::unique_ptr<TracefsSession> session;
  std::unique_ptr<TepEvents> tep;
  std::vector<std::pair<int, std::vector<uint8_t>>> pages;
  std::string error;
  uint64_t events = 0;
};

// Writes n markers into the session's buffer and drains its pages.
std::vector<std::pair<int, std::vector<uint8_t>>> Produce(TracefsSession& s, int n) {
  std::vector<std::pair<int, std::vector<uint8_t>>> pages;
  const int fd = ::open((s.buffer_dir() + "/trace_marker").c_str(), O_WRONLY | O_CLOEXEC);
  auto reader = TracefsPageReader::Open(s);
  if (fd < 0 || !reader) return pages;
  auto keep = [&](int cpu, const uint8_t* p, size_t size) -> exitscope::Status {
    pages.emplace_back(cpu, std::vector<uint8_t>(p, p + size));
    return {};
  };
  char msg[64];
  for (int i = 0; i < n; ++i) {
    const int len = std::snprintf(msg, sizeof msg, "exitscope-bench %d", i);
    if (::write(fd, msg, static_cast<size_t>(len)) < 0) break;
    if (i % 1000 == 0) (void)(*reader)->Poll(keep);
  }
  ::close(fd);
  for (int idle = 0; idle < 2;) {
    auto got = (*reader)->Poll(keep);
    if (!got || *got == 0) ++idle;
  }
  return pages;
}

Fixture& Get() {
  static Fixture* f = [] {
    auto* fx = new Fixture;
    TracefsOptions o;
    o.events = {"ftrace:print", "kvm:*"};
    o.buffer_kb = 8192;
    auto s = TracefsSession::Open(o);
    if (!s) {
      fx->error = s.error().message;
      return fx;
    }
    fx->session = std::move(*s);
    auto tep = TepEvents::Load(fx->session->tracefs_dir(), fx->session->systems());
    if (!tep) {
      fx->error = tep.error().message;
      return fx;
    }
    fx->tep = std::make_unique<TepEvents>(std::move(*tep));
    (void)fx->session->Start();
    fx->pages = Produce(*fx->session, 200000);
    (void)fx->session->Stop();
    struct Count : RecordSink {
      uint64_t n = 0;
      void OnRecord(tep_handle*, tep_record*) override { ++n; }
    } count;
    RawPageDecoder d(fx->tep->get());
    for (auto& [cpu, p] : fx->pages) d.Decode(cpu, p.data(), p.size(), count);
    fx->events = count.n;
    std::atexit([] {
      Fixture& g = Get();
      if (g.session) (void)g.session->Close();
    });
    return fx;
  }();
  return *f;
}

void BM_DecodeRawPages(benchmark::State& state) {
  Fixture& f = Get();
  if (!f.session || !f.tep) return state.SkipWithError(("tracefs: " + f.error).c_str());
  struct Count : RecordSink {
    uint64_t n = 0;
    void OnRecord(tep_handle*, tep_record*) override { ++n; }
  } count;
  RawPageDecoder d(f.tep->get());
  for (auto _ : state) {
    for (auto& [cpu, p] : f.pages) d.Decode(cpu, p.data(), p.size(), count);
  }
  benchmark::DoNotOptimize(count.n);
  state.counters["events/s"] =
      benchmark::Counter(static_cast<double>(f.events) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["pages"] = static_cast<double>(f.pages.size());
}
BENCHMARK(BM_DecodeRawPages)->Unit(benchmark::kMillisecond);

void BM_DecodeRawPagesKvm(benchmark::State& state) {
  Fixture& f = Get();
  if (!f.session || !f.tep) return state.SkipWithError(("tracefs: " + f.error).c_str());
  struct Kvm : RecordSink {
    explicit Kvm(tep_handle* tep) : dec(tep) {}
    KvmTepDecoder dec;
    KvmRecord rec;
    uint64_t kvm = 0;
    void OnRecord(tep_handle*, tep_record* r) override {
      kvm += dec.Decode(r, static_cast<uint32_t>(r->cpu), &rec);
    }
  } sink(f.tep->get());
  RawPageDecoder d(f.tep->get());
  for (auto _ : state) {
    for (auto& [cpu, p] : f.pages) d.Decode(cpu, p.data(), p.size(), sink);
  }
  benchmark::DoNotOptimize(sink.kvm);
  state.counters["events/s"] =
      benchmark::Counter(static_cast<double>(f.events) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeRawPagesKvm)->Unit(benchmark::kMillisecond);

void BM_WriteDatPages(benchmark::State& state) {
  Fixture& f = Get();
  if (!f.session || !f.tep) return state.SkipWithError(("tracefs: " + f.error).c_str());
  const std::string path = "/tmp/exitscope-bench-" + std::to_string(::getpid()) + ".dat";
  for (auto _ : state) {
    auto w = TraceDatWriter::Create(path, *f.session);
    if (!w) return state.SkipWithError(w.error().message.c_str());
    for (auto& [cpu, p] : f.pages) (void)(*w)->AddPage(cpu, p.data(), p.size());
    (void)(*w)->Finish(f.session->buffer_dir());
  }
  ::unlink(path.c_str());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(f.pages.size() * f.session->subbuf_size()));
  state.counters["events/s"] =
      benchmark::Counter(static_cast<double>(f.events) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_WriteDatPages)->Unit(benchmark::kMillisecond);

void BM_ReadTracePipeRaw(benchmark::State& state) {
  Fixture& f = Get();
  if (!f.session || !f.tep) return state.SkipWithError(("tracefs: " + f.error).c_str());
  (void)f.session->Start();
  size_t pages = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const int fd = ::open((f.session->buffer_dir() + "/trace_marker").c_str(), O_WRONLY);
    for (int i = 0; i < 20000; ++i) (void)!::write(fd, "exitscope-bench refill", 22);
    ::close(fd);
    auto reader = TracefsPageReader::Open(*f.session);
    state.ResumeTiming();
    for (int idle = 0; idle < 2;) {
      auto got =
          (*reader)->Poll([](int, const uint8_t*, size_t) -> exitscope::Status { return {}; });
      if (!got || *got == 0)
        ++idle;
      else
        pages += *got;
    }
  }
  (void)f.session->Stop();
  state.counters["pages/s"] =
      benchmark::Counter(static_cast<double>(pages), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadTracePipeRaw)->Unit(benchmark::kMillisecond)->Iterations(20);

}  // namespace

BENCHMARK_MAIN();
