#include "vmm/devices/nvme_block.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace exitscope::vmm {

using namespace nvme;

namespace {
constexpr uint64_t kCap =
    uint64_t{kMqes} | (1ull << 16) /* CQR */ | (20ull << 24) /* TO */ | (1ull << 37) /* CSS: NVM */;
constexpr uint32_t kVs = 0x00010400;
constexpr uint32_t kCsRdy = 1, kCsCfs = 2;
constexpr uint64_t kPage = 4096;

void PutStr(uint8_t* dst, const char* s, size_t width) {
  std::memset(dst, ' ', width);
  std::memcpy(dst, s, std::min(width, std::strlen(s)));
}
}  // namespace

NvmeBlock::NvmeBlock(GuestMemory* mem, Options opts)
    : mem_(mem), opts_(std::move(opts)), blocks_(opts_.disk_bytes / kBlockSize) {
  if (opts_.backend_depth == 0) opts_.backend_depth = 1;
  if (opts_.workers == 0) opts_.workers = 1;
}

Result<std::unique_ptr<NvmeBlock>> NvmeBlock::Create(GuestMemory* mem, Options opts) {
  auto dev = std::unique_ptr<NvmeBlock>(new NvmeBlock(mem, std::move(opts)));
  const BackendFaults& f = dev->opts_.faults;
  if (f.delay_ms != 0 && f.delay_every != 0) {
    auto slow = SlowBackend::Create(f.delay_ms, "nvme-delay");
    if (!slow) return Propagate(slow);
    dev->slow_ = std::move(*slow);
  }
  const LockFault& lf = dev->opts_.lock_fault;
  if (lf.hold_ms != 0 && lf.every != 0)
    dev->lock_holder_ = std::make_unique<LockHolder>(dev->mu_, lf.hold_ms, "nvme-lock");
  for (uint32_t i = 0; i < dev->opts_.workers; ++i)
    dev->workers_.emplace_back([p = dev.get()] { p->Worker(); });
  return dev;
}

NvmeBlock::~NvmeBlock() {
  Shutdown();
}

void NvmeBlock::Shutdown() {
  CancelInjectedWaits();
  {
    std::lock_guard lock(bq_mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  bq_work_.notify_all();
  bq_room_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void NvmeBlock::CancelInjectedWaits() {
  if (slow_) slow_->Cancel();
  if (lock_holder_) lock_holder_->Cancel();
}

NvmeBlock::Stats NvmeBlock::stats() const {
  Stats s;
  s.submitted = submitted_.load();
  s.completed = completed_.load();
  s.errors = errors_.load();
  s.queue_full = queue_full_.load();
  s.dropped_completions = dropped_.load();
  s.backend_waits = slow_ ? slow_->waits() : 0;
  s.lock_holds = lock_holder_ ? lock_holder_->holds() : 0;
  return s;
}

uint32_t NvmeBlock::csts() const {
  std::lock_guard lock(mu_);
  return csts_;
}

bool NvmeBlock::Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext&) {
  uint64_t v = 0;
  if (!ReadReg(offset, size, &v)) return false;
  StoreLe(v, data, size);
  return true;
}

bool NvmeBlock::Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext&) {
  return WriteReg(offset, size, LoadLe(data, size));
}

bool NvmeBlock::ReadReg(uint64_t off, uint32_t size, uint64_t* v) {
  std::lock_guard lock(mu_);
  // 8-byte registers: whole (size 8 at the start) or a 4-byte half.
  auto reg64 = [&](uint64_t base, uint64_t value) {
    if (size == 8 && off == base) return *v = value, true;
    if (size == 4 && off == base) return *v = value & 0xffffffff, true;
    if (size == 4 && off == base + 4) return *v = value >> 32, true;
    return false;
  };
  if (off < 8) return reg64(kRegCap, kCap);
  if (off >= kRegAsq && off < kRegAsq + 8) return reg64(kRegAsq, asq_);
  if (off >= kRegAcq && off < kRegAcq + 8) return reg64(kRegAcq, acq_);
  if (size != 4) return false;
  switch (off) {
    case kRegVs:
      *v = kVs;
      return true;
    case kRegIntms:
    case kRegIntmc:
      *v = intms_;
      return true;
    case kRegCc:
      *v = cc_;
      return true;
    case kRegCsts:
      *v = csts_;
      return true;
    case kRegNssr:
      *v = 0;
      return true;
    case kRegAqa:
      *v = aqa_;
      return true;
  }
  if (off >= kDoorbells && off < kDoorbells + 8 * kMaxQueues && off % 4 == 0) {
    *v = 0;  // doorbells are write-only; reads return 0 (NVMe 1.4: "reads return 0" is vendor)
    return true;
  }
  return false;
}

bool NvmeBlock::WriteReg(uint64_t off, uint32_t size, uint64_t v) {
  if (off >= kDoorbells) {
    const uint64_t rel = off - kDoorbells;
    if (size != 4 || rel % 4 != 0 || rel / 8 >= kMaxQueues) return false;
    const uint16_t qid = static_cast<uint16_t>(rel / 8);
    if (rel % 8 == 0) {
      RingSq(qid, static_cast<uint32_t>(v));
    } else {
      std::lock_guard lock(mu_);
      RingCq(qid, static_cast<uint32_t>(v));
    }
    return true;
  }
  std::lock_guard lock(mu_);
  auto reg64 = [&](uint64_t base, uint64_t* reg) {
    if (size == 8 && off == base) return *reg = v, true;
    if (size == 4 && off == base) return *reg = (*reg & ~0xffffffffull) | (v & 0xffffffff), true;
    if (size == 4 && off == base + 4) return *reg = (*reg & 0xffffffffull) | (v << 32), true;
    return false;
  };
  if (off >= kRegAsq && off < kRegAsq + 8) return reg64(kRegAsq, &asq_);
  if (off >= kRegAcq && off < kRegAcq + 8) return reg64(kRegAcq, &acq_);
  if (size != 4) return false;
  switch (off) {
    case kRegCap:
    case kRegCap + 4:
    case kRegVs:
    case kRegCsts:
      return true;  // read-only: writes dropped
    case kRegIntms:
      intms_ |= static_cast<uint32_t>(v);
      return true;
    case kRegIntmc:
      intms_ &= ~static_cast<uint32_t>(v);
      return true;
    case kRegCc:
      WriteCc(static_cast<uint32_t>(v));
      return true;
    case kRegNssr:
      return true;  // NSSRS = 0: subsystem reset not supported, write dropped
    case kRegAqa:
      aqa_ = static_cast<uint32_t>(v) & 0x0fff0fff;
      return true;
  }
  return false;
}

void NvmeBlock::WriteCc(uint32_t v) {
  const bool was = cc_ & 1, en = v & 1;
  cc_ = v;
  if (!was && en) {
    const uint32_t sqs = (aqa_ & 0xfff) + 1, cqs = (aqa_ >> 16 & 0xfff) + 1;
    const bool ok = sqs >= 2 && cqs >= 2 && asq_ % kPage == 0 && acq_ % kPage == 0 &&
                    mem_->Translate(asq_, uint64_t{sqs} * 64) != nullptr &&
                    mem_->Translate(acq_, uint64_t{cqs} * 16) != nullptr;
    if (!ok) {
      csts_ |= kCsCfs;  // controller fatal status: bad admin queue setup
      return;
    }
    sqs_[0] = Sq{true, asq_, sqs, 0, 0, 0};
    cqs_[0] = Cq{};
    cqs_[0].valid = true;
    cqs_[0].base = acq_;
    cqs_[0].size = cqs;
    cqs_[0].ien = true;
    cqs_[0].iv = 0;
    csts_ = (csts_ & ~kCsCfs) | kCsRdy;
  } else if (was && !en) {
    ++generation_;
    for (auto& q : sqs_) q = Sq{};
    for (auto& q : cqs_) q = Cq{};
    granted_queues_ = kMaxQueues - 1;
    csts_ = 0;
  }
  if (v >> 14 & 3) csts_ = (csts_ & ~0xcu) | (2u << 2);  // shutdown requested: complete
}

__attribute__((noinline)) void NvmeBlock::LockDevice(std::unique_lock<std::mutex>& lock) {
  lock.lock();
  asm volatile("" ::: "memory");  // keeps this frame: no tail call into pthread_mutex_lock
}

void NvmeBlock::RingSq(uint16_t qid, uint32_t tail) {
  std::vector<IoRequest> ios;
  {
    std::unique_lock lock(mu_, std::defer_lock);
    LockDevice(lock);
    Sq& sq = sqs_[qid];
    if (!sq.valid || !(csts_ & kCsRdy) || tail >= sq.size) return;  // ignored, as hardware
    sq.tail = tail;
    while (sq.head != sq.tail) {
      if (qid != 0 && lock_holder_ && ++io_commands_ % opts_.lock_fault.every == 0) {
        // Injected contention: the holder thread takes the device's lock (HandOver returns
        // once it has) and keeps it hold_ms; this doorbell then waits for it in LockDevice.
        const uint64_t generation = generation_;
        lock.unlock();
        lock_holder_->HandOver();
        LockDevice(lock);
        if (!sq.valid || !(csts_ & kCsRdy) || generation_ != generation) break;  // reset meanwhile
        if (sq.head == sq.tail) break;  // another doorbell of this queue took the rest
      }
      Sqe e;
      if (!mem_->ReadObj(sq.base + uint64_t{sq.head} * 64, &e)) {
        csts_ |= kCsCfs;
        return;
      }
      sq.head = (sq.head + 1) % sq.size;
      const uint16_t cid = static_cast<uint16_t>(e.cdw0 >> 16);
      if (qid == 0) {
        uint32_t dw0 = 0;
        const uint16_t st = Admin(e, &dw0);
        Post(0, cid, st, dw0);
        continue;
      }
      IoRequest req;
      const uint16_t st = PrepareIo(e, qid, &req);
      if (st != kSuccess) {
        Post(qid, cid, st, 0);
        continue;
      }
      req.generation = generation_;
      ios.push_back(req);
    }
  }
  bool full_reported = false;  // one queue-full event per doorbell, not per command
  for (IoRequest& r : ios) Submit(std::move(r), &full_reported);
}

void NvmeBlock::RingCq(uint16_t qid, uint32_t head) {
  Cq& cq = cqs_[qid];
  if (!cq.valid || head >= cq.size) return;
  cq.head = head;
  while (!cq.overflow.empty() && (cq.tail + 1) % cq.size != cq.head) {
    Completion c = cq.overflow.front();
    cq.overflow.pop_front();
    PostLocked(cq, c);
  }
}

void NvmeBlock::Post(uint16_t sqid, uint16_t cid, uint16_t status, uint32_t dw0) {
  const Sq& sq = sqs_[sqid];
  if (!sq.valid && sqid != 0) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Cq& cq = cqs_[sqid == 0 ? 0 : sq.cqid];
  if (!cq.valid) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Completion c{dw0, sqid, cid, status};
  if ((cq.tail + 1) % cq.size == cq.head) {
    cq.overflow.push_back(c);
    queue_full_.fetch_add(1, std::memory_order_relaxed);
    if (opts_.observer) opts_.observer->QueueFull(sqid == 0 ? 0 : sq.cqid, "completion queue full");
    return;
  }
  PostLocked(cq, c);
}

void NvmeBlock::PostLocked(Cq& cq, const Completion& c) {
  uint8_t* p = mem_->Translate(cq.base + uint64_t{cq.tail} * 16, 16);
  if (p == nullptr) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint32_t sqhd = sqs_[c.sqid].head;
  const uint32_t dw[3] = {c.dw0, 0, sqhd | uint32_t{c.sqid} << 16};
  std::memcpy(p, dw, sizeof(dw));
  // The phase bit is what the guest polls: publish it last.
  const uint32_t dw3 = uint32_t{c.cid} | cq.phase << 16 | uint32_t{c.status} << 17;
  __atomic_store_n(reinterpret_cast<uint32_t*>(p + 12), dw3, __ATOMIC_RELEASE);
  if (++cq.tail == cq.size) {
    cq.tail = 0;
    cq.phase ^= 1;
  }
  if (cq.ien && !(cq.iv < 32 && (intms_ >> cq.iv & 1)) && opts_.interrupt) opts_.interrupt(cq.iv);
}

uint16_t NvmeBlock::Admin(const Sqe& e, uint32_t* dw0) {
  const uint8_t opcode = e.cdw0 & 0xff;
  const uint16_t qid = e.cdw10 & 0xffff;
  const uint32_t qsize = (e.cdw10 >> 16) + 1;
  switch (opcode) {
    case 0x06:
      return Identify(e);
    case 0x09:    // Set Features
    case 0x0a: {  // Get Features
      if ((e.cdw10 & 0xff) != 0x07) return kInvalidField;
      if (opcode == 0x09) {
        const uint32_t nsqr = (e.cdw11 & 0xffff) + 1, ncqr = (e.cdw11 >> 16) + 1;
        if (nsqr == 0x10000 || ncqr == 0x10000) return kInvalidField;
        granted_queues_ =
            static_cast<uint16_t>(std::min<uint32_t>(kMaxQueues - 1, std::min(nsqr, ncqr)));
      }
      *dw0 = uint32_t{granted_queues_ - 1u} | uint32_t{granted_queues_ - 1u} << 16;
      return kSuccess;
    }
    case 0x05: {  // Create I/O Completion Queue
      if (qid == 0 || qid > granted_queues_) return kInvalidQid;
      if (cqs_[qid].valid) return kInvalidQid;
      if (qsize < 2 || qsize > kMqes + 1) return kInvalidQSize;
      if (!(e.cdw11 & 1) || e.prp1 % kPage) return kInvalidField;
      if (!mem_->Translate(e.prp1, uint64_t{qsize} * 16)) return kDataTransferError;
      Cq& cq = cqs_[qid];
      cq = Cq{};
      cq.valid = true;
      cq.base = e.prp1;
      cq.size = qsize;
      cq.ien = e.cdw11 & 2;
      cq.iv = static_cast<uint16_t>(e.cdw11 >> 16);
      return kSuccess;
    }
    case 0x01: {  // Create I/O Submission Queue
      const uint16_t cqid = static_cast<uint16_t>(e.cdw11 >> 16);
      if (qid == 0 || qid > granted_queues_ || sqs_[qid].valid) return kInvalidQid;
      if (qsize < 2 || qsize > kMqes + 1) return kInvalidQSize;
      if (cqid == 0 || cqid >= kMaxQueues || !cqs_[cqid].valid) return kCqInvalid;
      if (!(e.cdw11 & 1) || e.prp1 % kPage) return kInvalidField;
      if (!mem_->Translate(e.prp1, uint64_t{qsize} * 64)) return kDataTransferError;
      sqs_[qid] = Sq{true, e.prp1, qsize, 0, 0, cqid};
      return kSuccess;
    }
    case 0x00:  // Delete I/O Submission Queue
      if (qid == 0 || qid >= kMaxQueues || !sqs_[qid].valid) return kInvalidQid;
      sqs_[qid] = Sq{};
      return kSuccess;
    case 0x04:  // Delete I/O Completion Queue
      if (qid == 0 || qid >= kMaxQueues || !cqs_[qid].valid) return kInvalidQid;
      for (const Sq& sq : sqs_)
        if (sq.valid && sq.cqid == qid) return 0x0c | 1 << 8 | 1 << 14;  // Invalid Queue Deletion
      cqs_[qid] = Cq{};
      return kSuccess;
    case 0x08:  // Abort: never aborts (dw0 bit 0 = 1: command not aborted)
      *dw0 = 1;
      return kSuccess;
    default:
      return kInvalidOpcode;
  }
}

uint16_t NvmeBlock::Identify(const Sqe& e) {
  uint8_t buf[4096] = {};
  const uint8_t cns = e.cdw10 & 0xff;
  if (cns == 0) {
    if (e.nsid != 1) return kInvalidNamespace;
    for (int i = 0; i < 3; ++i) std::memcpy(buf + 8 * i, &blocks_, 8);  // NSZE, NCAP, NUSE
    buf[128 + 2] = 9;  // LBAF0: LBADS = 9 (512-byte blocks)
  } else if (cns == 1) {
    const uint16_t vid = 0x1b36;  // the PCI vendor id QEMU uses for its emulated devices
    std::memcpy(buf, &vid, 2);
    PutStr(buf + 4, "EXITSCOPE0001", 20);
    PutStr(buf + 24, "exitscope reference NVMe", 40);
    PutStr(buf + 64, "0.1", 8);
    buf[77] = 1;  // MDTS: 2^1 pages = 8 KiB
    const uint32_t ver = kVs;
    std::memcpy(buf + 80, &ver, 4);
    buf[512] = 0x66;  // SQES
    buf[513] = 0x44;  // CQES
    const uint32_t nn = 1;
    std::memcpy(buf + 516, &nn, 4);
  } else if (cns == 2) {
    const uint32_t first = 1;
    if (e.nsid < 1) std::memcpy(buf, &first, 4);
  } else {
    return kInvalidField;
  }
  IoRequest r;
  if (!MapPrps(e.prp1, e.prp2, sizeof(buf), &r)) return kDataTransferError;
  std::memcpy(r.seg[0], buf, r.seg_len[0]);
  if (r.seg_len[1]) std::memcpy(r.seg[1], buf + r.seg_len[0], r.seg_len[1]);
  return kSuccess;
}

bool NvmeBlock::MapPrps(uint64_t prp1, uint64_t prp2, uint32_t len, IoRequest* req) {
  const uint32_t first = static_cast<uint32_t>(std::min<uint64_t>(len, kPage - prp1 % kPage));
  req->seg[0] = mem_->Translate(prp1, first);
  req->seg_len[0] = first;
  req->seg_len[1] = len - first;
  if (req->seg[0] == nullptr) return false;
  if (req->seg_len[1] == 0) return true;
  if (prp2 % kPage || req->seg_len[1] > kPage) return false;
  req->seg[1] = mem_->Translate(prp2, req->seg_len[1]);
  return req->seg[1] != nullptr;
}

uint16_t NvmeBlock::PrepareIo(const Sqe& e, uint16_t sqid, IoRequest* req) {
  req->sqid = sqid;
  req->cid = static_cast<uint16_t>(e.cdw0 >> 16);
  req->opcode = e.cdw0 & 0xff;
  if (req->opcode == 0x00) {  // Flush
    if (e.nsid != 1 && e.nsid != 0xffffffff) return kInvalidNamespace;
    return kSuccess;
  }
  if (req->opcode != 0x01 && req->opcode != 0x02) return kInvalidOpcode;
  if (e.nsid != 1) return kInvalidNamespace;
  const uint64_t slba = uint64_t{e.cdw10} | uint64_t{e.cdw11} << 32;
  const uint32_t nlb = (e.cdw12 & 0xffff) + 1;
  if (slba >= blocks_ || nlb > blocks_ - slba) return kLbaOutOfRange;
  const uint64_t len = uint64_t{nlb} * kBlockSize;
  if (len > kMaxTransfer) return kInvalidField;
  if (e.prp1 % 4 != 0) return kInvalidField;
  if (!MapPrps(e.prp1, e.prp2, static_cast<uint32_t>(len), req)) return kDataTransferError;
  req->offset = slba * kBlockSize;
  return kSuccess;
}

void NvmeBlock::Submit(IoRequest req, bool* full_reported) {
  req.io_id = next_io_id_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lock(bq_mu_);
  auto held = [&] { return backend_.size() + in_service_ + handing_over_; };
  if (held() >= opts_.backend_depth) {
    queue_full_.fetch_add(1, std::memory_order_relaxed);
    if (opts_.observer && !*full_reported)
      opts_.observer->QueueFull(req.sqid, "backend queue full, doorbell waits");
    *full_reported = true;
    bq_room_.wait(lock, [&] { return stopping_ || held() < opts_.backend_depth; });
  }
  if (stopping_) return;
  submitted_.fetch_add(1, std::memory_order_relaxed);
  if (opts_.observer) {
    const uint32_t blocks = (req.seg_len[0] + req.seg_len[1]) / kBlockSize;
    opts_.observer->IoSubmitted(req.io_id, req.sqid, req.opcode, req.offset / kBlockSize, blocks);
  }
  ++submit_count_;
  if (slow_ && submit_count_ % opts_.faults.delay_every == 0) {
    // The injected slow backend: this doorbell waits for it inside its exit, blocked in read()
    // (BackendWait), while the I/O is in flight and holds its place in the queue.
    ++handing_over_;
    lock.unlock();
    slow_->Wait();
    lock.lock();
    --handing_over_;
  }
  backend_.push_back(req);
  lock.unlock();
  bq_work_.notify_one();
}

void NvmeBlock::Worker() {
  for (;;) {
    IoRequest req;
    {
      std::unique_lock lock(bq_mu_);
      bq_work_.wait(lock, [&] { return stopping_ || !backend_.empty(); });
      if (stopping_) return;
      req = backend_.front();
      backend_.pop_front();
      ++in_service_;
    }
    const uint64_t n = io_count_.fetch_add(1, std::memory_order_relaxed) + 1;
    const BackendFaults& f = opts_.faults;
    uint16_t status = kSuccess;
    int err = 0;
    if (f.error_every && n % f.error_every == 0) {
      err = EIO;
      if (opts_.observer) opts_.observer->BackendError(req.io_id, err, "injected backend error");
    } else if (req.opcode == 0x00) {
      if (fdatasync(opts_.fd) != 0) err = errno;
    } else {
      uint64_t off = req.offset;
      for (int s = 0; s < 2 && err == 0; ++s) {
        uint32_t done = 0;
        while (done < req.seg_len[s]) {
          const ssize_t r =
              req.opcode == 0x01
                  ? pwrite(opts_.fd, req.seg[s] + done, req.seg_len[s] - done, off + done)
                  : pread(opts_.fd, req.seg[s] + done, req.seg_len[s] - done, off + done);
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {
            err = r < 0 ? errno : EIO;  // EOF inside the namespace: file shrank under us
            break;
          }
          done += static_cast<uint32_t>(r);
        }
        off += req.seg_len[s];
      }
      if (err != 0 && opts_.observer)
        opts_.observer->BackendError(req.io_id, err, req.opcode == 0x01 ? "pwrite" : "pread");
    }
    if (err != 0) status = req.opcode == 0x02 ? kUnrecoveredRead : kWriteFault;
    Complete(req, status, err);
    {
      std::lock_guard lock(bq_mu_);
      --in_service_;
    }
    bq_room_.notify_all();
  }
}

void NvmeBlock::Complete(const IoRequest& req, uint16_t status, int err) {
  if (status != kSuccess) errors_.fetch_add(1, std::memory_order_relaxed);
  // The device event first: the guest may see the completion (and ring again) at once.
  if (opts_.observer) opts_.observer->IoCompleted(req.io_id, status, err);
  {
    std::lock_guard lock(mu_);
    if (req.generation != generation_)
      dropped_.fetch_add(1, std::memory_order_relaxed);
    else
      Post(req.sqid, req.cid, status, 0);
  }
  // Counted once posted (or dropped), so stats().completed == n means n completions are in
  // guest memory or waiting in a CQ overflow list.
  completed_.fetch_add(1, std::memory_order_release);
}

}  // namespace exitscope::vmm
