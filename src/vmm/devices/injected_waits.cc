#include "vmm/devices/injected_waits.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace exitscope::vmm {

namespace {

void NameThread(std::thread& t, const std::string& name) {
  pthread_setname_np(t.native_handle(), name.substr(0, 15).c_str());
}

// Makes the eventfd readable. A write of 1 never blocks (the counter is read back to 0 by the
// one waiter of that descriptor before it is reused).
void Feed(int fd) {
  const uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

}  // namespace

__attribute__((noinline)) void BackendWait(int fd) {
  uint64_t value = 0;
  for (;;) {
    const ssize_t n = ::read(fd, &value, sizeof value);
    if (n < 0 && errno == EINTR) continue;  // a signal handler ran: wait on
    break;  // fed (an eventfd read is 8 bytes or fails; nothing else can end it)
  }
  // Keeps this frame on the stack: no tail call, nothing folded into the caller.
  asm volatile("" ::: "memory");
}

SlowBackend::SlowBackend(uint64_t delay_ms) : delay_(static_cast<int64_t>(delay_ms)) {
  for (int& fd : fds_) fd = -1;
}

Result<std::unique_ptr<SlowBackend>> SlowBackend::Create(uint64_t delay_ms,
                                                         const std::string& name) {
  auto b = std::unique_ptr<SlowBackend>(new SlowBackend(delay_ms));
  for (uint32_t i = 0; i < kMaxWaiters; ++i) {
    b->fds_[i] = ::eventfd(0, EFD_CLOEXEC);  // blocking: the wait is a read() that blocks
    if (b->fds_[i] < 0)
      return Fail(ErrorCode::kIo, "backend-delay: eventfd: " + std::string(std::strerror(errno)));
    b->free_.push_back(kMaxWaiters - 1 - i);
  }
  b->thread_ = std::thread([p = b.get()] { p->DelayThread(); });
  NameThread(b->thread_, name);
  return b;
}

SlowBackend::~SlowBackend() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
  }
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void SlowBackend::Wait() {
  uint32_t slot = 0;
  {
    std::unique_lock lock(mu_);
    free_cv_.wait(lock, [&] { return cancelled_ || stopping_ || !free_.empty(); });
    if (cancelled_ || stopping_) return;
    slot = free_.back();
    free_.pop_back();
    queue_[(head_ + count_) % kMaxWaiters] = {std::chrono::steady_clock::now() + delay_, slot};
    ++count_;
  }
  work_cv_.notify_one();
  BackendWait(fds_[slot]);
  waits_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    free_.push_back(slot);
  }
  free_cv_.notify_one();
}

void SlowBackend::Cancel() {
  {
    std::lock_guard lock(mu_);
    cancelled_ = true;
  }
  work_cv_.notify_all();
  free_cv_.notify_all();
}

void SlowBackend::DelayThread() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || count_ > 0; });
    if (count_ == 0) return;  // stopping, and nobody waits
    const Pending p = queue_[head_];
    if (!cancelled_ && !stopping_ && std::chrono::steady_clock::now() < p.due) {
      // Not due yet: sleep until it is (this thread's sleep, not the waiter's), or a cancel.
      work_cv_.wait_until(lock, p.due, [&] { return cancelled_ || stopping_; });
      continue;
    }
    head_ = (head_ + 1) % kMaxWaiters;
    --count_;
    Feed(fds_[p.slot]);
  }
}

LockHolder::LockHolder(std::mutex& lock, uint64_t hold_ms, const std::string& name)
    : lock_(lock), hold_(static_cast<int64_t>(hold_ms)) {
  thread_ = std::thread([this] { Run(); });
  NameThread(thread_, name);
}

LockHolder::~LockHolder() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LockHolder::HandOver() {
  std::unique_lock lock(mu_);
  if (cancelled_ || stopping_) return;
  const uint64_t ticket = ++requested_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return taken_ >= ticket || cancelled_ || stopping_; });
}

void LockHolder::Cancel() {
  {
    std::lock_guard lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

void LockHolder::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (taken_ < requested_ && !cancelled_); });
    if (stopping_) return;
    lock.unlock();
    lock_.lock();  // the device's lock: may wait for its current owner
    lock.lock();
    ++taken_;
    holds_.fetch_add(1, std::memory_order_relaxed);
    cv_.notify_all();  // the caller may go on, and find the device's lock held
    cv_.wait_for(lock, hold_, [&] { return cancelled_ || stopping_; });
    lock_.unlock();
  }
}

}  // namespace exitscope::vmm
