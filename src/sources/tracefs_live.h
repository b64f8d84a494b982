// sources/tracefs_live.h: the kvm tracepoints streamed live from tracefs as a Source: a
// private tracefs instance (every setting restored, Ctrl-C included), its raw per-CPU pages
// read every 10 ms, decoded, merged across CPUs in time order 50 ms behind the newest record
// (KvmLiveFeeder, so the per-thread order KvmPairer needs holds) and paired into exits: the
// very code `kvm report` runs on a file. `kvm live` and `kvm stat` (without BPF) run it.
//
//   auto src = TracefsLiveSource::Open(topts, popts);
//   (*src)->SetControl({.started = [&] { return StartChild(); },
//                       .tick = [&] { return !stop && (Refresh(), true); }});
//   Status s = (*src)->Run(&aggregator);   // until tick() says stop; then drains and Finish()
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "exitscope/status.h"
#include "sources/kvm_pairing.h"
#include "sources/source.h"
#include "sources/tracefs_session.h"

namespace exitscope::sources {

struct LiveControl {
  // Called once tracing is on, before the first read (start the command to trace here).
  std::function<Status()> started{};
  // Called every ~10 ms after the pages read so far reached the sink; false stops the run.
  std::function<bool()> tick{};
};

class TracefsLiveSource final : public Source {
 public:
  // Opens the session (tracing stays off until Run), the page readers and the event formats.
  // `pairer.clock` is set from the session's clock.
  static Result<std::unique_ptr<TracefsLiveSource>> Open(const TracefsOptions& tracefs,
                                                         const KvmPairerOptions& pairer);
  ~TracefsLiveSource() override;

  void SetControl(LiveControl control) { control_ = std::move(control); }
  // Traces until control.tick() returns false (or a read fails), then stops tracing, drains
  // what the buffers still hold, ends every exit (KvmPairer::Finish) and restores tracefs.
  Status Run(EventSink* sink) override;
  const SourceInfo& info() const noexcept override { return info_; }
  const KvmPairingStats* pairing() const noexcept override;
  // Records the ring buffers lost so far, and pages lost with no count.
  uint64_t lost_events() const noexcept;
  uint64_t lost_unknown_pages() const noexcept;

 private:
  TracefsLiveSource();
  struct State;
  std::unique_ptr<State> s_;
  LiveControl control_;
  SourceInfo info_;
};

}  // namespace exitscope::sources
