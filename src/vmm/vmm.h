// vmm/vmm.h: the reference VMM, put together: guest memory and user64 tables, the guest
// image, devices on the bus (uart0 on PIO 0x3f8, debug0 on PIO 0x500, nvme0 on MMIO
// 0xfebf0000), fault injection, the recorder (when recording), one thread per vCPU, KVM
// binary stats, dumps.
//
//   auto vmm = exitscope::vmm::Vmm::Create({.vcpus = 2, .guest = "blk"});   // no KVM needed
//   if (!vmm) ...;                                 // bad flags: kInvalidArgument / kNotFound
//   auto result = (*vmm)->Run();                   // kUnavailable without /dev/kvm
//
// Create does everything that does not need /dev/kvm (so flag errors come first and the
// device / table setup is testable anywhere); Run opens /dev/kvm, boots and waits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/address_space.h"
#include "exitscope/recorder.h"
#include "exitscope/status.h"
#include "guests/abi.h"
#include "vmm/devices/debug_exit.h"
#include "vmm/devices/nvme_block.h"
#include "vmm/devices/uart16550.h"
#include "vmm/fault_injection.h"
#include "vmm/guest_memory.h"
#include "vmm/vcpu_loop.h"

namespace exitscope::vmm {

struct VmmConfig {
  uint32_t vcpus = 2;
  std::string guest = "hello";  // shipped guest name or path to a flat image
  uint64_t guest_arg = 0;       // rdx at entry (0 = the guest's default)
  uint64_t mem_bytes = ES_DEFAULT_MEM_SIZE;
  std::string serial_path;             // UART output file; "" or "-" = serial_stream/stdout
  std::FILE* serial_stream = nullptr;  // used when serial_path is empty (nullptr: stdout)
  bool serial_quiet = false;           // discard UART output (the transcript is kept)
  std::string disk_path;               // backing file, created when missing; "" = temporary
  uint64_t disk_bytes = 16ull << 20;   // size of a created disk
  std::vector<InjectSpec> injects;
  uint64_t slow_ms = 20;       // slow-exit threshold and watchdog stuck threshold
  uint64_t io_age_ms = 20000;  // watchdog: I/O in flight this long
  bool record = true;
  uint64_t events_per_vcpu = 1 << 16;
  std::string dump_path;    // "" = exitscope-<pid>.esdump in the cwd
  bool write_dump = true;   // at the end and on a fatal guest error
  bool dump_signal = true;  // SIGUSR1 -> dump into dump_signal_dir
  std::string dump_signal_dir = ".";
  double duration_s = 0;  // stop after this long (0 = when the guest ends)
  uint32_t backend_workers = 2;
  uint32_t backend_depth = 1;  // 1: a doorbell waits while the backend holds an I/O
  uint32_t halt_tick_us = 1000;
  std::string kvm_path = "/dev/kvm";
  std::function<void(std::string_view)> log;  // one line, no newline; default stderr
};

struct VcpuReport {
  uint32_t vcpu = 0;
  VcpuOutcome outcome;
  std::map<std::string, uint64_t> kvm_stats;  // KVM binary stats sampled at the end
};

struct VmmResult {
  bool passed = false;  // every vCPU finished with code 0
  bool fatal = false;   // a vCPU hit a fatal guest error
  std::string fatal_detail;
  bool stopped = false;  // --duration (or a stop request) ended the run
  double elapsed_s = 0;
  uint64_t userspace_exits = 0;
  std::vector<VcpuReport> vcpus;
  std::string dump_path;     // "" when none written
  std::string dump_error;    // why the end-of-run dump failed ("" = written, or not asked for)
  std::string serial_error;  // why writing the --serial file failed ("" = it did not)
  NvmeBlock::Stats block;
  uint64_t unassigned_accesses = 0;  // accesses no device answered (all, logged or not)
  uint64_t unassigned_logged = 0;    // distinct addresses logged (once each)
  uint64_t unassigned_overflow = 0;  // accesses not logged because the log was full
  std::string kvm_stats_note;        // why stats are missing, when they are
};

class Vmm {
 public:
  static Result<std::unique_ptr<Vmm>> Create(VmmConfig config);
  ~Vmm();
  Vmm(const Vmm&) = delete;
  Vmm& operator=(const Vmm&) = delete;

  // Boots on /dev/kvm and runs until every vCPU finished, one failed fatally, the duration
  // passed or RequestStop. kUnavailable without /dev/kvm (message names the reason).
  Result<VmmResult> Run();
  // Thread-safe and async-signal-safe (one atomic store).
  void RequestStop() noexcept { stop_requested_.store(true, std::memory_order_release); }

  Recorder* recorder() { return recorder_.get(); }
  const AddressSpace& bus() const { return bus_; }
  GuestMemory& memory() { return mem_; }
  Uart16550& uart() { return *uart_; }
  NvmeBlock& block() { return *nvme_; }
  DebugExit& debug() { return *debug_; }
  const VmmConfig& config() const { return cfg_; }
  const std::string& image_path() const { return image_path_; }
  const std::string& dump_path() const { return dump_path_; }
  // Device indices (identical in the bus and the recorder's address space).
  uint32_t uart_index() const { return uart_dev_; }
  uint32_t debug_index() const { return debug_dev_; }
  uint32_t nvme_index() const { return nvme_dev_; }

 private:
  explicit Vmm(VmmConfig config);
  Status Setup();
  Status RegisterDevices(AddressSpace& space);
  void Log(std::string_view line);
  void VcpuThread(uint32_t i);
  void StopAll();
  void SampleKvmStats(VmmResult* result);
  Status WriteDumpNow(const char* why);
  void NoteUnassigned();  // the unassigned-access counts as the dump attribute "unassigned"

  VmmConfig cfg_;
  std::string image_path_;
  std::string dump_path_;
  GuestMemory mem_;
  AddressSpace bus_;
  std::unique_ptr<Recorder> recorder_;
  std::FILE* serial_ = nullptr;
  bool own_serial_ = false;
  int disk_fd_ = -1;
  std::unique_ptr<Uart16550> uart_;
  std::unique_ptr<DebugExit> debug_;
  std::unique_ptr<NvmeBlock> nvme_;
  std::unique_ptr<class BlockRecorder> block_observer_;
  std::unique_ptr<ExitDelayInjector> delays_;
  std::unique_ptr<HaltWaiter> halt_;
  std::unique_ptr<UnassignedLog> unassigned_;
  uint32_t uart_dev_ = 0, debug_dev_ = 0, nvme_dev_ = 0;

  // Set in Run.
  std::unique_ptr<class KvmSystem> kvm_;
  std::unique_ptr<class KvmVm> vm_;
  std::vector<std::unique_ptr<class KvmVcpu>> vcpus_;
  std::vector<int> stats_fds_;
  VcpuEnv env_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_requested_{false};
  std::mutex mu_;
  std::condition_variable done_cv_;
  uint32_t running_ = 0;
  std::vector<VcpuOutcome> outcomes_;
  std::vector<unsigned long> threads_;  // pthread_t of the vCPU threads
  std::string fatal_;
};

}  // namespace exitscope::vmm
