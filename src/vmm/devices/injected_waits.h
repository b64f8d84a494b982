// vmm/devices/injected_waits.h: the threads behind the device-side --inject faults, so that a
// vCPU stuck inside an exit waits where it would in a real VMM, and a stack capture of it
// (docs/vmm.md, "Fault injection") names the cause:
//
//   SlowBackend  backend-delay: the caller blocks in read() on a descriptor of its own (an
//                eventfd) until the device's delay thread writes it, MS later: a handler waiting
//                for a slow backend (a socket to a storage daemon, a pipe). The waiting
//                thread's stack: read <- exitscope::vmm::BackendWait <- SlowBackend::Wait <-
//                NvmeBlock::Submit <- NvmeBlock::RingSq <- ... <- VcpuLoop::HandleMmio.
//   LockHolder   lock: the caller has the device's holder thread take the device's lock (and
//                keep it MS) before it takes the lock itself, then blocks in
//                pthread_mutex_lock: lock contention inside the exit.
//
// One of each per device (created only when the fault is injected), never one per I/O. Both
// can be cancelled (the VM is stopping): the waits in progress end at once, later ones are
// skipped. Neither may be destroyed while a thread is inside Wait / HandOver.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/status.h"

namespace exitscope::vmm {

// The wait on a slow backend: a blocking read() of 8 bytes from `fd` (an eventfd), retried
// when a signal interrupts it (EINTR: a handler without SA_RESTART, e.g. the VMM's kick; one
// with SA_RESTART, e.g. the stack-capture signal, resumes it in the kernel). Not inlined, so
// that the stack of a thread stuck here names it.
void BackendWait(int fd);

class SlowBackend {
 public:
  // Threads that can wait at once: the delay thread's queue is bounded by it; a thread that
  // finds every descriptor taken waits for one first.
  static constexpr uint32_t kMaxWaiters = 32;

  // Creates the descriptors and starts the delay thread, named `name` (at most 15 characters
  // are kept). kIo when an eventfd cannot be created.
  static Result<std::unique_ptr<SlowBackend>> Create(uint64_t delay_ms, const std::string& name);
  ~SlowBackend();
  SlowBackend(const SlowBackend&) = delete;
  SlowBackend& operator=(const SlowBackend&) = delete;

  // Blocks the calling thread in BackendWait until the delay thread writes its descriptor,
  // delay_ms from now (at once after Cancel). Any thread.
  void Wait();
  // Ends the waits in progress now and makes later ones return at once. Idempotent.
  void Cancel();
  uint64_t waits() const noexcept { return waits_.load(std::memory_order_relaxed); }
  uint64_t delay_ms() const noexcept { return static_cast<uint64_t>(delay_.count()); }

 private:
  explicit SlowBackend(uint64_t delay_ms);
  void DelayThread();

  struct Pending {
    std::chrono::steady_clock::time_point due;
    uint32_t slot = 0;
  };
  const std::chrono::milliseconds delay_;
  int fds_[kMaxWaiters];
  std::mutex mu_;
  std::condition_variable work_cv_;  // the delay thread: a new wait, cancel, stop
  std::condition_variable free_cv_;  // callers: a descriptor became free
  std::vector<uint32_t> free_;       // descriptors not in use
  // Waits in progress, oldest first. Every wait is delay_ long, so this is also due order.
  Pending queue_[kMaxWaiters];
  uint32_t head_ = 0, count_ = 0;
  bool cancelled_ = false, stopping_ = false;
  std::atomic<uint64_t> waits_{0};
  std::thread thread_;
};

class LockHolder {
 public:
  // Starts the holder thread (named `name`) for the lock `mu`, which must outlive it.
  LockHolder(std::mutex& mu, uint64_t hold_ms, const std::string& name);
  ~LockHolder();
  LockHolder(const LockHolder&) = delete;
  LockHolder& operator=(const LockHolder&) = delete;

  // Wakes the holder and returns once it holds `mu`; it keeps it hold_ms, then releases it.
  // The caller (which must not hold `mu`) then finds the lock held. Returns at once after
  // Cancel. Any number of threads; each call is one hold, served in order.
  void HandOver();
  // Releases a hold in progress now and makes later HandOver calls return at once.
  void Cancel();
  uint64_t holds() const noexcept { return holds_.load(std::memory_order_relaxed); }
  uint64_t hold_ms() const noexcept { return static_cast<uint64_t>(hold_.count()); }

 private:
  void Run();

  std::mutex& lock_;  // the device's lock
  const std::chrono::milliseconds hold_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t requested_ = 0, taken_ = 0;  // tickets: HandOver n returns once taken_ >= n
  bool cancelled_ = false, stopping_ = false;
  std::atomic<uint64_t> holds_{0};
  std::thread thread_;
};

}  // namespace exitscope::vmm
