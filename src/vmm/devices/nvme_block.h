// vmm/devices/nvme_block.h: an NVMe-style block device (MMIO registers per NVMe 1.4 section 3,
// admin and I/O queues in guest memory) backed by a file, serviced by backend worker threads.
//
// What is modelled:
//   registers  CAP (MQES 1023, CQR, DSTRD 0, CSS NVM, TO 10 s), VS 1.4, INTMS/INTMC, CC (EN,
//              SHN), CSTS (RDY, CFS, SHST), NSSR (reads 0, writes dropped: NSSRS=0), AQA, ASQ,
//              ACQ, and doorbells SQyTDBL at 0x1000 + 8y, CQyHDBL at 0x1004 + 8y for
//              queues 0..kMaxQueues-1. 8-byte registers take 4-byte halves too.
//   admin      Identify (CNS 0 namespace, 1 controller, 2 active namespace list), Set/Get
//              Features (Number of Queues), Create/Delete I/O CQ and SQ, Abort (never aborts).
//   I/O        Flush, Write, Read on namespace 1, 512-byte blocks, PRP1 + PRP2 (at most
//              MDTS = 8 KiB per command, no PRP lists).
// Threads: register accesses and doorbells run on the vCPU thread that exited; admin commands
// complete there. I/O commands go to a bounded backend queue (Options::backend_depth I/Os
// queued, in service or being handed to the backend); when it is full the doorbell waits for
// room, so a slow backend shows up as a slow doorbell exit (and a queue-full event), as in VMMs
// that submit synchronously. Worker threads pread/pwrite straight into guest memory and post
// completions (phase bit last) and "interrupts": there is no irqchip, so an interrupt is a
// wakeup of the vCPU named by the CQ's interrupt vector (its halt ends early).
// Injected backend delay (BackendFaults::delay_ms): the doorbell that submits every Nth I/O
// hands it to a slow backend (injected_waits.h): it blocks in read() inside its exit until the
// device's delay thread feeds its descriptor, delay_ms later; the I/O is in flight meanwhile
// and holds one place of the backend queue.
// Injected lock contention (LockFault): before every Nth I/O command of a submission queue is
// taken, the doorbell lets go of the device's lock, has the device's holder thread take it
// (LockHolder, injected_waits.h) for hold_ms, and waits for it again in LockDevice: blocked in
// pthread_mutex_lock inside its exit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "vmm/device.h"
#include "vmm/devices/injected_waits.h"
#include "vmm/guest_memory.h"

namespace exitscope::vmm {

// Status field values (completion dword 3 bits 31:17): SC | SCT << 8 | DNR << 14.
namespace nvme {
inline constexpr uint16_t kSuccess = 0;
inline constexpr uint16_t kInvalidOpcode = 0x01 | 1 << 14;
inline constexpr uint16_t kInvalidField = 0x02 | 1 << 14;
inline constexpr uint16_t kDataTransferError = 0x04;
inline constexpr uint16_t kInternalError = 0x06;
inline constexpr uint16_t kInvalidNamespace = 0x0b | 1 << 14;
inline constexpr uint16_t kLbaOutOfRange = 0x80 | 1 << 14;
inline constexpr uint16_t kCqInvalid = 0x00 | 1 << 8 | 1 << 14;
inline constexpr uint16_t kInvalidQid = 0x01 | 1 << 8 | 1 << 14;
inline constexpr uint16_t kInvalidQSize = 0x02 | 1 << 8 | 1 << 14;
inline constexpr uint16_t kWriteFault = 0x80 | 2 << 8;
inline constexpr uint16_t kUnrecoveredRead = 0x81 | 2 << 8;

inline constexpr uint64_t kRegCap = 0x00, kRegVs = 0x08, kRegIntms = 0x0c, kRegIntmc = 0x10,
                          kRegCc = 0x14, kRegCsts = 0x1c, kRegNssr = 0x20, kRegAqa = 0x24,
                          kRegAsq = 0x28, kRegAcq = 0x30, kDoorbells = 0x1000;
inline constexpr uint32_t kMaxQueues = 17;  // admin + 16 I/O queue pairs
inline constexpr uint32_t kMqes = 1023;
inline constexpr uint32_t kBlockSize = 512;
inline constexpr uint32_t kMaxTransfer = 8192;
}  // namespace nvme

// Receives the device's events (the VMM forwards them to the recorder). Any thread.
class BlockObserver {
 public:
  virtual ~BlockObserver() = default;
  virtual void IoSubmitted(uint64_t io_id, uint16_t sqid, uint8_t opcode, uint64_t slba,
                           uint32_t blocks) = 0;
  // status: NVMe status field (0 = success); err: errno of a backend failure, else 0.
  virtual void IoCompleted(uint64_t io_id, uint16_t status, int err) = 0;
  virtual void QueueFull(uint16_t qid, const char* what) = 0;
  virtual void BackendError(uint64_t io_id, int err, const char* what) = 0;
};

struct BackendFaults {
  uint64_t delay_ms = 0;     // the doorbell submitting an I/O waits this long for the backend ...
  uint64_t delay_every = 0;  // ... on every Nth I/O (1 = all); 0 = no delay
  uint64_t error_every = 0;  // fail every Nth I/O (the guest sees a media error); 0 = never
};

struct LockFault {
  uint64_t hold_ms = 0;  // another thread holds the device's lock this long ...
  uint64_t every = 0;    // ... before every Nth I/O command is taken; 0 = never
};

class NvmeBlock final : public Device {
 public:
  struct Options {
    int fd = -1;                 // the backing file (not owned), opened read-write
    uint64_t disk_bytes = 0;     // namespace size = disk_bytes / 512 blocks
    uint32_t workers = 2;        // backend threads
    uint32_t backend_depth = 4;  // I/Os queued or in service before doorbells wait
    BackendFaults faults;
    LockFault lock_fault;
    BlockObserver* observer = nullptr;               // not owned; may be null
    std::function<void(uint16_t vector)> interrupt;  // wake the vCPU `vector`
  };

  // Starts the workers (and the injected faults' threads). kIo when a fault's descriptors
  // cannot be created.
  static Result<std::unique_ptr<NvmeBlock>> Create(GuestMemory* mem, Options opts);
  ~NvmeBlock() override;

  bool Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext& ctx) override;
  bool Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext& ctx) override;

  // Stops accepting work, wakes waiting doorbells and joins the workers. Idempotent.
  void Shutdown();
  // Ends the injected waits in progress now (a doorbell waiting for the slow backend goes on)
  // and skips later ones: the VM is stopping. The device keeps working. Any thread.
  void CancelInjectedWaits();

  struct Stats {
    uint64_t submitted = 0, completed = 0, errors = 0, queue_full = 0, dropped_completions = 0;
    uint64_t backend_waits = 0;  // injected backend delays waited out (or cut short by a stop)
    uint64_t lock_holds = 0;     // injected lock holds
  };
  Stats stats() const;
  uint32_t csts() const;
  uint64_t namespace_blocks() const { return blocks_; }

 private:
  struct Sqe {
    uint32_t cdw0, nsid, rsvd2, rsvd3;
    uint64_t mptr, prp1, prp2;
    uint32_t cdw10, cdw11, cdw12, cdw13, cdw14, cdw15;
  };
  static_assert(sizeof(Sqe) == 64);
  struct Sq {
    bool valid = false;
    uint64_t base = 0;
    uint32_t size = 0, head = 0, tail = 0;
    uint16_t cqid = 0;
  };
  struct Completion {
    uint32_t dw0;
    uint16_t sqid, cid, status;
  };
  struct Cq {
    bool valid = false;
    uint64_t base = 0;
    uint32_t size = 0, head = 0, tail = 0;
    uint32_t phase = 1;
    bool ien = false;
    uint16_t iv = 0;
    std::deque<Completion> overflow;  // completions waiting for the guest to free CQ slots
  };
  struct IoRequest {
    uint64_t io_id = 0;
    uint64_t generation = 0;
    uint16_t sqid = 0, cid = 0;
    uint8_t opcode = 0;
    uint64_t offset = 0;  // bytes into the file
    uint8_t* seg[2] = {nullptr, nullptr};
    uint32_t seg_len[2] = {0, 0};
  };

  NvmeBlock(GuestMemory* mem, Options opts);
  bool ReadReg(uint64_t offset, uint32_t size, uint64_t* v);
  bool WriteReg(uint64_t offset, uint32_t size, uint64_t v);
  void WriteCc(uint32_t v);                  // requires mu_
  void RingSq(uint16_t qid, uint32_t tail);  // takes mu_ itself
  // Takes mu_ for a doorbell (not inlined: a thread waiting here is waiting for the device).
  void LockDevice(std::unique_lock<std::mutex>& lock);
  void RingCq(uint16_t qid, uint32_t head);                               // requires mu_
  void Post(uint16_t sqid, uint16_t cid, uint16_t status, uint32_t dw0);  // requires mu_
  void PostLocked(Cq& cq, const Completion& c);                           // requires mu_
  uint16_t Admin(const Sqe& e, uint32_t* dw0);                            // requires mu_
  uint16_t Identify(const Sqe& e);                                        // requires mu_
  // Validates an I/O command into `req`; returns the status to complete with, 0 = submit.
  uint16_t PrepareIo(const Sqe& e, uint16_t sqid, IoRequest* req);
  bool MapPrps(uint64_t prp1, uint64_t prp2, uint32_t len, IoRequest* req);
  void Submit(IoRequest req, bool* full_reported);
  void Worker();
  void Complete(const IoRequest& req, uint16_t status, int err);

  GuestMemory* mem_;
  Options opts_;
  uint64_t blocks_;

  mutable std::mutex mu_;  // registers and queues
  uint32_t cc_ = 0, csts_ = 0, aqa_ = 0, intms_ = 0;
  uint64_t asq_ = 0, acq_ = 0;
  uint16_t granted_queues_ = nvme::kMaxQueues - 1;
  uint64_t generation_ = 0;  // bumped at every controller reset; stale I/Os post nothing
  Sq sqs_[nvme::kMaxQueues];
  Cq cqs_[nvme::kMaxQueues];

  std::mutex bq_mu_;  // backend queue
  std::condition_variable bq_work_, bq_room_;
  std::deque<IoRequest> backend_;
  uint32_t in_service_ = 0;
  uint32_t handing_over_ = 0;  // submitted I/Os whose doorbell waits for the slow backend
  uint64_t submit_count_ = 0;  // I/Os submitted (drives every-N backend delays)
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  std::atomic<uint64_t> next_io_id_{1};
  std::atomic<uint64_t> io_count_{0};  // backend I/Os started (drives every-N backend errors)
  std::atomic<uint64_t> submitted_{0}, completed_{0}, errors_{0}, queue_full_{0}, dropped_{0};

  std::unique_ptr<SlowBackend> slow_;        // backend-delay; null when not injected
  std::unique_ptr<LockHolder> lock_holder_;  // lock; null when not injected
  uint64_t io_commands_ = 0;                 // I/O commands taken (requires mu_; lock faults)
};

}  // namespace exitscope::vmm
