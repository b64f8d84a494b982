// sources/tracefs_stop_signal.cc: StopSignalScope, the SIGINT/SIGTERM/SIGHUP handlers that
// only record the signal, for a tracing main loop to poll and then close its session
// (tracefs_session.h).
#include <atomic>
#include <csignal>
#include <cstring>

#include "sources/tracefs_session.h"

namespace exitscope::sources {

namespace {
std::atomic<int> g_stop_signal{0};
constexpr int kStopSignals[3] = {SIGINT, SIGTERM, SIGHUP};
// C++ linkage on purpose: an extern "C" handler name is global and clashes with others'.
void OnTracefsStopSignal(int sig) {
  g_stop_signal.store(sig, std::memory_order_relaxed);
}
}  // namespace
StopSignalScope::StopSignalScope() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnTracefsStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: sleeps and reads return EINTR
  for (int i = 0; i < 3; ++i) ::sigaction(kStopSignals[i], &sa, &old_[i]);
}

StopSignalScope::~StopSignalScope() {
  for (int i = 0; i < 3; ++i) ::sigaction(kStopSignals[i], &old_[i], nullptr);
}

bool StopSignalScope::StopRequested() noexcept {
  return g_stop_signal.load(std::memory_order_relaxed) != 0;
}
int StopSignalScope::LastSignal() noexcept {
  return g_stop_signal.load(std::memory_order_relaxed);
}
void StopSignalScope::Reset() noexcept {
  g_stop_signal.store(0, std::memory_order_relaxed);
}

}  // namespace exitscope::sources
