// Cost of the recorder's hot path: one exit recorded (BeginExit + EndExit for an address among
// N registered devices), lookup alone, device events, and snapshots.
//
// BeginExit does not search the address space: it stores the address-space generation and
// the exit is resolved to device and register off the hot path (Recorder::Resolve, at
// snapshot / slow path / watchdog time). BM_Lookup is that deferred cost, paid per record
// by BM_Snapshot, not per exit by the vCPU.
//
//   build/bench/recorder_benchmark --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true
//
// Heap allocations are counted by replacing operator new and reported per iteration
// ("allocs_per_iter"); the per-exit path must report 0.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "exitscope/recorder.h"

// GCC 12 flags free() in a replaced operator delete as mismatched with new: the pair below
// is consistent (both malloc/free), so silence that false positive here.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
// Allocations made by the calling thread (the benchmark loop), not by the watchdog thread.
thread_local uint64_t g_allocs = 0;
}  // namespace

void* operator new(std::size_t n) {
  ++g_allocs;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  ++g_allocs;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace exitscope {
namespace {

constexpr uint64_t kBase = 0xc0000000;
constexpr uint64_t kBar = 0x4000;

// A recorder with `devices` NVMe controllers, one 16 KiB BAR each (with the nvme map), and a
// shuffled list of doorbell / register addresses across all of them.
struct Setup {
  std::unique_ptr<Recorder> rec;
  std::vector<uint64_t> addrs;

  explicit Setup(int devices, bool watchdog = true, bool with_maps = true) {
    RecorderOptions o;
    o.num_vcpus = 4;
    o.events_per_vcpu = 4096;
    o.start_watchdog = watchdog;
    // A preempted iteration on a loaded machine must not take the (allocating) slow path.
    o.slow_exit.threshold_ns = 60'000'000'000ull;
    o.watchdog.stuck_exit_ns = 60'000'000'000ull;
    o.watchdog.poll_ns = 10'000'000;
    rec = std::move(*Recorder::Create(o));
    auto map = *RegisterMap::Builtin("nvme");
    for (int i = 0; i < devices; ++i) {
      const uint32_t d =
          *rec->address_space().AddDevice({.name = "nvme" + std::to_string(i), .kind = "nvme"});
      (void)rec->address_space().AddRange(IoSpace::kMmio, kBase + kBar * 2 * i, kBar, d,
                                          with_maps ? map : nullptr);
    }
    std::mt19937_64 rng(1);
    static const uint64_t kOffsets[] = {0x1000, 0x1004, 0x1008, 0x100c, 0x1010, 0x14, 0x1c};
    for (int i = 0; i < 4096; ++i) {
      addrs.push_back(kBase + kBar * 2 * (rng() % devices) + kOffsets[rng() % 7]);
    }
  }
};

void Finish(benchmark::State& state, uint64_t allocs_before) {
  const uint64_t allocs = g_allocs - allocs_before;
  state.counters["allocs_per_iter"] =
      benchmark::Counter(static_cast<double>(allocs) / static_cast<double>(state.iterations()));
}

void BM_RecordExitWithLookup(benchmark::State& state) {
  Setup s(static_cast<int>(state.range(0)));
  Recorder& r = *s.rec;
  size_t i = 0;
  const uint64_t a0 = g_allocs;
  for (auto _ : state) {
    const uint64_t addr = s.addrs[i++ & 4095];
    r.BeginExit(0, ExitKind::kMmio, addr, 4, AccessDir::kWrite, i);
    r.EndExit(0);
  }
  Finish(state, a0);
}
BENCHMARK(BM_RecordExitWithLookup)->Arg(64)->Arg(512);

void BM_RecordExitScopeWithLookup(benchmark::State& state) {
  Setup s(64);
  Recorder& r = *s.rec;
  size_t i = 0;
  const uint64_t a0 = g_allocs;
  for (auto _ : state) {
    Recorder::ExitScope scope(&r, 0, ExitKind::kMmio, s.addrs[i++ & 4095], 4, AccessDir::kRead);
    scope.set_value(i);
  }
  Finish(state, a0);
}
BENCHMARK(BM_RecordExitScopeWithLookup);

void BM_RecordExitNoLookup(benchmark::State& state) {
  Setup s(64);
  Recorder& r = *s.rec;
  const uint64_t a0 = g_allocs;
  for (auto _ : state) {
    r.BeginExit(0, ExitKind::kHlt);
    r.EndExit(0);
  }
  Finish(state, a0);
}
BENCHMARK(BM_RecordExitNoLookup);

void BM_Lookup(benchmark::State& state) {
  Setup s(static_cast<int>(state.range(0)), false);
  const AddressSpace& as = s.rec->address_space();
  size_t i = 0;
  const uint64_t a0 = g_allocs;
  for (auto _ : state) {
    const Resolution res = as.Lookup(IoSpace::kMmio, s.addrs[i++ & 4095], 4, AccessDir::kWrite);
    benchmark::DoNotOptimize(res);
  }
  Finish(state, a0);
}
BENCHMARK(BM_Lookup)->Arg(64)->Arg(512);

// Device only (ranges without a register map): the range search alone.
void BM_LookupNoRegisterMap(benchmark::State& state) {
  Setup s(static_cast<int>(state.range(0)), false, false);
  const AddressSpace& as = s.rec->address_space();
  size_t i = 0;
  for (auto _ : state) {
    const Resolution res = as.Lookup(IoSpace::kMmio, s.addrs[i++ & 4095], 4, AccessDir::kWrite);
    benchmark::DoNotOptimize(res);
  }
}
BENCHMARK(BM_LookupNoRegisterMap)->Arg(64)->Arg(512);

void BM_ClockNow(benchmark::State& state) {
  const Clock c = Clock::Create();
  for (auto _ : state) benchmark::DoNotOptimize(c.Now());
  state.SetLabel(std::string(ToString(c.source())));
}
BENCHMARK(BM_ClockNow);

// One recorded exit against its floor, the two clock reads it needs, in ONE run: each
// iteration times a block of exits (as BM_RecordExitWithLookup/64) and then a block of twice as
// many clock reads (as BM_ClockNow), back to back on the same thread, so both see the same
// machine (load, frequency, steal). Medians over the iterations, so a block that was preempted
// on a loaded machine does not move them:
//   exit_ns             one BeginExit + EndExit
//   two_clock_reads_ns  two Clock::Now()
//   ratio               median over iterations of exit / two clock reads (goal: <= 1.25)
void BM_RecordExitVsTwoClockReads(benchmark::State& state) {
  Setup s(64);
  Recorder& r = *s.rec;
  const Clock& c = r.clock();
  constexpr int kBlock = 512;
  std::vector<double> exit_ns, clock_ns, ratio;
  size_t i = 0;
  for (auto _ : state) {
    const uint64_t t0 = Clock::MonotonicNs();
    for (int k = 0; k < kBlock; ++k) {
      const uint64_t addr = s.addrs[i++ & 4095];
      r.BeginExit(0, ExitKind::kMmio, addr, 4, AccessDir::kWrite, i);
      r.EndExit(0);
    }
    const uint64_t t1 = Clock::MonotonicNs();
    for (int k = 0; k < 2 * kBlock; ++k) benchmark::DoNotOptimize(c.Now());
    const uint64_t t2 = Clock::MonotonicNs();
    const double e = static_cast<double>(t1 - t0) / kBlock;
    const double f = static_cast<double>(t2 - t1) / kBlock;
    exit_ns.push_back(e);
    clock_ns.push_back(f);
    ratio.push_back(f > 0 ? e / f : 0);
  }
  auto median = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  state.counters["exit_ns"] = median(exit_ns);
  state.counters["two_clock_reads_ns"] = median(clock_ns);
  state.counters["ratio"] = median(ratio);
  state.SetLabel(std::string(ToString(c.source())));
}
BENCHMARK(BM_RecordExitVsTwoClockReads);

void BM_DeviceEvent(benchmark::State& state) {
  Setup s(4, false);
  uint64_t id = 0;
  const uint64_t a0 = g_allocs;
  for (auto _ : state) {
    s.rec->IoSubmit(0, id);
    s.rec->IoComplete(0, id);
    ++id;
  }
  Finish(state, a0);
}
BENCHMARK(BM_DeviceEvent);

// Snapshot of 4 vCPUs x 4096 exits (full rings) + address space; the cost of a live report.
void BM_Snapshot(benchmark::State& state) {
  Setup s(64, false);
  for (uint32_t v = 0; v < 4; ++v) {
    for (int i = 0; i < 4096; ++i) {
      s.rec->BeginExit(v, ExitKind::kMmio, s.addrs[i], 4, AccessDir::kWrite, i);
      s.rec->EndExit(v);
    }
  }
  for (auto _ : state) {
    Dump d = s.rec->Snapshot();
    benchmark::DoNotOptimize(d.vcpus.data());
  }
  state.counters["exits"] = 4 * 4096;
}
BENCHMARK(BM_Snapshot)->Unit(benchmark::kMicrosecond);

void BM_SerializeDump(benchmark::State& state) {
  Setup s(64, false);
  for (int i = 0; i < 4096; ++i) {
    s.rec->BeginExit(0, ExitKind::kMmio, s.addrs[i], 4, AccessDir::kWrite, i);
    s.rec->EndExit(0);
  }
  const Dump d = s.rec->Snapshot();
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string b = SerializeDump(d);
    bytes = b.size();
    benchmark::DoNotOptimize(b.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_SerializeDump)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace exitscope

BENCHMARK_MAIN();
