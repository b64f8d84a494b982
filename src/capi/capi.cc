// capi/capi.cc: the C API (include/exitscope/exitscope.h) over exitscope::Recorder.
//
// Every entry point catches everything: no exception crosses into C. Errors set a
// thread-local message returned by es_last_error().
#include "exitscope/exitscope.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#if EXITSCOPE_HAVE_PROMETHEUS
#include "exitscope/metrics.h"
#endif
#include "exitscope/recorder.h"

struct es_recorder {
  std::unique_ptr<exitscope::Recorder> rec;
};

#if EXITSCOPE_HAVE_PROMETHEUS
struct es_metrics {
  std::unique_ptr<exitscope::MetricsExporter> exporter;
};
#else
struct es_metrics {};
#endif

namespace {

thread_local std::string g_last_error;

// What a finding hook call hands the C caller: the finding and, when it has one, its stack,
// whose frames point into the FindingRecord (alive for the call).
struct FindingCall {
  es_finding finding{};
  es_stack stack{};
  bool has_stack = false;
  std::vector<es_frame> user, kernel;

  void Fill(const exitscope::ThreadStack& s) {
    const auto frames = [](const std::vector<exitscope::StackFrame>& in,
                           std::vector<es_frame>* out) {
      out->reserve(in.size());
      for (const exitscope::StackFrame& f : in) {
        out->push_back({.ip = f.ip,
                        .offset = f.offset,
                        .function = f.function.c_str(),
                        .module = f.module.c_str(),
                        .file = f.file.c_str(),
                        .line = f.line});
      }
    };
    frames(s.user, &user);
    frames(s.kernel, &kernel);
    stack.tid = s.tid;
    stack.state = s.state;
    stack.capture = s.capture;
    stack.user_dropped = s.user_dropped;
    stack.n_user = static_cast<uint32_t>(user.size());
    stack.user = user.data();
    stack.n_kernel = static_cast<uint32_t>(kernel.size());
    stack.kernel = kernel.data();
    stack.note = s.note.c_str();
    has_stack = true;
  }
};
// The finding hook call running on this thread (es_finding_stack), else nullptr.
thread_local const FindingCall* current_finding = nullptr;

es_status SetError(es_status s, std::string message) {
  g_last_error = std::move(message);
  return s;
}

// The first es_options with struct_size (0.1.0) ends after log_slow_exits; no caller has a
// smaller one. Fields added later go after it, and this constant stays.
constexpr size_t kOptionsMinSize = offsetof(es_options, log_slow_exits) + sizeof(int);
static_assert(offsetof(es_options, struct_size) == 0, "struct_size must stay the first member");

void FillDefaults(es_options* opts) {
  const exitscope::RecorderOptions d;
  *opts = es_options{};
  opts->struct_size = sizeof(es_options);
  opts->num_vcpus = d.num_vcpus;
  opts->events_per_vcpu = d.events_per_vcpu;
  opts->device_events = d.device_events;
  opts->slow_exit_ns = d.slow_exit.threshold_ns;
  opts->stuck_exit_ns = d.watchdog.stuck_exit_ns;
  opts->io_age_ns = d.watchdog.io_age_ns;
  opts->start_watchdog = d.start_watchdog ? 1 : 0;
  opts->log_slow_exits = 1;
}

// Reads the caller's options over the defaults in *out: the fields its struct_size covers,
// no byte past it. Bytes of a newer, larger struct that this library does not know must be 0.
es_status CopyOptions(const es_options& in, es_options* out) {
  const size_t size = in.struct_size;
  if (size < kOptionsMinSize) {
    return SetError(ES_EINVAL, "es_recorder_create: es_options.struct_size is " +
                                   std::to_string(size) + " (at least " +
                                   std::to_string(kOptionsMinSize) +
                                   "): initialise the options with es_options_init");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(&in);
  for (size_t i = sizeof(es_options); i < size; ++i) {
    if (bytes[i] != 0) {
      return SetError(ES_EUNSUPPORTED, "es_recorder_create: es_options has a field at byte " +
                                           std::to_string(i) +
                                           " that libexitscope " ES_VERSION_STRING
                                           " does not know (built against a newer exitscope.h)");
    }
  }
  std::memcpy(out, &in, std::min(size, sizeof(es_options)));
  out->struct_size = sizeof(es_options);
  return ES_OK;
}

es_status FromError(const exitscope::Error& e) {
  using exitscope::ErrorCode;
  es_status s = ES_EINTERNAL;
  switch (e.code) {
    case ErrorCode::kOk:
      s = ES_OK;
      break;
    case ErrorCode::kInvalidArgument:
      s = ES_EINVAL;
      break;
    case ErrorCode::kAlreadyExists:
      s = ES_EEXIST;
      break;
    case ErrorCode::kNotFound:
      s = ES_ENOENT;
      break;
    case ErrorCode::kCorrupt:
      s = ES_ECORRUPT;
      break;
    case ErrorCode::kUnsupported:
      s = ES_EUNSUPPORTED;
      break;
    case ErrorCode::kIo:
      s = ES_EIO;
      break;
    case ErrorCode::kUnavailable:
      s = ES_EUNAVAILABLE;
      break;
    case ErrorCode::kPermission:
      s = ES_EPERM;
      break;
    case ErrorCode::kInternal:
      s = ES_EINTERNAL;
      break;
  }
  return SetError(s, e.message);
}

es_status FromStatus(const exitscope::Status& st) {
  return st ? ES_OK : FromError(st.error());
}

// Runs `f` (returning es_status) and turns any exception into a status.
template <typename F>
es_status Guard(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return SetError(ES_ENOMEM, "out of memory");
  } catch (const std::exception& e) {
    return SetError(ES_EINTERNAL, e.what());
  } catch (...) {
    return SetError(ES_EINTERNAL, "unknown internal error");
  }
}

// Out of line: the error path of es_begin_exit builds a message (and may allocate).
[[gnu::noinline, gnu::cold]] es_status BadKind(long long raw) noexcept {
  try {
    return SetError(ES_EINVAL, "es_begin_exit: exit kind " + std::to_string(raw) +
                                   " is unknown (0..12); recorded as ES_EXIT_UNKNOWN");
  } catch (...) {
    return ES_EINVAL;
  }
}

bool ValidSpace(es_space s) {
  return s == ES_SPACE_MMIO || s == ES_SPACE_PIO;
}
bool ValidDir(es_dir d) {
  return d == ES_DIR_NONE || d == ES_DIR_READ || d == ES_DIR_WRITE;
}

exitscope::IoSpace ToSpace(es_space s) {
  return s == ES_SPACE_PIO ? exitscope::IoSpace::kPio : exitscope::IoSpace::kMmio;
}
exitscope::AccessDir ToDir(es_dir d) {
  return static_cast<exitscope::AccessDir>(d);
}

es_status AddRange(es_recorder* rec, es_space space, uint64_t base, uint64_t size, uint32_t device,
                   exitscope::Result<std::shared_ptr<const exitscope::RegisterMap>> map) {
  if (!map) return FromError(map.error());
  return FromStatus(rec->rec->address_space().AddRange(ToSpace(space), base, size, device, *map));
}

}  // namespace

extern "C" {

const char* es_last_error(void) {
  return g_last_error.c_str();
}

const char* es_status_name(es_status s) {
  switch (s) {
    case ES_OK:
      return "ok";
    case ES_EINVAL:
      return "invalid argument";
    case ES_EEXIST:
      return "already exists";
    case ES_ENOENT:
      return "not found";
    case ES_ECORRUPT:
      return "corrupt";
    case ES_EUNSUPPORTED:
      return "unsupported";
    case ES_EIO:
      return "i/o error";
    case ES_EUNAVAILABLE:
      return "unavailable";
    case ES_EPERM:
      return "permission denied";
    case ES_EINTERNAL:
      return "internal error";
    case ES_ENOMEM:
      return "out of memory";
  }
  return "unknown status";
}

const char* es_version(void) {
  return ES_VERSION_STRING;
}

uint32_t es_version_number(void) {
  return ES_VERSION_NUMBER;
}

es_status es_options_init_sized(es_options* opts, size_t size) {
  if (opts == nullptr) return SetError(ES_EINVAL, "es_options_init: opts is NULL");
  if (size < kOptionsMinSize) {
    return SetError(ES_EINVAL, "es_options_init: size " + std::to_string(size) +
                                   " is smaller than the first es_options (" +
                                   std::to_string(kOptionsMinSize) + ")");
  }
  std::memset(opts, 0, size);
  es_options d;
  FillDefaults(&d);
  // A caller with a newer header has a larger struct: its fields past ours stay zero.
  std::memcpy(opts, &d, std::min(size, sizeof(es_options)));
  opts->struct_size = static_cast<uint32_t>(size);
  return ES_OK;
}

es_status es_recorder_create(const es_options* opts, es_recorder** out) {
  if (out == nullptr) return SetError(ES_EINVAL, "es_recorder_create: out is NULL");
  *out = nullptr;
  return Guard([&]() -> es_status {
    es_options o;
    FillDefaults(&o);
    if (opts != nullptr) {
      const es_status s = CopyOptions(*opts, &o);
      if (s != ES_OK) return s;
    }
    exitscope::RecorderOptions ro;
    ro.num_vcpus = o.num_vcpus;
    ro.events_per_vcpu = o.events_per_vcpu;
    ro.device_events = o.device_events;
    ro.slow_exit.threshold_ns = o.slow_exit_ns;
    ro.watchdog.stuck_exit_ns = o.stuck_exit_ns;
    ro.watchdog.io_age_ns = o.io_age_ns;
    ro.start_watchdog = o.start_watchdog != 0;
    auto r = exitscope::Recorder::Create(ro);
    if (!r) return FromError(r.error());
    auto handle = std::make_unique<es_recorder>();
    handle->rec = std::move(*r);
    // Findings still reach the hook and the dump when logging is off: only the sink is muted.
    if (o.log_slow_exits == 0) handle->rec->SetLogSink([](std::string_view) {});
    *out = handle.release();
    return ES_OK;
  });
}

void es_recorder_destroy(es_recorder* rec) {
  try {
    delete rec;
  } catch (...) {
  }
}

es_status es_add_device(es_recorder* rec, const char* name, const char* kind, uint32_t* out_index) {
  if (rec == nullptr || name == nullptr) return SetError(ES_EINVAL, "es_add_device: NULL argument");
  return Guard([&]() -> es_status {
    auto r = rec->rec->address_space().AddDevice({.name = name, .kind = kind ? kind : ""});
    if (!r) return FromError(r.error());
    if (out_index != nullptr) *out_index = *r;
    return ES_OK;
  });
}

es_status es_add_range_builtin(es_recorder* rec, es_space space, uint64_t base, uint64_t size,
                               uint32_t device, const char* map_name) {
  if (rec == nullptr || !ValidSpace(space))
    return SetError(ES_EINVAL, "es_add_range_builtin: NULL recorder or bad space");
  return Guard([&]() -> es_status {
    if (map_name == nullptr) {
      return FromStatus(rec->rec->address_space().AddRange(ToSpace(space), base, size, device));
    }
    return AddRange(rec, space, base, size, device, exitscope::RegisterMap::Builtin(map_name));
  });
}

es_status es_add_range_file(es_recorder* rec, es_space space, uint64_t base, uint64_t size,
                            uint32_t device, const char* map_path) {
  if (rec == nullptr || map_path == nullptr || !ValidSpace(space))
    return SetError(ES_EINVAL, "es_add_range_file: NULL argument or bad space");
  return Guard([&]() -> es_status {
    auto m = exitscope::RegisterMap::Load(map_path);
    if (!m) return FromError(m.error());
    return AddRange(rec, space, base, size, device,
                    std::make_shared<const exitscope::RegisterMap>(std::move(*m)));
  });
}

es_status es_remove_range(es_recorder* rec, es_space space, uint64_t base) {
  if (rec == nullptr || !ValidSpace(space))
    return SetError(ES_EINVAL, "es_remove_range: bad argument");
  return Guard(
      [&] { return FromStatus(rec->rec->address_space().RemoveRange(ToSpace(space), base)); });
}

es_status es_resolve(const es_recorder* rec, es_space space, uint64_t addr, uint32_t size,
                     es_dir dir, char* buf, size_t buf_len) {
  if (rec == nullptr || buf == nullptr || buf_len == 0 || !ValidSpace(space) || !ValidDir(dir))
    return SetError(ES_EINVAL, "es_resolve: bad argument");
  return Guard([&]() -> es_status {
    const exitscope::AddressSpace& as = rec->rec->address_space();
    const exitscope::Resolution r = as.Lookup(ToSpace(space), addr, size, ToDir(dir));
    std::string s;
    if (!r.assigned()) {
      s = "unassigned";
    } else {
      s = as.DeviceName(r.device);
      const std::string reg = exitscope::AddressSpace::RegisterName(r, size);
      if (!reg.empty()) {
        s += "." + reg;
      } else {
        char off[32];
        std::snprintf(off, sizeof off, "+%#llx", static_cast<unsigned long long>(r.offset));
        s += off;
      }
    }
    if (s.size() + 1 > buf_len) {
      std::memcpy(buf, s.data(), buf_len - 1);
      buf[buf_len - 1] = '\0';
      return SetError(ES_EINVAL, "es_resolve: buffer too small for '" + s + "'");
    }
    std::memcpy(buf, s.c_str(), s.size() + 1);
    return ES_OK;
  });
}

es_status es_begin_exit(es_recorder* rec, uint32_t vcpu, es_exit_kind kind, uint64_t addr,
                        uint8_t size, es_dir dir, uint64_t value) {
  if (rec == nullptr) return ES_OK;  // recording switched off: a no-op
  // The caller's integer is checked before any narrowing (257 must not become 1, MMIO), and
  // read as bytes: a C caller may pass any int, which is not a value of the C++ enum type.
  std::underlying_type_t<es_exit_kind> bits;
  static_assert(sizeof bits == sizeof kind);
  std::memcpy(&bits, &kind, sizeof bits);
  const auto raw = static_cast<long long>(static_cast<std::make_signed_t<decltype(bits)>>(bits));
  const bool known = raw >= 0 && raw < exitscope::kExitKindCount;
  rec->rec->BeginExit(vcpu,
                      known ? static_cast<exitscope::ExitKind>(raw) : exitscope::ExitKind::kUnknown,
                      addr, size, ValidDir(dir) ? ToDir(dir) : exitscope::AccessDir::kNone, value);
  if (__builtin_expect(known, 1)) return ES_OK;
  return BadKind(raw);
}

void es_end_exit(es_recorder* rec, uint32_t vcpu) {
  if (rec != nullptr) rec->rec->EndExit(vcpu);
}

void es_end_exit_value(es_recorder* rec, uint32_t vcpu, uint64_t value) {
  if (rec != nullptr) rec->rec->EndExit(vcpu, value);
}

void es_io_submit(es_recorder* rec, uint32_t device, uint64_t io_id) {
  if (rec != nullptr) rec->rec->IoSubmit(device, io_id);
}

void es_io_complete(es_recorder* rec, uint32_t device, uint64_t io_id, int64_t status) {
  if (rec != nullptr) rec->rec->IoComplete(device, io_id, status);
}

void es_queue_full(es_recorder* rec, uint32_t device, uint64_t queue) {
  if (rec != nullptr) rec->rec->QueueFull(device, queue);
}

void es_backend_error(es_recorder* rec, uint32_t device, int64_t error, const char* note) {
  if (rec != nullptr) rec->rec->BackendError(device, error, note ? note : "");
}

void es_note(es_recorder* rec, uint32_t device, const char* text) {
  if (rec != nullptr && text != nullptr) rec->rec->Note(device, text);
}

es_status es_set_slow_exit_ns(es_recorder* rec, uint64_t threshold_ns) {
  if (rec == nullptr || threshold_ns == 0)
    return SetError(ES_EINVAL, "es_set_slow_exit_ns: NULL recorder or zero threshold");
  return Guard([&] {
    exitscope::SlowExitPolicy p;
    p.threshold_ns = threshold_ns;
    rec->rec->SetSlowExitPolicy(std::move(p));
    return ES_OK;
  });
}

es_status es_set_finding_hook(es_recorder* rec, es_finding_hook hook, void* user) {
  if (rec == nullptr) return SetError(ES_EINVAL, "es_set_finding_hook: NULL recorder");
  return Guard([&] {
    if (hook == nullptr) {
      rec->rec->SetFindingHook(nullptr);
      return ES_OK;
    }
    exitscope::Recorder* r = rec->rec.get();
    rec->rec->SetFindingHook([hook, user, r](const exitscope::FindingRecord& f) {
      const exitscope::AddressSpace& as = r->address_space();
      const std::string device = as.DeviceName(f.device);
      std::string reg;
      if (f.device != exitscope::kUnassigned && f.reg != exitscope::kNoRegister) {
        const exitscope::Resolution res =
            as.Lookup(exitscope::SpaceOf(f.kind), f.addr, f.size, f.dir);
        reg = exitscope::AddressSpace::RegisterName(res, f.size);
      }
      FindingCall call;
      es_finding& c = call.finding;
      c.type = static_cast<es_event_type>(f.type);
      c.vcpu = f.vcpu;
      c.kind = static_cast<es_exit_kind>(f.kind);
      c.dir = static_cast<es_dir>(f.dir);
      c.size = f.size;
      c.addr = f.addr;
      c.duration_ns = f.duration_ns;
      c.io_id = f.io_id;
      c.device = device.c_str();
      c.reg = reg.c_str();
      c.line = f.text.c_str();
      if (!f.stack.empty() || !f.stack.note.empty()) call.Fill(f.stack);
      const FindingCall* outer = current_finding;
      current_finding = &call;
      hook(&c, user);
      current_finding = outer;
    });
    return ES_OK;
  });
}

const es_stack* es_finding_stack(const es_finding* finding) {
  const FindingCall* call = current_finding;
  if (finding == nullptr || call == nullptr || finding != &call->finding || !call->has_stack)
    return nullptr;
  return &call->stack;
}

es_status es_set_thread_id(es_recorder* rec, uint32_t vcpu, int32_t tid) {
  if (rec == nullptr) return SetError(ES_EINVAL, "es_set_thread_id: NULL recorder");
  return Guard([&] { return FromStatus(rec->rec->SetThreadId(vcpu, tid)); });
}

es_status es_install_stack_signal(es_recorder* rec, int signo) {
  if (rec == nullptr) return SetError(ES_EINVAL, "es_install_stack_signal: NULL recorder");
  return Guard([&] { return FromStatus(rec->rec->InstallStackSignal(signo)); });
}

es_status es_watchdog_start(es_recorder* rec, uint64_t stuck_exit_ns, uint64_t io_age_ns) {
  if (rec == nullptr) return SetError(ES_EINVAL, "es_watchdog_start: NULL recorder");
  return Guard([&] {
    exitscope::WatchdogOptions o;
    if (stuck_exit_ns != 0) o.stuck_exit_ns = stuck_exit_ns;
    if (io_age_ns != 0) o.io_age_ns = io_age_ns;
    return FromStatus(rec->rec->StartWatchdog(o));
  });
}

void es_watchdog_stop(es_recorder* rec) {
  if (rec != nullptr) rec->rec->StopWatchdog();
}

es_status es_set_attribute(es_recorder* rec, const char* key, const char* value) {
  if (rec == nullptr || key == nullptr || value == nullptr)
    return SetError(ES_EINVAL, "es_set_attribute: NULL argument");
  return Guard([&] {
    rec->rec->SetAttribute(key, value);
    return ES_OK;
  });
}

es_status es_set_vcpu_counter(es_recorder* rec, uint32_t vcpu, const char* name, uint64_t value) {
  if (rec == nullptr || name == nullptr)
    return SetError(ES_EINVAL, "es_set_vcpu_counter: NULL argument");
  return Guard([&] { return FromStatus(rec->rec->SetVcpuCounter(vcpu, name, value)); });
}

es_status es_write_dump(const es_recorder* rec, const char* path, int include_guest_data) {
  if (rec == nullptr || path == nullptr) return SetError(ES_EINVAL, "es_write_dump: NULL argument");
  return Guard([&] {
    exitscope::DumpOptions o;
    o.include_guest_data = include_guest_data != 0;
    return FromStatus(rec->rec->WriteDump(path, o));
  });
}

es_status es_install_dump_signal(es_recorder* rec, int signo, const char* directory) {
  if (rec == nullptr || directory == nullptr)
    return SetError(ES_EINVAL, "es_install_dump_signal: NULL argument");
  return Guard([&] { return FromStatus(rec->rec->InstallDumpSignal(signo, directory)); });
}

es_status es_get_counters(const es_recorder* rec, es_counters* out) {
  if (rec == nullptr || out == nullptr)
    return SetError(ES_EINVAL, "es_get_counters: NULL argument");
  return Guard([&] {
    *out = es_counters{};
    const exitscope::Recorder& r = *rec->rec;
    for (uint32_t v = 0; v < r.num_vcpus(); ++v) {
      const exitscope::RingCounters c = r.ring_counters(v);
      out->exits_written += c.written;
      out->exits_overwritten += c.overwritten;
      out->exits_skipped += c.skipped;
    }
    const exitscope::RecorderCounters rc = r.counters();
    out->slow_exits = rc.slow_exits;
    out->bad_vcpu = rc.bad_vcpu;
    out->end_without_begin = rc.end_without_begin;
    out->begin_without_end = rc.begin_without_end;
    out->io_in_flight = rc.io_in_flight;
    const exitscope::DeviceEventCounters dc = r.device_event_counters();
    out->device_events_written = dc.written;
    out->device_events_overwritten = dc.overwritten;
    return ES_OK;
  });
}

es_status es_check_dump(const char* path) {
  if (path == nullptr) return SetError(ES_EINVAL, "es_check_dump: NULL path");
  return Guard([&]() -> es_status {
    auto d = exitscope::ReadDump(path);
    return d ? ES_OK : FromError(d.error());
  });
}

es_status es_serve_metrics(const es_recorder* rec, const char* listen, es_metrics** out) {
  if (rec == nullptr || out == nullptr)
    return SetError(ES_EINVAL, "es_serve_metrics: NULL argument");
  *out = nullptr;
#if !EXITSCOPE_HAVE_PROMETHEUS
  (void)listen;
  return SetError(ES_EUNAVAILABLE,
                  "es_serve_metrics: this libexitscope was built without the Prometheus endpoint "
                  "(EXITSCOPE_PROMETHEUS=OFF)");
#else
  return Guard([&]() -> es_status {
    exitscope::MetricsOptions o;
    if (listen != nullptr) o.listen = listen;
    auto e = exitscope::MetricsExporter::Start(*rec->rec, o);
    if (!e) return FromError(e.error());
    auto handle = std::make_unique<es_metrics>();
    handle->exporter = std::move(*e);
    *out = handle.release();
    return ES_OK;
  });
#endif
}

uint16_t es_metrics_port(const es_metrics* metrics) {
#if EXITSCOPE_HAVE_PROMETHEUS
  return metrics == nullptr ? 0 : metrics->exporter->port();
#else
  (void)metrics;
  return 0;
#endif
}

void es_metrics_stop(es_metrics* metrics) {
  try {
    delete metrics;
  } catch (...) {
  }
}

}  // extern "C"
