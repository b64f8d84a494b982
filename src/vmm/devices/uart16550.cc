#include "vmm/devices/uart16550.h"

#include <cerrno>

namespace exitscope::vmm {

namespace {
constexpr uint8_t kLsrDr = 0x01, kLsrThre = 0x20, kLsrTemt = 0x40;
constexpr uint8_t kLcrDlab = 0x80;
constexpr uint8_t kMcrLoop = 0x10;
constexpr size_t kTranscriptMax = 1 << 20;
}  // namespace

uint8_t Uart16550::Iir() const {
  // FIFO-enabled bits 7:6 when FCR bit 0 is set; 0x01 = no interrupt pending.
  const uint8_t fifo = (fcr_ & 1) ? 0xc0 : 0;
  if ((ier_ & 0x01) && !loopback_.empty()) return fifo | 0x04;  // received data available
  if ((ier_ & 0x02) && thre_pending_) return fifo | 0x02;       // THR empty
  return fifo | 0x01;
}

bool Uart16550::Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext&) {
  if (size != 1 || offset > 7) return false;
  std::lock_guard lock(mu_);
  const bool dlab = lcr_ & kLcrDlab;
  uint8_t v = 0;
  switch (offset) {
    case 0:
      if (dlab) {
        v = dll_;
      } else if (!loopback_.empty()) {
        v = loopback_.front();
        loopback_.pop_front();
      }
      break;
    case 1:
      v = dlab ? dlm_ : ier_;
      break;
    case 2:
      v = Iir();
      if ((v & 0x0f) == 0x02) thre_pending_ = false;  // reading IIR clears THRE interrupt
      break;
    case 3:
      v = lcr_;
      break;
    case 4:
      v = mcr_;
      break;
    case 5:
      v = kLsrThre | kLsrTemt | (loopback_.empty() ? 0 : kLsrDr);
      break;
    case 6:
      // Loopback: CTS=RTS, DSR=DTR, RI=OUT1, DCD=OUT2; otherwise carrier + DSR + CTS.
      v = (mcr_ & kMcrLoop) ? static_cast<uint8_t>(((mcr_ & 0x02) << 3) | ((mcr_ & 0x01) << 5) |
                                                   ((mcr_ & 0x04) << 4) | ((mcr_ & 0x08) << 4))
                            : 0xb0;
      break;
    case 7:
      v = scr_;
      break;
  }
  data[0] = v;
  return true;
}

bool Uart16550::Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext&) {
  if (size != 1 || offset > 7) return false;
  const uint8_t v = data[0];
  std::lock_guard lock(mu_);
  const bool dlab = lcr_ & kLcrDlab;
  switch (offset) {
    case 0:
      if (dlab) {
        dll_ = v;
        break;
      }
      thre_pending_ = true;
      if (mcr_ & kMcrLoop) {
        if (loopback_.size() < 16) loopback_.push_back(v);
        break;
      }
      if (transcript_.size() < kTranscriptMax) transcript_.push_back(static_cast<char>(v));
      line_.push_back(static_cast<char>(v));
      if (v == '\n' || line_.size() >= 4096) {
        if (out_ != nullptr && write_errno_ == 0) {
          errno = 0;
          const size_t n = std::fwrite(line_.data(), 1, line_.size(), out_);
          if (std::fflush(out_) != 0 || n != line_.size()) write_errno_ = errno != 0 ? errno : EIO;
        }
        line_.clear();
      }
      break;
    case 1:
      if (dlab)
        dlm_ = v;
      else
        ier_ = v & 0x0f;
      break;
    case 2:
      fcr_ = v & 0xc9;
      if (v & 0x02) loopback_.clear();  // clear receive FIFO
      break;
    case 3:
      lcr_ = v;
      break;
    case 4:
      mcr_ = v & 0x1f;
      break;
    case 5:
    case 6:
      break;  // LSR / MSR: writes have no effect on this model (factory test only)
    case 7:
      scr_ = v;
      break;
  }
  return true;
}

std::string Uart16550::output() const {
  std::lock_guard lock(mu_);
  return transcript_;
}

uint16_t Uart16550::divisor() const {
  std::lock_guard lock(mu_);
  return static_cast<uint16_t>(dlm_ << 8 | dll_);
}

int Uart16550::write_error() const {
  std::lock_guard lock(mu_);
  return write_errno_;
}

}  // namespace exitscope::vmm
