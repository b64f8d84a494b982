/* blk: drives the NVMe-style block device. vCPU 0 enables the controller (AQA/ASQ/ACQ, CC.EN,
 * CSTS.RDY), identifies the namespace and creates one I/O queue pair per vCPU; then every
 * vCPU writes ES_BLK_PATTERN over its own ES_BLK_LBAS_PER_VCPU blocks in batches of 8
 * commands, reads them back, verifies, and reports through the UART. Completions are polled
 * in memory; a vCPU that has nothing to do halts (int3) until the VMM's completion "interrupt"
 * or its next tick. arg = rounds (default 1); the disk keeps the last round's pattern. */
#include "lib/guest.h"

#define NVME_CAP 0x00
#define NVME_CC 0x14
#define NVME_CSTS 0x1c
#define NVME_AQA 0x24
#define NVME_ASQ 0x28
#define NVME_ACQ 0x30
#define NVME_DB 0x1000

#define QDEPTH 16
#define BATCH 8
#define PAGE 4096

struct sqe {
  u32 cdw0, nsid, rsvd2, rsvd3;
  u64 mptr, prp1, prp2;
  u32 cdw10, cdw11, cdw12, cdw13, cdw14, cdw15;
};

struct cqe {
  u32 dw0, dw1, dw2, dw3;
};

struct queue {
  volatile struct sqe* sq;
  volatile struct cqe* cq;
  u16 qid, sq_tail, cq_head, cid;
  u32 phase;
};

static struct sqe admin_sq[QDEPTH] __attribute__((aligned(PAGE)));
static struct cqe admin_cq[QDEPTH] __attribute__((aligned(PAGE)));
static struct sqe io_sq[ES_MAX_VCPUS][PAGE / sizeof(struct sqe)] __attribute__((aligned(PAGE)));
static struct cqe io_cq[ES_MAX_VCPUS][PAGE / sizeof(struct cqe)] __attribute__((aligned(PAGE)));
static u64 data[ES_MAX_VCPUS][BATCH][PAGE / 8] __attribute__((aligned(PAGE)));
static u8 identify_buf[PAGE] __attribute__((aligned(PAGE)));
static volatile u32 controller_state; /* 0 = starting, 1 = ready, 2 = failed */

static void ring_sq(struct queue* q) {
  mmio_write32(ES_NVME_BASE + NVME_DB + (2u * q->qid) * 4, q->sq_tail);
}

static void submit(struct queue* q, u32 opcode, u32 nsid, u64 prp1, u32 cdw10, u32 cdw11,
                   u32 cdw12) {
  volatile struct sqe* e = &q->sq[q->sq_tail];
  e->cdw0 = opcode | ((u32)q->cid++ << 16);
  e->nsid = nsid;
  e->rsvd2 = e->rsvd3 = 0;
  e->mptr = 0;
  e->prp1 = prp1;
  e->prp2 = 0;
  e->cdw10 = cdw10;
  e->cdw11 = cdw11;
  e->cdw12 = cdw12;
  e->cdw13 = e->cdw14 = e->cdw15 = 0;
  q->sq_tail = (u16)((q->sq_tail + 1) % QDEPTH);
}

/* Waits for the next completion; returns its status field (0 = success) or -1 on timeout. */
static int reap(struct queue* q, u32* result) {
  u64 halts = 0;
  for (;;) {
    for (int spin = 0; spin < 2000; ++spin) {
      volatile struct cqe* c = &q->cq[q->cq_head];
      u32 dw3 = c->dw3;
      if (((dw3 >> 16) & 1) == q->phase) {
        if (result) *result = c->dw0;
        if (++q->cq_head == QDEPTH) {
          q->cq_head = 0;
          q->phase ^= 1;
        }
        return (int)((dw3 >> 17) & 0x7fff);
      }
      cpu_relax();
    }
    if (++halts > 120000) return -1;
    halt();
  }
}

static void ring_cq(struct queue* q) {
  mmio_write32(ES_NVME_BASE + NVME_DB + (2u * q->qid + 1) * 4, q->cq_head);
}

static int admin(struct queue* aq, u32 opcode, u32 nsid, u64 prp1, u32 cdw10, u32 cdw11,
                 u32* result) {
  submit(aq, opcode, nsid, prp1, cdw10, cdw11, 0);
  ring_sq(aq);
  int st = reap(aq, result);
  ring_cq(aq);
  return st;
}

static int wait_ready(u32 want) {
  for (u64 i = 0; i < 100000; ++i) {
    if ((mmio_read32(ES_NVME_BASE + NVME_CSTS) & 1) == want) return 0;
    halt();
  }
  return -1;
}

static int controller_init(u32 nvcpus) {
  struct queue aq = {admin_sq, admin_cq, 0, 0, 0, 0, 1};
  u64 cap = mmio_read64(ES_NVME_BASE + NVME_CAP);
  if ((cap & 0xffff) + 1 < QDEPTH) return -1;
  mmio_write32(ES_NVME_BASE + NVME_CC, 0);
  if (wait_ready(0)) return -1;
  mmio_write32(ES_NVME_BASE + NVME_AQA, ((QDEPTH - 1) << 16) | (QDEPTH - 1));
  mmio_write64(ES_NVME_BASE + NVME_ASQ, (u64)admin_sq);
  mmio_write64(ES_NVME_BASE + NVME_ACQ, (u64)admin_cq);
  mmio_write32(ES_NVME_BASE + NVME_CC, 1u | (6u << 16) | (4u << 20));
  if (wait_ready(1)) return -1;
  /* Identify namespace 1: NSZE (blocks) at byte 0. */
  if (admin(&aq, 0x06, 1, (u64)identify_buf, 0, 0, 0)) return -1;
  u64 nsze = *(volatile u64*)identify_buf;
  if (nsze < (u64)nvcpus * ES_BLK_LBAS_PER_VCPU) {
    uart_line("blk: disk too small: blocks ", nsze, " needed ", (u64)nvcpus * ES_BLK_LBAS_PER_VCPU,
              "");
    return -1;
  }
  u32 granted = 0;
  if (admin(&aq, 0x09, 0, 0, 0x07, ((nvcpus - 1) << 16) | (nvcpus - 1), &granted)) return -1;
  if ((granted & 0xffff) + 1 < nvcpus) return -1;
  for (u32 v = 0; v < nvcpus; ++v) {
    u32 qid = v + 1;
    /* Create I/O CQ: physically contiguous, interrupts enabled, vector = the vCPU to wake. */
    if (admin(&aq, 0x05, 0, (u64)io_cq[v], ((QDEPTH - 1) << 16) | qid, (v << 16) | 3, 0)) return -1;
    if (admin(&aq, 0x01, 0, (u64)io_sq[v], ((QDEPTH - 1) << 16) | qid, (qid << 16) | 1, 0))
      return -1;
  }
  return 0;
}

/* Runs one batch of up to BATCH commands of ES_BLK_IO_LBAS blocks starting at lba. */
static int batch(struct queue* q, u32 vcpu, u32 opcode, u64 lba, int n) {
  for (int i = 0; i < n; ++i) {
    u64 slba = lba + (u64)i * ES_BLK_IO_LBAS;
    submit(q, opcode, 1, (u64)data[vcpu][i], (u32)slba, (u32)(slba >> 32), ES_BLK_IO_LBAS - 1);
  }
  ring_sq(q);
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    int st = reap(q, 0);
    if (st < 0) return ES_FAIL_TIMEOUT;
    if (st && !bad) {
      uart_line("blk: vCPU ", vcpu, " I/O error, status field ", (u64)st, "");
      bad = ES_FAIL_NVME_IO;
    }
  }
  ring_cq(q);
  return bad;
}

int guest_main(u32 vcpu, u32 nvcpus, u64 arg) {
  u64 rounds = arg ? arg : 1;
  if (vcpu == 0) {
    uart_init();
    int st = controller_init(nvcpus);
    __atomic_store_n(&controller_state, st ? 2 : 1, __ATOMIC_RELEASE);
    if (st) {
      uart_line("blk: controller init failed on vCPU ", vcpu, " of ", nvcpus, "");
      return ES_FAIL_NVME_INIT;
    }
  } else {
    while (__atomic_load_n(&controller_state, __ATOMIC_ACQUIRE) == 0) halt();
    if (controller_state != 1) return ES_FAIL_NVME_INIT;
  }
  struct queue q = {io_sq[vcpu], io_cq[vcpu], (u16)(vcpu + 1), 0, 0, 0, 1};
  u64 first = (u64)vcpu * ES_BLK_LBAS_PER_VCPU;
  const u64 step = (u64)BATCH * ES_BLK_IO_LBAS;
  u64 ios = 0;
  for (u64 r = 0; r < rounds; ++r) {
    for (u64 lba = first; lba < first + ES_BLK_LBAS_PER_VCPU; lba += step) {
      for (int i = 0; i < BATCH; ++i)
        for (u64 w = 0; w < PAGE / 8; ++w) {
          u64 l = lba + (u64)i * ES_BLK_IO_LBAS + w / 64;
          data[vcpu][i][w] = ES_BLK_PATTERN(l, w % 64, r);
        }
      int st = batch(&q, vcpu, 0x01, lba, BATCH);
      if (st) return st;
      ios += BATCH;
    }
    for (u64 lba = first; lba < first + ES_BLK_LBAS_PER_VCPU; lba += step) {
      memset(data[vcpu], 0, sizeof(data[vcpu]));
      int st = batch(&q, vcpu, 0x02, lba, BATCH);
      if (st) return st;
      ios += BATCH;
      for (int i = 0; i < BATCH; ++i)
        for (u64 w = 0; w < PAGE / 8; ++w) {
          u64 l = lba + (u64)i * ES_BLK_IO_LBAS + w / 64;
          if (data[vcpu][i][w] != ES_BLK_PATTERN(l, w % 64, r)) {
            uart_line("blk: vCPU ", vcpu, " verify failed at lba ", l, "");
            return ES_FAIL_VERIFY;
          }
        }
    }
  }
  uart_line("blk: vCPU ", vcpu, " verified I/Os: ", ios, "");
  return 0;
}
