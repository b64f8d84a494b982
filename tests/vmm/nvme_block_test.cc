// The NVMe-style block device driven like a guest driver would: registers through Read/Write,
// queues in a GuestMemory buffer, I/O against a real file.
#include "vmm/devices/nvme_block.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/recorder.h"
#include "guests/abi.h"

namespace exitscope::vmm {
namespace {

using namespace nvme;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr uint64_t kAsq = 0x100000, kAcq = 0x101000, kIoSq = 0x102000, kIoCq = 0x103000;
constexpr uint64_t kBuf = 0x110000, kIdent = 0x120000;
constexpr uint32_t kDepth = 8;

struct Events : BlockObserver {
  std::mutex mu;
  std::vector<uint64_t> submitted, completed;
  std::vector<uint16_t> statuses;
  int queue_full = 0, backend_errors = 0;
  void IoSubmitted(uint64_t id, uint16_t, uint8_t, uint64_t, uint32_t) override {
    std::lock_guard l(mu);
    submitted.push_back(id);
  }
  void IoCompleted(uint64_t id, uint16_t status, int) override {
    std::lock_guard l(mu);
    completed.push_back(id);
    statuses.push_back(status);
  }
  void QueueFull(uint16_t, const char*) override {
    std::lock_guard l(mu);
    ++queue_full;
  }
  void BackendError(uint64_t, int, const char*) override {
    std::lock_guard l(mu);
    ++backend_errors;
  }
};

// The system call thread `tid` of this process is blocked in (its number, from
// /proc/self/task/TID/syscall), or -1 when it is in none (running, or gone).
long BlockedIn(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  if (!(in >> nr)) return -1;
  return nr;
}

// A signal whose handler is installed without SA_RESTART: a blocking read() it interrupts
// returns EINTR.
int EintrSignal() {
  return SIGRTMIN + 6;
}
extern "C" void OnEintrSignal(int) {}
void InstallEintrSignal() {
  struct sigaction sa {};
  sa.sa_handler = OnEintrSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ASSERT_EQ(sigaction(EintrSignal(), &sa, nullptr), 0);
}

class NvmeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = GuestMemory::Create(4 << 20);
    ASSERT_TRUE(m);
    mem = std::move(*m);
    path = std::string("/tmp/exitscope-nvme-test-") + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(0, ftruncate(fd, 1 << 20));  // 2048 blocks
  }
  void TearDown() override {
    dev.reset();
    close(fd);
    unlink(path.c_str());
  }
  void Make(BackendFaults faults = {}, uint32_t depth = 4, uint32_t workers = 2,
            LockFault lock = {}) {
    NvmeBlock::Options o;
    o.lock_fault = lock;
    o.fd = fd;
    o.disk_bytes = 1 << 20;
    o.workers = workers;
    o.backend_depth = depth;
    o.faults = faults;
    o.observer = &events;
    o.interrupt = [this](uint16_t v) { interrupts[v & 15].fetch_add(1); };
    auto d = NvmeBlock::Create(&mem, o);
    ASSERT_TRUE(d) << d.error().message;
    dev = std::move(*d);
  }
  uint64_t R(uint64_t off, uint32_t size = 4) {
    uint8_t d[8] = {};
    AccessContext ctx;
    EXPECT_TRUE(dev->Read(off, d, size, ctx)) << std::hex << off;
    return LoadLe(d, size);
  }
  void W(uint64_t off, uint64_t v, uint32_t size = 4) {
    uint8_t d[8];
    StoreLe(v, d, size);
    AccessContext ctx;
    EXPECT_TRUE(dev->Write(off, d, size, ctx)) << std::hex << off;
  }
  struct Q {
    uint64_t sq, cq;
    uint16_t qid;
    uint32_t tail = 0, head = 0, phase = 1;
    uint16_t cid = 0;
  };
  void Sqe(Q& q, uint8_t opcode, uint32_t nsid, uint64_t prp1, uint32_t cdw10, uint32_t cdw11,
           uint32_t cdw12 = 0, uint64_t prp2 = 0) {
    uint32_t e[16] = {};
    e[0] = opcode | uint32_t{q.cid++} << 16;
    e[1] = nsid;
    std::memcpy(&e[6], &prp1, 8);
    std::memcpy(&e[8], &prp2, 8);
    e[10] = cdw10;
    e[11] = cdw11;
    e[12] = cdw12;
    ASSERT_TRUE(mem.Write(q.sq + 64 * q.tail, e, 64));
    q.tail = (q.tail + 1) % kDepth;
  }
  // Waits for the next completion; returns {status field, dw0}.
  std::pair<uint16_t, uint32_t> Reap(Q& q) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      // As a guest does: the phase bit first (acquire), the rest of the entry after it.
      uint8_t* entry = mem.Translate(q.cq + 16 * q.head, 16);
      uint32_t c[4];
      c[3] = __atomic_load_n(reinterpret_cast<uint32_t*>(entry + 12), __ATOMIC_ACQUIRE);
      if ((c[3] >> 16 & 1) == q.phase) {
        std::memcpy(c, entry, 12);
        EXPECT_EQ(c[2] >> 16, q.qid);
        if (++q.head == kDepth) {
          q.head = 0;
          q.phase ^= 1;
        }
        W(kDoorbells + 8 * q.qid + 4, q.head);
        return {static_cast<uint16_t>(c[3] >> 17), c[0]};
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "no completion";
        return {0xffff, 0};
      }
      std::this_thread::yield();
    }
  }
  uint16_t Admin(uint8_t opcode, uint32_t nsid, uint64_t prp1, uint32_t cdw10, uint32_t cdw11,
                 uint32_t* dw0 = nullptr) {
    Sqe(aq, opcode, nsid, prp1, cdw10, cdw11);
    W(kDoorbells, aq.tail);
    auto [st, r] = Reap(aq);
    if (dw0) *dw0 = r;
    return st;
  }
  void Enable() {
    W(kRegAqa, (kDepth - 1) << 16 | (kDepth - 1));
    W(kRegAsq, kAsq, 8);
    W(kRegAcq, kAcq, 8);
    W(kRegCc, 1 | 6 << 16 | 4 << 20);
    ASSERT_EQ(R(kRegCsts) & 3, 1u);
  }
  void CreateIoQueues() {
    ASSERT_EQ(Admin(0x05, 0, kIoCq, (kDepth - 1) << 16 | 1, 2 << 16 | 3), kSuccess);
    ASSERT_EQ(Admin(0x01, 0, kIoSq, (kDepth - 1) << 16 | 1, 1 << 16 | 1), kSuccess);
  }

  GuestMemory mem;
  std::string path;
  int fd = -1;
  Events events;
  std::atomic<int> interrupts[16] = {};
  std::unique_ptr<NvmeBlock> dev;
  Q aq{kAsq, kAcq, 0};
  Q io{kIoSq, kIoCq, 1};
};

TEST_F(NvmeTest, RegistersAfterResetFollowTheSpec) {
  Make();
  const uint64_t cap = R(kRegCap, 8);
  EXPECT_EQ(cap & 0xffff, kMqes);
  EXPECT_EQ(cap >> 16 & 1, 1u);    // CQR
  EXPECT_EQ(cap >> 32 & 0xf, 0u);  // DSTRD: doorbells 4 bytes apart
  EXPECT_EQ(cap >> 37 & 1, 1u);    // NVM command set
  EXPECT_EQ(R(kRegCap), cap & 0xffffffff);
  EXPECT_EQ(R(kRegCap + 4), cap >> 32);
  EXPECT_EQ(R(kRegVs), 0x00010400u);
  EXPECT_EQ(R(kRegCsts), 0u);
  EXPECT_EQ(R(kRegCc), 0u);
  W(kRegVs, 0x12345678);  // read-only: dropped
  EXPECT_EQ(R(kRegVs), 0x00010400u);
  W(kRegIntms, 0x5);
  W(kRegIntmc, 0x1);
  EXPECT_EQ(R(kRegIntms), 0x4u);
  W(kRegAsq, 0x11223344);
  W(kRegAsq + 4, 0x55);
  EXPECT_EQ(R(kRegAsq, 8), 0x5511223344ull);
}

TEST_F(NvmeTest, OffsetsWithoutARegisterAreRefused) {
  Make();
  uint8_t d[8] = {};
  AccessContext ctx;
  EXPECT_FALSE(dev->Read(0x40, d, 4, ctx));
  EXPECT_FALSE(dev->Write(0x40, d, 4, ctx));
  EXPECT_FALSE(dev->Read(kRegCc, d, 2, ctx));
  EXPECT_FALSE(dev->Write(kDoorbells + 8 * kMaxQueues, d, 4, ctx));
  EXPECT_FALSE(dev->Write(kDoorbells + 2, d, 4, ctx));
}

TEST_F(NvmeTest, EnableIdentifyCreateQueuesWriteReadThroughTheFile) {
  Make();
  Enable();
  ASSERT_EQ(Admin(0x06, 1, kIdent, 0, 0), kSuccess);
  uint64_t nsze = 0;
  ASSERT_TRUE(mem.ReadObj(kIdent, &nsze));
  EXPECT_EQ(nsze, 2048u);
  uint8_t lbads = 0;
  ASSERT_TRUE(mem.ReadObj(kIdent + 130, &lbads));
  EXPECT_EQ(lbads, 9);
  ASSERT_EQ(Admin(0x06, 0, kIdent, 1, 0), kSuccess);
  char model[25] = {};
  ASSERT_TRUE(mem.Read(kIdent + 24, model, 24));
  EXPECT_STREQ(model, "exitscope reference NVMe");
  uint32_t granted = 0;
  ASSERT_EQ(Admin(0x09, 0, 0, 0x07, 3 << 16 | 3, &granted), kSuccess);
  EXPECT_EQ(granted, (3u << 16) | 3u);
  CreateIoQueues();

  // Write 8 blocks at LBA 16 from two PRP pages, then read them back elsewhere.
  std::vector<uint8_t> pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(mem.Write(kBuf + 2048, pattern.data(), pattern.size()));
  Sqe(io, 0x01, 1, kBuf + 2048, 16, 0, 7, kBuf + 4096);
  W(kDoorbells + 8, io.tail);
  EXPECT_EQ(Reap(io).first, kSuccess);
  std::vector<uint8_t> file(4096);
  ASSERT_EQ(pread(fd, file.data(), file.size(), 16 * 512), 4096);
  EXPECT_EQ(file, pattern);

  Sqe(io, 0x02, 1, kBuf + 0x10000, 16, 0, 7);
  Sqe(io, 0x00, 1, 0, 0, 0);  // flush
  W(kDoorbells + 8, io.tail);
  EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(Reap(io).first, kSuccess);
  std::vector<uint8_t> back(4096);
  ASSERT_TRUE(mem.Read(kBuf + 0x10000, back.data(), back.size()));
  EXPECT_EQ(back, pattern);

  std::lock_guard l(events.mu);
  EXPECT_EQ(events.submitted.size(), 3u);
  EXPECT_EQ(events.completed.size(), 3u);
  EXPECT_NE(events.submitted[0], events.submitted[1]);  // distinct I/O ids
  EXPECT_GT(interrupts[2].load(), 0);                   // the CQ's vector was "interrupted"
  EXPECT_EQ(dev->stats().completed, 3u);
}

TEST_F(NvmeTest, InvalidCommandsCompleteWithTheSpecStatus) {
  Make();
  Enable();
  EXPECT_EQ(Admin(0x7f, 0, 0, 0, 0), kInvalidOpcode);
  EXPECT_EQ(Admin(0x06, 2, kIdent, 0, 0), kInvalidNamespace);
  EXPECT_EQ(Admin(0x06, 0, kIdent, 9, 0), kInvalidField);
  EXPECT_EQ(Admin(0x01, 0, kIoSq, (kDepth - 1) << 16 | 1, 1 << 16 | 1), kCqInvalid);
  EXPECT_EQ(Admin(0x05, 0, kIoCq, (kDepth - 1) << 16 | 0, 3), kInvalidQid);
  EXPECT_EQ(Admin(0x05, 0, kIoCq, 0 << 16 | 1, 3), kInvalidQSize);
  EXPECT_EQ(Admin(0x05, 0, kIoCq + 8, (kDepth - 1) << 16 | 1, 3), kInvalidField);  // unaligned
  CreateIoQueues();
  EXPECT_EQ(Admin(0x05, 0, kIoCq, (kDepth - 1) << 16 | 1, 3), kInvalidQid);  // exists
  Sqe(io, 0x01, 1, kBuf, 2047, 0, 7);                                        // runs past the end
  Sqe(io, 0x02, 5, kBuf, 0, 0, 0);                                           // no namespace 5
  Sqe(io, 0x02, 1, kBuf, 0, 0, 31);                                          // 16 KiB > MDTS
  Sqe(io, 0x02, 1, 0xfff000, 0, 0, 7, 0x7fff000);                            // PRP2 outside RAM
  Sqe(io, 0x55, 1, kBuf, 0, 0, 0);
  W(kDoorbells + 8, io.tail);
  EXPECT_EQ(Reap(io).first, kLbaOutOfRange);
  EXPECT_EQ(Reap(io).first, kInvalidNamespace);
  EXPECT_EQ(Reap(io).first, kInvalidField);
  EXPECT_EQ(Reap(io).first, kDataTransferError);
  EXPECT_EQ(Reap(io).first, kInvalidOpcode);
  EXPECT_EQ(dev->stats().submitted, 0u);  // none reached the backend
}

TEST_F(NvmeTest, BadAdminQueueSetMarksTheControllerFatal) {
  Make();
  W(kRegAqa, 0);  // 1-entry queues are invalid
  W(kRegAsq, kAsq, 8);
  W(kRegAcq, kAcq, 8);
  W(kRegCc, 1);
  EXPECT_EQ(R(kRegCsts) & 3, 2u);  // CFS, not ready
}

TEST_F(NvmeTest, DisableResetsQueuesAndShutdownCompletes) {
  Make();
  Enable();
  CreateIoQueues();
  W(kRegCc, 0);
  EXPECT_EQ(R(kRegCsts) & 1, 0u);
  aq = Q{kAsq, kAcq, 0};
  Enable();
  // The I/O queues are gone after the reset: creating them again succeeds.
  io = Q{kIoSq, kIoCq, 1};
  CreateIoQueues();
  W(kRegCc, 1 | 1 << 14);  // normal shutdown
  EXPECT_EQ(R(kRegCsts) >> 2 & 3, 2u);
}

TEST_F(NvmeTest, InjectedBackendErrorsReachTheGuestAndTheObserver) {
  BackendFaults f;
  f.error_every = 2;
  Make(f);
  Enable();
  CreateIoQueues();
  Sqe(io, 0x01, 1, kBuf, 0, 0, 7);
  W(kDoorbells + 8, io.tail);
  EXPECT_EQ(Reap(io).first, kSuccess);
  Sqe(io, 0x01, 1, kBuf, 8, 0, 7);
  W(kDoorbells + 8, io.tail);
  EXPECT_EQ(Reap(io).first, kWriteFault);  // the 2nd I/O fails
  Sqe(io, 0x02, 1, kBuf, 8, 0, 7);
  Sqe(io, 0x02, 1, kBuf, 8, 0, 7);
  W(kDoorbells + 8, io.tail);
  const uint16_t a = Reap(io).first, b = Reap(io).first;
  EXPECT_TRUE((a == kSuccess && b == kUnrecoveredRead) || (a == kUnrecoveredRead && b == kSuccess));
  std::lock_guard l(events.mu);
  EXPECT_EQ(events.backend_errors, 2);
  EXPECT_EQ(dev->stats().errors, 2u);
}

// Depth 1: while a doorbell waits for the slow backend with its I/O, that I/O holds the
// backend's one place, so the next doorbell (another vCPU's) finds it full, reports it and
// waits for room inside its exit.
TEST_F(NvmeTest, AFullBackendMakesTheDoorbellWaitAndIsReported) {
  BackendFaults f;
  f.delay_ms = 200;
  f.delay_every = 1;
  Make(f, /*depth=*/1, /*workers=*/1);
  Enable();
  CreateIoQueues();
  Sqe(io, 0x02, 1, kBuf, 0, 0, 7);
  const uint32_t first_tail = io.tail;
  std::thread first([&] { W(kDoorbells + 8, first_tail); });
  for (int i = 0; i < 5000; ++i) {
    {
      std::lock_guard l(events.mu);
      if (!events.submitted.empty()) break;  // the first doorbell now waits for the backend
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  Sqe(io, 0x02, 1, kBuf + 4096, 8, 0, 7);
  const auto t0 = steady_clock::now();
  W(kDoorbells + 8, io.tail);  // returns once its I/O found room (and waited for the backend)
  const auto waited = steady_clock::now() - t0;
  first.join();
  {
    std::lock_guard l(events.mu);
    EXPECT_EQ(events.submitted.size(), 2u);
    EXPECT_EQ(events.queue_full, 1);
  }
  EXPECT_GE(dev->stats().queue_full, 1u);
  EXPECT_GE(waited, milliseconds(200));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Reap(io).first, kSuccess);
}

// backend-delay blocks where a real backend would: the doorbell of every Nth I/O waits inside
// its handler, in read() on a descriptor the device's delay thread feeds MS later (not in a
// sleep, not on a worker). The I/O is submitted (in flight) while it waits, a signal that
// interrupts the read (EINTR) does not end the wait, and the I/O completes after it.
TEST_F(NvmeTest, BackendDelayBlocksTheDoorbellInReadUntilTheDelayThreadFeedsIt) {
  InstallEintrSignal();
  BackendFaults f;
  f.delay_ms = 300;
  f.delay_every = 2;
  Make(f, /*depth=*/4, /*workers=*/1);
  Enable();
  CreateIoQueues();
  Sqe(io, 0x02, 1, kBuf, 0, 0, 7);  // I/O 1: not delayed
  const auto fast0 = steady_clock::now();
  W(kDoorbells + 8, io.tail);
  EXPECT_LT(steady_clock::now() - fast0, milliseconds(300));
  EXPECT_EQ(Reap(io).first, kSuccess);

  Sqe(io, 0x02, 1, kBuf, 8, 0, 7);  // I/O 2: delayed
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  const auto t0 = steady_clock::now();
  std::thread doorbell([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    W(kDoorbells + 8, io.tail);
    returned = true;
  });
  bool seen_in_read = false, submitted_while_waiting = false;
  int interrupted = 0;
  while (!returned) {
    if (tid != 0 && BlockedIn(tid) == SYS_read) {
      seen_in_read = true;
      {
        std::lock_guard l(events.mu);
        submitted_while_waiting = events.submitted.size() == 2 && events.completed.size() == 1;
      }
      if (interrupted < 3 && syscall(SYS_tgkill, getpid(), tid.load(), EintrSignal()) == 0)
        ++interrupted;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  doorbell.join();
  const auto rang = steady_clock::now() - t0;
  EXPECT_EQ(Reap(io).first, kSuccess);
  const auto completed = steady_clock::now() - t0;
  EXPECT_TRUE(seen_in_read) << "the doorbell thread was never seen blocked in read()";
  EXPECT_TRUE(submitted_while_waiting) << "the delayed I/O was not in flight during the wait";
  EXPECT_GT(interrupted, 0);
  EXPECT_GE(rang, milliseconds(300));  // no upper bound: machines are noisy
  EXPECT_GE(completed, milliseconds(300));
  EXPECT_EQ(dev->stats().backend_waits, 1u);
  EXPECT_EQ(dev->stats().completed, 2u);
}

// A stopping VM cancels the injected waits: a doorbell in a one-hour backend delay returns,
// its I/O completes, and later delayed I/Os do not wait.
TEST_F(NvmeTest, CancelledBackendDelayLetsTheDoorbellGoOn) {
  BackendFaults f;
  f.delay_ms = 3'600'000;
  f.delay_every = 1;
  Make(f);
  Enable();
  CreateIoQueues();
  Sqe(io, 0x01, 1, kBuf, 0, 0, 7);
  std::atomic<bool> returned{false};
  std::thread doorbell([&] {
    W(kDoorbells + 8, io.tail);
    returned = true;
  });
  for (int i = 0; i < 1000; ++i) {
    {
      std::lock_guard l(events.mu);
      if (!events.submitted.empty()) break;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned);
  dev->CancelInjectedWaits();
  doorbell.join();
  EXPECT_EQ(Reap(io).first, kSuccess);
  Sqe(io, 0x01, 1, kBuf, 8, 0, 7);
  W(kDoorbells + 8, io.tail);  // cancelled: no wait
  EXPECT_EQ(Reap(io).first, kSuccess);
}

// lock: before every Nth I/O command the device's holder thread takes the device's lock and
// keeps it MS. The doorbell finds it held (the handshake makes sure of it) and waits for it
// inside its handler, in pthread_mutex_lock (a futex wait), until the holder lets go.
TEST_F(NvmeTest, InjectedLockHoldBlocksTheDoorbellOnTheDeviceLock) {
  Make({}, 4, 2, LockFault{.hold_ms = 300, .every = 3});
  Enable();
  CreateIoQueues();
  Sqe(io, 0x02, 1, kBuf, 0, 0, 7);         // I/O commands 1 and 2: no hold
  Sqe(io, 0x02, 1, kBuf + 4096, 8, 0, 7);  // its own buffer: both may run at once
  const auto fast0 = steady_clock::now();
  W(kDoorbells + 8, io.tail);
  EXPECT_LT(steady_clock::now() - fast0, milliseconds(300));
  EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(dev->stats().lock_holds, 0u);

  Sqe(io, 0x02, 1, kBuf, 16, 0, 7);  // I/O command 3: held
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  const auto t0 = steady_clock::now();
  std::thread doorbell([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    W(kDoorbells + 8, io.tail);
    returned = true;
  });
  bool seen_on_lock = false;
  while (!returned) {
    // The holder has the lock (counted once taken) and the doorbell thread waits in a futex.
    if (tid != 0 && dev->stats().lock_holds == 1 && BlockedIn(tid) == SYS_futex)
      seen_on_lock = true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  doorbell.join();
  const auto waited = steady_clock::now() - t0;
  EXPECT_TRUE(seen_on_lock) << "the doorbell thread was never seen waiting on the lock";
  EXPECT_GE(waited, milliseconds(300));  // no upper bound: machines are noisy
  EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(dev->stats().lock_holds, 1u);
  EXPECT_EQ(dev->stats().completed, 3u);
}

// The holds are deterministic: every Nth command, counted across doorbells and within one.
TEST_F(NvmeTest, InjectedLockHoldsComeEveryNthIoCommand) {
  Make({}, 8, 2, LockFault{.hold_ms = 20, .every = 2});
  Enable();
  CreateIoQueues();
  for (int i = 0; i < 5; ++i) Sqe(io, 0x00, 1, 0, 0, 0);  // five flushes in one doorbell
  const auto t0 = steady_clock::now();
  W(kDoorbells + 8, io.tail);
  EXPECT_GE(steady_clock::now() - t0, milliseconds(40));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(dev->stats().lock_holds, 2u);  // before commands 2 and 4
  Sqe(io, 0x00, 1, 0, 0, 0);               // command 6
  W(kDoorbells + 8, io.tail);
  EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(dev->stats().lock_holds, 3u);
}

// A stopping VM cancels a hold in progress: the doorbell gets the lock at once.
TEST_F(NvmeTest, CancelledLockHoldLetsTheDoorbellGoOn) {
  Make({}, 4, 2, LockFault{.hold_ms = 3'600'000, .every = 1});
  Enable();
  CreateIoQueues();
  Sqe(io, 0x00, 1, 0, 0, 0);
  std::atomic<bool> returned{false};
  std::thread doorbell([&] {
    W(kDoorbells + 8, io.tail);
    returned = true;
  });
  for (int i = 0; i < 1000 && dev->stats().lock_holds == 0; ++i)
    std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned);
  dev->CancelInjectedWaits();
  doorbell.join();
  EXPECT_EQ(Reap(io).first, kSuccess);
  Sqe(io, 0x00, 1, 0, 0, 0);
  W(kDoorbells + 8, io.tail);  // cancelled: no hold
  EXPECT_EQ(Reap(io).first, kSuccess);
  EXPECT_EQ(dev->stats().lock_holds, 1u);
}

// What the watchdog's stack capture of a doorbell stuck in each injected wait shows, the
// doorbell's exit recorded as a vCPU loop records it: read() under BackendWait for
// backend-delay, the device's lock (LockDevice) for lock.
class NvmeStackTest : public NvmeTest {
 protected:
  // Rings the I/O SQ doorbell inside a recorded MMIO exit on another thread; returns the
  // user frames' function names of the first stuck finding's capture ("" when none).
  std::string StuckDoorbellStack() {
    RecorderOptions ro;
    ro.num_vcpus = 1;
    ro.slow_exit.log = false;
    ro.watchdog.stuck_exit_ns = 100'000'000;  // 100 ms
    auto rec = Recorder::Create(ro);
    EXPECT_TRUE(rec) << rec.error().message;
    if (!rec) return "";
    (*rec)->SetLogSink([](std::string_view) {});
    if (Status st = (*rec)->InstallStackSignal(SIGRTMIN + 2); !st) {
      ADD_FAILURE() << st.error().message;
      return "";
    }
    Sqe(io, 0x02, 1, kBuf, 0, 0, 7);
    const uint32_t tail = io.tail;
    std::thread vcpu([&] {
      (*rec)->BeginExit(0, ExitKind::kMmio, ES_NVME_BASE + kDoorbells + 8, 4, AccessDir::kWrite,
                        tail);
      W(kDoorbells + 8, tail);
      (*rec)->EndExit(0);
    });
    vcpu.join();
    EXPECT_EQ(Reap(io).first, kSuccess);
    std::string names;
    for (const FindingRecord& f : (*rec)->Findings()) {
      if (f.type != FindingType::kStuckExitBegin) continue;
      for (const StackFrame& fr : f.stack.user) names += fr.function + "\n";
      if (f.stack.user.empty()) names = "(no user frames: " + f.stack.note + ")";
      break;
    }
    (*rec)->RemoveStackSignal();
    return names;
  }
};

TEST_F(NvmeStackTest, ABackendDelayShowsReadUnderBackendWaitInTheDoorbell) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan defers the stack signal to its own safe points, so the doorbell never "
                  "unwinds in time (stack_capture_test checks that timeout path under TSan)";
#endif
  BackendFaults f;
  f.delay_ms = 1200;  // the watchdog (100 ms) finds it stuck even on a loaded machine
  f.delay_every = 1;
  Make(f);
  Enable();
  CreateIoQueues();
  const std::string stack = StuckDoorbellStack();
  EXPECT_NE(stack.find("exitscope::vmm::BackendWait"), std::string::npos) << stack;
  EXPECT_NE(stack.find("NvmeBlock::Submit"), std::string::npos) << stack;
  EXPECT_NE(stack.find("NvmeBlock::RingSq"), std::string::npos) << stack;
  EXPECT_EQ(stack.find("LockDevice"), std::string::npos) << stack;
}

TEST_F(NvmeStackTest, AHeldLockShowsTheDoorbellWaitingInLockDevice) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan defers the stack signal to its own safe points, so the doorbell never "
                  "unwinds in time (stack_capture_test checks that timeout path under TSan)";
#endif
  Make({}, 4, 2, LockFault{.hold_ms = 1200, .every = 1});  // as above: room on a loaded machine
  Enable();
  CreateIoQueues();
  const std::string stack = StuckDoorbellStack();
  EXPECT_NE(stack.find("NvmeBlock::LockDevice"), std::string::npos) << stack;
  EXPECT_NE(stack.find("NvmeBlock::RingSq"), std::string::npos) << stack;
  EXPECT_EQ(stack.find("BackendWait"), std::string::npos) << stack;
}

TEST_F(NvmeTest, CompletionsBeyondAFullCqWaitForTheHeadDoorbell) {
  Make();
  Enable();
  // A 2-entry CQ holds one completion; the second waits until the head moves.
  ASSERT_EQ(Admin(0x05, 0, kIoCq, 1 << 16 | 1, 3), kSuccess);
  ASSERT_EQ(Admin(0x01, 0, kIoSq, (kDepth - 1) << 16 | 1, 1 << 16 | 1), kSuccess);
  Sqe(io, 0x00, 1, 0, 0, 0);
  Sqe(io, 0x00, 1, 0, 0, 0);
  W(kDoorbells + 8, io.tail);
  for (int i = 0; i < 1000 && dev->stats().completed < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(dev->stats().completed, 2u);
  EXPECT_GE(dev->stats().queue_full, 1u);
  uint32_t c[4];
  ASSERT_TRUE(mem.Read(kIoCq, c, 16));
  EXPECT_EQ(c[3] >> 16 & 1, 1u);  // first posted
  ASSERT_TRUE(mem.Read(kIoCq + 16, c, 16));
  EXPECT_EQ(c[3] >> 16 & 1, 0u);  // second waits
  W(kDoorbells + 12, 1);          // guest consumed entry 0
  ASSERT_TRUE(mem.Read(kIoCq + 16, c, 16));
  EXPECT_EQ(c[3] >> 16 & 1, 1u);  // now posted
}

}  // namespace
}  // namespace exitscope::vmm
