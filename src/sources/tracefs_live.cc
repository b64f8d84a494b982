// sources/tracefs_live.cc: TracefsLiveSource, the drain / pair / finish loop `kvm live` and
// `kvm stat` share.
#include "sources/tracefs_live.h"

#include <unistd.h>

#include <utility>

#include "sources/host_tsc.h"
#include "sources/tracecmd_dat.h"
#include "sources/tracefs_kvm.h"
#include "sources/tracefs_reader.h"

namespace exitscope::sources {

// The pairer is made before Run knows its sink: it feeds this forwarder.
struct TracefsLiveSource::State final : EventSink {
  std::unique_ptr<TracefsSession> session;
  std::unique_ptr<TracefsPageReader> reader;
  TepEvents tep;
  std::unique_ptr<KvmPairer> pairer;
  std::unique_ptr<KvmLiveFeeder> merger;
  std::unique_ptr<RawPageDecoder> pages;
  EventSink* sink = nullptr;

  explicit State(TepEvents t) : tep(std::move(t)) {}
  void OnExit(const ExitEvent& e) override { sink->OnExit(e); }
};

TracefsLiveSource::TracefsLiveSource() = default;
TracefsLiveSource::~TracefsLiveSource() = default;

Result<std::unique_ptr<TracefsLiveSource>> TracefsLiveSource::Open(const TracefsOptions& tracefs,
                                                                   const KvmPairerOptions& pairer) {
  auto session = TracefsSession::Open(tracefs);
  if (!session) return Propagate(session);
  auto reader = TracefsPageReader::Open(**session);
  if (!reader) return Propagate(reader);
  auto tep = TepEvents::Load((*session)->tracefs_dir(), (*session)->systems());
  if (!tep) return Propagate(tep);

  std::unique_ptr<TracefsLiveSource> src(new TracefsLiveSource());
  src->s_ = std::make_unique<State>(std::move(*tep));
  State& s = *src->s_;
  s.session = std::move(*session);
  s.reader = std::move(*reader);
  const std::string clock = s.session->clock();
  const uint64_t tsc_khz = clock == "x86-tsc" ? HostTscKhz() : 0;
  KvmPairerOptions popts = pairer;
  popts.clock = ScaleForClock(clock, tsc_khz);
  s.pairer = std::make_unique<KvmPairer>(popts, &s);
  const uint64_t lag = tsc_khz ? tsc_khz * 50 : 50'000'000;  // 50 ms in the clock's units
  s.merger = std::make_unique<KvmLiveFeeder>(s.tep.get(), s.pairer.get(), lag);
  s.pages = std::make_unique<RawPageDecoder>(s.tep.get());
  src->info_.name = "live";
  src->info_.format = "tracefs";
  src->info_.side = Side::kKernel;
  src->info_.clock = clock;
  src->info_.tsc_khz = tsc_khz;
  src->info_.tsc_khz_from_host = tsc_khz != 0;
  src->info_.scale = popts.clock;
  return src;
}

const KvmPairingStats* TracefsLiveSource::pairing() const noexcept {
  return &s_->pairer->stats();
}
uint64_t TracefsLiveSource::lost_events() const noexcept {
  return s_->pages->lost_events();
}
uint64_t TracefsLiveSource::lost_unknown_pages() const noexcept {
  return s_->pages->lost_unknown_pages();
}

Status TracefsLiveSource::Run(EventSink* sink) {
  State& s = *s_;
  s.sink = sink;
  auto page_sink = [&s](int cpu, const uint8_t* page, size_t size) -> Status {
    s.pages->Decode(cpu, page, size, *s.merger);
    return {};
  };
  if (Status st = s.session->Start(); !st) return st;
  Status failure;
  if (control_.started) failure = control_.started();
  while (failure) {
    auto n = s.reader->Poll(page_sink);
    if (!n) {
      failure = Propagate(n);
      break;
    }
    s.merger->Flush(false);
    if (control_.tick && !control_.tick()) break;
    ::usleep(10'000);  // a signal cuts it short
  }
  (void)s.session->Stop();
  for (int idle = 0; idle < 2;) {
    auto n = s.reader->Poll(page_sink);
    if (!n) break;
    if (*n == 0) ++idle;
  }
  s.merger->Flush(true);
  s.pairer->Finish();
  s.reader->Close();
  Status closed = s.session->Close();
  if (!failure) return failure;
  return closed;
}

}  // namespace exitscope::sources
