// vmm/devices/uart16550.h: a 16550A UART (8 ports; registered on PIO 0x3f8).
//
// Register semantics follow the 16550 data sheet: RBR/THR/DLL at 0, IER/DLM at 1 (DLL/DLM
// when LCR.DLAB=1), IIR (read) / FCR (write) at 2, LCR 3, MCR 4, LSR 5, MSR 6, SCR 7.
// Output is never busy: LSR always reports THRE|TEMT, so every byte written to THR goes to
// the output file at once (whole lines are flushed). There is no input: LSR.DR stays 0 and
// RBR reads 0. MCR loopback (bit 4) feeds THR bytes back into RBR, as on the real part.
// Thread-safe: vCPUs may write concurrently (a mutex per UART; UART exits are not hot).
#pragma once

#include <cstdio>
#include <deque>
#include <mutex>
#include <string>

#include "vmm/device.h"

namespace exitscope::vmm {

class Uart16550 final : public Device {
 public:
  // Writes output to `out` (not owned; stdout or a file). `out` may be nullptr (discard).
  explicit Uart16550(std::FILE* out) : out_(out) {}

  bool Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext& ctx) override;
  bool Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext& ctx) override;

  // Everything written to THR so far (kept for tests and the report; bounded to 1 MiB).
  std::string output() const;
  uint16_t divisor() const;
  // The errno of the first failed write or flush of `out` (0: none). After one, output is no
  // longer written (the transcript is still kept); the run reports it and exits 1.
  int write_error() const;

 private:
  uint8_t Iir() const;

  mutable std::mutex mu_;
  std::FILE* out_;
  std::string line_;
  std::string transcript_;
  int write_errno_ = 0;
  std::deque<uint8_t> loopback_;
  uint8_t ier_ = 0, lcr_ = 0x03, mcr_ = 0, scr_ = 0, fcr_ = 0;
  uint8_t dll_ = 0x0c, dlm_ = 0;  // 9600 baud after reset
  bool thre_pending_ = true;      // THR-empty interrupt condition (cleared by reading IIR)
};

}  // namespace exitscope::vmm
