#include "vmm/vmm.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <thread>

#include "base/output_file.h"
#include "recorder/dump_file.h"
#include "vmm/guest_image.h"
#include "vmm/kvm.h"
#include "vmm/kvm_stats.h"
#include "vmm/x86_user64.h"

namespace exitscope::vmm {

namespace {

// vCPU threads are kicked out of KVM_RUN with this signal; the handler sets immediate_exit
// so a kick that lands just before KVM_RUN is not lost. Not SIGRTMIN + 2: `exitscope run`
// gives that one to the recorder's stack captures (Recorder::InstallStackSignal).
int KickSignal() {
  return SIGRTMIN + 3;
}
thread_local kvm_run* t_kick_run = nullptr;
extern "C" void KickHandler(int) {
  if (t_kick_run != nullptr) t_kick_run->immediate_exit = 1;
}

Result<std::shared_ptr<const RegisterMap>> DebugExitMap() {
  auto m = RegisterMap::Create(
      "debug-exit",
      {{"EXIT", 0, 4, RegAccess::kWrite, 1, 0, false, "guest result on this vCPU (0 = pass)"},
       {"MARKER", 4, 4, RegAccess::kWrite, 1, 0, false, "marker, recorded as a note"},
       {"FAULT", 8, 4, RegAccess::kWrite, 1, 0, false, "exception vector from a CPL0 stub"},
       {"INFO", 12, 4, RegAccess::kRead, 1, 0, false, "magic 0x45534447"}});
  if (!m) return Propagate(m);
  return std::make_shared<const RegisterMap>(std::move(*m));
}

}  // namespace

// Forwards the block device's events to the recorder as device events.
class BlockRecorder final : public BlockObserver {
 public:
  BlockRecorder(Recorder* rec, uint32_t device) : rec_(rec), device_(device) {}
  void IoSubmitted(uint64_t io_id, uint16_t, uint8_t, uint64_t, uint32_t) override {
    rec_->IoSubmit(device_, io_id);
  }
  void IoCompleted(uint64_t io_id, uint16_t status, int err) override {
    rec_->IoComplete(device_, io_id, err != 0 ? -err : status);
  }
  void QueueFull(uint16_t qid, const char*) override { rec_->QueueFull(device_, qid); }
  void BackendError(uint64_t io_id, int err, const char* what) override {
    char note[40];
    std::snprintf(note, sizeof(note), "io %" PRIu64 " %s: %s", io_id, what, std::strerror(err));
    rec_->BackendError(device_, -err, note);
  }

 private:
  Recorder* rec_;
  uint32_t device_;
};

Vmm::Vmm(VmmConfig config) : cfg_(std::move(config)) {}

Vmm::~Vmm() {
  StopAll();
  if (nvme_) nvme_->Shutdown();
  for (int fd : stats_fds_)
    if (fd >= 0) close(fd);
  if (disk_fd_ >= 0) close(disk_fd_);
  if (own_serial_ && serial_ != nullptr) std::fclose(serial_);
}

void Vmm::Log(std::string_view line) {
  if (cfg_.log) {
    cfg_.log(line);
  } else {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
}

Result<std::unique_ptr<Vmm>> Vmm::Create(VmmConfig config) {
  auto vmm = std::unique_ptr<Vmm>(new Vmm(std::move(config)));
  EXITSCOPE_RETURN_IF_ERROR(vmm->Setup());
  return vmm;
}

Status Vmm::RegisterDevices(AddressSpace& space) {
  auto uart_map = RegisterMap::Builtin("uart16550");
  if (!uart_map) return Propagate(uart_map);
  auto nvme_map = RegisterMap::Builtin("nvme");
  if (!nvme_map) return Propagate(nvme_map);
  auto debug_map = DebugExitMap();
  if (!debug_map) return Propagate(debug_map);
  auto uart = space.AddDevice({.name = "uart0", .kind = "uart16550", .id = 0});
  auto debug = space.AddDevice({.name = "debug0", .kind = "debug-exit", .id = 0});
  auto nvme = space.AddDevice({.name = "nvme0", .kind = "nvme", .id = 0});
  if (!uart || !debug || !nvme) return Fail(ErrorCode::kInternal, "registering devices failed");
  uart_dev_ = *uart;
  debug_dev_ = *debug;
  nvme_dev_ = *nvme;
  if (auto st = space.AddRange(IoSpace::kPio, ES_UART_PORT, 8, uart_dev_, *uart_map); !st)
    return st;
  if (auto st = space.AddRange(IoSpace::kPio, ES_DEBUG_PORT, 16, debug_dev_, *debug_map); !st)
    return st;
  if (auto st = space.AddRange(IoSpace::kMmio, ES_NVME_BASE, ES_NVME_SIZE, nvme_dev_, *nvme_map);
      !st)
    return st;
  return {};
}

Status Vmm::Setup() {
  if (cfg_.vcpus == 0 || cfg_.vcpus > ES_MAX_VCPUS)
    return Fail(ErrorCode::kInvalidArgument, "--vcpus " + std::to_string(cfg_.vcpus) +
                                                 ": out of range (1.." +
                                                 std::to_string(ES_MAX_VCPUS) + ")");
  if (cfg_.duration_s < 0)
    return Fail(ErrorCode::kInvalidArgument, "--duration must not be negative");
  if (cfg_.slow_ms == 0) return Fail(ErrorCode::kInvalidArgument, "--slow must be at least 1 ms");
  // Guest image.
  auto path = FindGuestImage(cfg_.guest);
  if (!path) return Propagate(path);
  image_path_ = *path;
  auto image = ReadGuestImage(image_path_);
  if (!image) return Propagate(image);
  // Memory, tables, image.
  auto mem = GuestMemory::Create(std::max<uint64_t>(cfg_.mem_bytes, ES_MIN_MEM_SIZE));
  if (!mem) return Propagate(mem);
  mem_ = std::move(*mem);
  const x86::PortRange ports[] = {{ES_UART_PORT, 8}, {ES_DEBUG_PORT, 16}};
  if (auto st = x86::BuildTables(mem_, cfg_.vcpus, ports); !st) return st;
  if (auto st = LoadGuestImage(mem_, *image); !st) return st;
  // Serial output.
  if (!cfg_.serial_path.empty() && cfg_.serial_path != "-") {
    auto serial = base::OpenLogFile(
        cfg_.serial_path, {.label = "--serial " + cfg_.serial_path, .what = "the serial log"});
    if (!serial) return Propagate(serial);
    serial_ = *serial;
    own_serial_ = true;
  } else {
    serial_ = cfg_.serial_stream != nullptr ? cfg_.serial_stream : stdout;
  }
  // Disk.
  if (cfg_.disk_path.empty()) {
    disk_fd_ = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (disk_fd_ < 0) {
      char tmpl[] = "/tmp/exitscope-disk-XXXXXX";
      disk_fd_ = mkstemp(tmpl);
      if (disk_fd_ >= 0) unlink(tmpl);
    }
    if (disk_fd_ < 0)
      return Fail(ErrorCode::kIo, std::string("temporary disk in /tmp: ") + std::strerror(errno));
  } else {
    disk_fd_ = open(cfg_.disk_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (disk_fd_ < 0)
      return Fail(ErrorCode::kIo, "--disk " + cfg_.disk_path + ": " + std::strerror(errno));
  }
  struct stat st;
  if (fstat(disk_fd_, &st) != 0)
    return Fail(ErrorCode::kIo, "--disk " + cfg_.disk_path + ": " + std::strerror(errno));
  uint64_t disk_bytes = static_cast<uint64_t>(st.st_size);
  if (disk_bytes == 0) {
    if (ftruncate(disk_fd_, static_cast<off_t>(cfg_.disk_bytes)) != 0)
      return Fail(ErrorCode::kIo, "--disk " + cfg_.disk_path + ": cannot size to " +
                                      std::to_string(cfg_.disk_bytes) +
                                      " bytes: " + std::strerror(errno));
    disk_bytes = cfg_.disk_bytes;
  }
  // Bus, recorder.
  if (auto s = RegisterDevices(bus_); !s) return s;
  if (cfg_.record) {
    RecorderOptions ro;
    ro.num_vcpus = cfg_.vcpus;
    ro.events_per_vcpu = cfg_.events_per_vcpu;
    ro.device_events = 1 << 16;
    ro.inflight_ios = 4096;
    ro.slow_exit.threshold_ns = cfg_.slow_ms * 1'000'000;
    ro.watchdog.stuck_exit_ns = cfg_.slow_ms * 1'000'000;
    ro.watchdog.io_age_ns = cfg_.io_age_ms * 1'000'000;
    ro.start_watchdog = true;
    auto rec = Recorder::Create(ro);
    if (!rec) return Propagate(rec);
    recorder_ = std::move(*rec);
    if (cfg_.log) recorder_->SetLogSink(cfg_.log);
    if (auto s = RegisterDevices(recorder_->address_space()); !s) return s;
    recorder_->SetAttribute("vmm", "exitscope-run");
    recorder_->SetAttribute("guest", cfg_.guest);
    recorder_->SetAttribute("guest.image", image_path_);
    recorder_->SetAttribute("vcpus", std::to_string(cfg_.vcpus));
    recorder_->SetAttribute("disk", cfg_.disk_path.empty() ? "(temporary)" : cfg_.disk_path);
    std::string inj;
    for (const InjectSpec& s : cfg_.injects) inj += (inj.empty() ? "" : " ") + s.text;
    if (!inj.empty()) recorder_->SetAttribute("inject", inj);
  }
  // Fault injection.
  auto delays = ExitDelayInjector::Bind(cfg_.injects, bus_);
  if (!delays) return Propagate(delays);
  delays_ = std::move(*delays);
  NvmeBlock::Options bo;
  bo.fd = disk_fd_;
  bo.disk_bytes = disk_bytes;
  bo.workers = cfg_.backend_workers;
  bo.backend_depth = cfg_.backend_depth;
  EXITSCOPE_RETURN_IF_ERROR(CheckDeviceFaults(cfg_.injects, bus_, "nvme0"));
  for (const InjectSpec& s : cfg_.injects) {
    switch (s.kind) {
      case InjectSpec::Kind::kDelay:
      case InjectSpec::Kind::kSpin:
        break;
      case InjectSpec::Kind::kBackendDelay:
        bo.faults.delay_ms = s.ms;
        bo.faults.delay_every = s.every;
        break;
      case InjectSpec::Kind::kBackendError:
        bo.faults.error_every = s.every;
        break;
      case InjectSpec::Kind::kLock:
        bo.lock_fault.hold_ms = s.ms;
        bo.lock_fault.every = s.every;
        break;
    }
  }
  halt_ = std::make_unique<HaltWaiter>(cfg_.vcpus, cfg_.halt_tick_us);
  bo.interrupt = [this](uint16_t vector) { halt_->Kick(vector); };
  if (recorder_) {
    block_observer_ = std::make_unique<BlockRecorder>(recorder_.get(), nvme_dev_);
    bo.observer = block_observer_.get();
  }
  uart_ = std::make_unique<Uart16550>(cfg_.serial_quiet ? nullptr : serial_);
  debug_ = std::make_unique<DebugExit>([this](uint32_t vcpu, uint32_t value) {
    if (!recorder_) return;
    char note[40];
    std::snprintf(note, sizeof(note), "marker 0x%x from vCPU %u", value, vcpu);
    recorder_->Note(debug_dev_, note);
  });
  auto nvme = NvmeBlock::Create(&mem_, std::move(bo));
  if (!nvme) return Propagate(nvme);
  nvme_ = std::move(*nvme);
  unassigned_ = std::make_unique<UnassignedLog>([this](std::string_view l) { Log(l); });
  dump_path_ =
      cfg_.dump_path.empty() ? "exitscope-" + std::to_string(getpid()) + ".esdump" : cfg_.dump_path;
  // The dump is written at the end (or on a fatal error): check now, by the same rule and the
  // same temporary file beside it, that it can be, so that a bad --dump is refused before the
  // guest runs rather than after (issue 28). The probe's temporary file is removed.
  if (recorder_ && cfg_.write_dump) {
    base::OutputFile probe;
    if (Status s = probe.Open(dump_path_, internal::DumpFileOptions()); !s)
      return Fail(s.error().code, "--dump " + s.error().message);
  }
  // The loop's view of the VM.
  env_.bus = &bus_;
  env_.devices.assign(bus_.device_count(), nullptr);
  env_.devices[uart_dev_] = uart_.get();
  env_.devices[debug_dev_] = debug_.get();
  env_.devices[nvme_dev_] = nvme_.get();
  env_.recorder = recorder_.get();
  env_.delays = delays_.get();
  env_.mem = &mem_;
  env_.halt = halt_.get();
  env_.unassigned = unassigned_.get();
  env_.stop = &stop_;
  return {};
}

void Vmm::VcpuThread(uint32_t i) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);  // dump requests go to the other threads
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  t_kick_run = vcpus_[i]->run();
  VcpuLoop loop(*vcpus_[i], env_);
  const VcpuOutcome& out = loop.Run();
  t_kick_run = nullptr;
  std::lock_guard lock(mu_);
  outcomes_[i] = out;
  if (out.state == VcpuState::kFatal && fatal_.empty()) fatal_ = out.detail;
  --running_;
  done_cv_.notify_all();
}

void Vmm::StopAll() {
  stop_.store(true, std::memory_order_release);
  if (halt_) halt_->KickAll();
  if (nvme_) nvme_->CancelInjectedWaits();  // a doorbell waiting for a slow backend goes on
  std::lock_guard lock(mu_);
  if (running_ == 0) return;
  for (unsigned long t : threads_) pthread_kill(static_cast<pthread_t>(t), KickSignal());
}

void Vmm::NoteUnassigned() {
  if (recorder_ && unassigned_ && unassigned_->count() > 0)
    recorder_->SetAttribute("unassigned", unassigned_->Summary());
}

Status Vmm::WriteDumpNow(const char* why) {
  if (!recorder_ || !cfg_.write_dump) return {};
  NoteUnassigned();
  if (auto st = recorder_->WriteDump(dump_path_); !st) {
    Log("exitscope run: dump " + dump_path_ + " (" + why + ") failed: " + st.error().message);
    return st;
  }
  return {};
}

void Vmm::SampleKvmStats(VmmResult* result) {
  for (uint32_t i = 0; i < vcpus_.size() && i < stats_fds_.size(); ++i) {
    if (stats_fds_[i] < 0) continue;
    const std::string origin = "KVM stats of vCPU " + std::to_string(i);
    auto schema = ReadKvmStatsSchema(stats_fds_[i], origin);
    if (!schema) {
      result->kvm_stats_note = schema.error().message;
      continue;
    }
    auto values = ReadKvmStats(stats_fds_[i], *schema, origin);
    if (!values) {
      result->kvm_stats_note = values.error().message;
      continue;
    }
    for (const KvmStatValue& v : *values) {
      result->vcpus[i].kvm_stats[v.name] = v.value;
      if (recorder_) (void)recorder_->SetVcpuCounter(i, "kvm." + v.name, v.value);
    }
  }
}

Result<VmmResult> Vmm::Run() {
  auto kvm = KvmSystem::Open(cfg_.kvm_path);
  if (!kvm) return Propagate(kvm);
  kvm_ = std::move(*kvm);
  auto vm = KvmVm::Create(*kvm_);
  if (!vm) return Propagate(vm);
  vm_ = std::move(*vm);
  EXITSCOPE_RETURN_IF_ERROR(vm_->SetMemory(0, 0, mem_.size(), mem_.host()));
  VmmResult result;
  stats_fds_.assign(cfg_.vcpus, -1);
  for (uint32_t i = 0; i < cfg_.vcpus; ++i) {
    auto v = vm_->CreateVcpu(i);
    if (!v) return Propagate(v);
    KvmVcpu& vcpu = **v;
    if (auto st = vcpu.SetCpuid(kvm_->supported_cpuid()); !st && i == 0)
      Log("exitscope run: " + st.error().message + "; running with KVM's default CPUID");
    auto sregs = vcpu.GetSregs();
    if (!sregs) return Propagate(sregs);
    x86::SetUser64Sregs(i, &*sregs);
    EXITSCOPE_RETURN_IF_ERROR(vcpu.SetSregs(*sregs));
    EXITSCOPE_RETURN_IF_ERROR(
        vcpu.SetRegs(x86::User64Regs(ES_GUEST_LOAD_ADDR, i, cfg_.vcpus, cfg_.guest_arg)));
    if (auto fd = vcpu.StatsFd())
      stats_fds_[i] = *fd;
    else
      result.kvm_stats_note = fd.error().message;
    vcpus_.push_back(std::move(*v));
  }
  if (recorder_) {
    recorder_->SetAttribute("kvm.api", std::to_string(kvm_->api_version()));
    if (cfg_.dump_signal)
      if (auto st = recorder_->InstallDumpSignal(SIGUSR1, cfg_.dump_signal_dir); !st)
        Log("exitscope run: SIGUSR1 dumps disabled: " + st.error().message);
  }
  struct sigaction sa {};
  sa.sa_handler = KickHandler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: KVM_RUN must return EINTR
  sigaction(KickSignal(), &sa, nullptr);

  outcomes_.assign(cfg_.vcpus, VcpuOutcome{});
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    running_ = cfg_.vcpus;
    for (uint32_t i = 0; i < cfg_.vcpus; ++i) {
      threads.emplace_back([this, i] { VcpuThread(i); });
      threads_.push_back(static_cast<unsigned long>(threads.back().native_handle()));
    }
  }
  const auto deadline =
      cfg_.duration_s > 0
          ? t0 + std::chrono::microseconds(static_cast<int64_t>(cfg_.duration_s * 1e6))
          : std::chrono::steady_clock::time_point::max();
  bool fatal_dumped = false;
  {
    std::unique_lock lock(mu_);
    while (running_ > 0) {
      done_cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (!fatal_.empty() && !fatal_dumped) {
        fatal_dumped = true;
        const std::string detail = fatal_;
        lock.unlock();
        Log("exitscope run: fatal guest error: " + detail);
        if (recorder_) recorder_->Note(kUnassigned, "fatal guest error");
        if (WriteDumpNow("fatal guest error")) {
          if (recorder_ && cfg_.write_dump) Log("exitscope run: dump written to " + dump_path_);
        }
        StopAll();
        lock.lock();
        continue;
      }
      const bool timeout = std::chrono::steady_clock::now() >= deadline;
      if ((timeout || stop_requested_.load(std::memory_order_acquire)) && !stop_.load()) {
        result.stopped = true;
        lock.unlock();
        StopAll();
        lock.lock();
      } else if (stop_.load() && running_ > 0) {
        // Re-kick: a kick can race with a vCPU thread entering KVM_RUN without immediate_exit.
        lock.unlock();
        StopAll();
        lock.lock();
      }
    }
  }
  for (auto& t : threads) t.join();
  {
    std::lock_guard lock(mu_);
    threads_.clear();
  }
  const auto t1 = std::chrono::steady_clock::now();
  nvme_->Shutdown();
  if (recorder_) recorder_->RemoveDumpSignal();

  result.elapsed_s = std::chrono::duration<double>(t1 - t0).count();
  result.vcpus.resize(cfg_.vcpus);
  result.passed = true;
  for (uint32_t i = 0; i < cfg_.vcpus; ++i) {
    result.vcpus[i].vcpu = i;
    result.vcpus[i].outcome = outcomes_[i];
    result.userspace_exits += outcomes_[i].exits;
    if (outcomes_[i].state != VcpuState::kFinished || outcomes_[i].code != 0) result.passed = false;
  }
  result.fatal = !fatal_.empty();
  result.fatal_detail = fatal_;
  result.block = nvme_->stats();
  result.unassigned_accesses = unassigned_->count();
  result.unassigned_logged = unassigned_->logged();
  result.unassigned_overflow = unassigned_->overflow();
  NoteUnassigned();  // also for the end report's snapshot when no dump is written
  SampleKvmStats(&result);
  if (own_serial_ && uart_ && uart_->write_error() != 0) {
    result.serial_error = "--serial " + cfg_.serial_path +
                          ": write failed: " + std::strerror(uart_->write_error()) +
                          " (the serial log is incomplete)";
  }
  if (recorder_ && cfg_.write_dump) {
    if (auto st = WriteDumpNow("end of run"); st)
      result.dump_path = dump_path_;
    else
      result.dump_error = st.error().message;
  }
  return result;
}

}  // namespace exitscope::vmm
