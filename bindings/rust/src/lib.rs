//! exitscope: the VM-exit flight recorder for Rust VMMs.
//!
//! A safe layer over libexitscope's C API (`exitscope_sys`, hand-written from
//! `include/exitscope/exitscope.h`). One [`Recorder`] per VM: it owns the address space
//! (devices, MMIO/PIO ranges and their register maps), one ring of exits per vCPU, the device
//! events, the watchdog and the dump writer.
//!
//! ```no_run
//! use exitscope::{Dir, Exit, Options, Recorder, RegisterMap, Space};
//!
//! let rec = Recorder::new(&Options { num_vcpus: 1, ..Options::default() })?;
//! let uart = rec.add_device("uart0", "uart16550")?;
//! rec.add_range(Space::Pio, 0x3f8, 8, uart, RegisterMap::Builtin("uart16550"))?;
//! let mut vcpu = rec.vcpu(0)?; // move it into the vCPU thread
//! // On KVM_EXIT_IO, before the device model runs:
//! let exit = vcpu.begin_exit(Exit::pio(0x3f8, 1, Dir::Write, u64::from(b'A')));
//! // ... the device model handles the write ...
//! drop(exit); // the exit ends here (or at the end of the scope)
//! rec.write_dump("vm.esdump")?;
//! # Ok::<(), exitscope::Error>(())
//! ```
//!
//! Threading, as docs/capi.md allows: a [`Recorder`] is `Send + Sync` and cheap to clone (one
//! shared handle); every call on it is thread-safe. The hot path (begin/end of an exit) may be
//! used by one thread per vCPU index at a time; [`Recorder::vcpu`] hands out one [`Vcpu`] per
//! index, and [`Vcpu::begin_exit`] takes `&mut self`, so the compiler enforces that rule.
//! The hot path does not allocate and makes one call into the library per begin and end.
//!
//! Guide: docs/rust.md.

use std::borrow::Cow;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use exitscope_sys as sys;

// ---- Errors ---------------------------------------------------------------------------------

/// What failed, one variant per `ES_*` status of the C API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// `ES_EINVAL`: bad argument or bad input.
    InvalidArgument,
    /// `ES_EEXIST`: e.g. an overlapping range, a duplicate device name, a vCPU already taken.
    AlreadyExists,
    /// `ES_ENOENT`: e.g. a map file or dump that does not exist, an unknown builtin map.
    NotFound,
    /// `ES_ECORRUPT`: a malformed or truncated file.
    Corrupt,
    /// `ES_EUNSUPPORTED`: e.g. a dump from a newer exitscope.
    Unsupported,
    /// `ES_EIO`: a read or write failed.
    Io,
    /// `ES_EUNAVAILABLE`: a facility is missing.
    Unavailable,
    /// `ES_EPERM`.
    Permission,
    /// `ES_EINTERNAL`.
    Internal,
    /// `ES_ENOMEM`.
    OutOfMemory,
    /// A status this binding does not know (a newer library).
    Other(i32),
}

impl ErrorCode {
    /// The code of a failed status; `None` for `ES_OK`.
    pub fn from_status(status: sys::es_status) -> Option<ErrorCode> {
        Some(match status {
            sys::ES_OK => return None,
            sys::ES_EINVAL => ErrorCode::InvalidArgument,
            sys::ES_EEXIST => ErrorCode::AlreadyExists,
            sys::ES_ENOENT => ErrorCode::NotFound,
            sys::ES_ECORRUPT => ErrorCode::Corrupt,
            sys::ES_EUNSUPPORTED => ErrorCode::Unsupported,
            sys::ES_EIO => ErrorCode::Io,
            sys::ES_EUNAVAILABLE => ErrorCode::Unavailable,
            sys::ES_EPERM => ErrorCode::Permission,
            sys::ES_EINTERNAL => ErrorCode::Internal,
            sys::ES_ENOMEM => ErrorCode::OutOfMemory,
            other => ErrorCode::Other(other),
        })
    }

    /// The C status value (`ES_EINVAL` is -1, ...).
    pub fn status(self) -> sys::es_status {
        match self {
            ErrorCode::InvalidArgument => sys::ES_EINVAL,
            ErrorCode::AlreadyExists => sys::ES_EEXIST,
            ErrorCode::NotFound => sys::ES_ENOENT,
            ErrorCode::Corrupt => sys::ES_ECORRUPT,
            ErrorCode::Unsupported => sys::ES_EUNSUPPORTED,
            ErrorCode::Io => sys::ES_EIO,
            ErrorCode::Unavailable => sys::ES_EUNAVAILABLE,
            ErrorCode::Permission => sys::ES_EPERM,
            ErrorCode::Internal => sys::ES_EINTERNAL,
            ErrorCode::OutOfMemory => sys::ES_ENOMEM,
            ErrorCode::Other(s) => s,
        }
    }

    /// The library's name of the status ("already exists", "not found", ...).
    pub fn name(self) -> &'static str {
        // es_status_name returns static strings for every value.
        unsafe { CStr::from_ptr(sys::es_status_name(self.status())) }
            .to_str()
            .unwrap_or("unknown status")
    }
}

/// A failed call: the status and the library's one-line message (es_last_error), e.g.
/// `mmio range [0xfebf2000, 0xfebf5fff] of nvme1 overlaps [0xfebf0000, 0xfebf3fff] of nvme0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

impl Error {
    fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    /// The error of a failed C call, with this thread's es_last_error() message.
    fn last(code: ErrorCode) -> Error {
        let msg = unsafe { CStr::from_ptr(sys::es_last_error()) };
        Error::new(code, msg.to_string_lossy())
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.code.name())
        } else {
            f.write_str(&self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(status: sys::es_status) -> Result<()> {
    match ErrorCode::from_status(status) {
        None => Ok(()),
        Some(code) => Err(Error::last(code)),
    }
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| {
        Error::new(
            ErrorCode::InvalidArgument,
            format!("{what} '{}' contains a NUL byte", s.escape_debug()),
        )
    })
}

fn c_path(p: &Path, what: &str) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        Error::new(
            ErrorCode::InvalidArgument,
            format!("{what} {} contains a NUL byte", p.display()),
        )
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---- Plain types ----------------------------------------------------------------------------

/// The kind of a VM exit; values equal `es_exit_kind` (and the C++ `ExitKind` in dumps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ExitKind {
    Unknown = sys::ES_EXIT_UNKNOWN,
    Mmio = sys::ES_EXIT_MMIO,
    Pio = sys::ES_EXIT_PIO,
    Hlt = sys::ES_EXIT_HLT,
    Shutdown = sys::ES_EXIT_SHUTDOWN,
    Intr = sys::ES_EXIT_INTR,
    Hypercall = sys::ES_EXIT_HYPERCALL,
    Msr = sys::ES_EXIT_MSR,
    Debug = sys::ES_EXIT_DEBUG,
    SystemEvent = sys::ES_EXIT_SYSTEM_EVENT,
    InternalError = sys::ES_EXIT_INTERNAL_ERROR,
    FailEntry = sys::ES_EXIT_FAIL_ENTRY,
    Other = sys::ES_EXIT_OTHER,
}

impl ExitKind {
    fn from_raw(raw: sys::es_exit_kind) -> ExitKind {
        use ExitKind::*;
        [
            Unknown,
            Mmio,
            Pio,
            Hlt,
            Shutdown,
            Intr,
            Hypercall,
            Msr,
            Debug,
            SystemEvent,
            InternalError,
            FailEntry,
            Other,
        ]
        .get(usize::try_from(raw).unwrap_or(0))
        .copied()
        .unwrap_or(Unknown)
    }
}

/// Direction of an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Dir {
    None = sys::ES_DIR_NONE,
    Read = sys::ES_DIR_READ,
    Write = sys::ES_DIR_WRITE,
}

impl Dir {
    fn from_raw(raw: sys::es_dir) -> Dir {
        match raw {
            sys::ES_DIR_READ => Dir::Read,
            sys::ES_DIR_WRITE => Dir::Write,
            _ => Dir::None,
        }
    }
}

/// The address space a range lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Space {
    Mmio = sys::ES_SPACE_MMIO,
    Pio = sys::ES_SPACE_PIO,
}

/// A device of the address space, as returned by [`Recorder::add_device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(u32);

impl DeviceId {
    /// The library's device index (what `es_*` calls take).
    pub fn index(self) -> u32 {
        self.0
    }
}

/// How the registers of a range are named.
#[derive(Clone, Copy, Debug)]
pub enum RegisterMap<'a> {
    /// No register map: accesses resolve to `device+0xOFFSET`.
    None,
    /// A map compiled into the library: "nvme", "uart16550", "pci-config", "virtio-mmio",
    /// "virtio-pci-common" (data/regmaps/).
    Builtin(&'a str),
    /// A map file (format in docs/recorder.md, "Register map files"), read once, now.
    File(&'a Path),
}

/// Recorder options; `Options::default()` is the library's defaults (es_options_init).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub num_vcpus: u32,
    /// Ring capacity per vCPU (records); the oldest are overwritten, and counted, when full.
    pub events_per_vcpu: u64,
    /// Device-event ring capacity.
    pub device_events: u64,
    /// An exit at least this long is a slow exit (hook, log line, dump).
    pub slow_exit: Duration,
    /// Watchdog: a vCPU inside one exit this long is reported while still inside.
    pub stuck_exit: Duration,
    /// Watchdog: an I/O in flight this long is reported.
    pub io_age: Duration,
    /// Start the watchdog thread at creation.
    pub start_watchdog: bool,
    /// Log one line per slow exit and finding (stderr); the hook and the dump get them anyway.
    pub log_slow_exits: bool,
}

impl Default for Options {
    fn default() -> Options {
        let mut o = sys::es_options::default();
        unsafe { sys::es_options_init(&mut o) };
        Options {
            num_vcpus: o.num_vcpus,
            events_per_vcpu: o.events_per_vcpu,
            device_events: o.device_events,
            slow_exit: Duration::from_nanos(o.slow_exit_ns),
            stuck_exit: Duration::from_nanos(o.stuck_exit_ns),
            io_age: Duration::from_nanos(o.io_age_ns),
            start_watchdog: o.start_watchdog != 0,
            log_slow_exits: o.log_slow_exits != 0,
        }
    }
}

/// Loss and misuse counters of a recorder (es_counters).
pub type Counters = sys::es_counters;

/// What a finding reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FindingType {
    /// A vCPU has been inside one exit past the watchdog threshold (and still is).
    StuckExit,
    /// That exit ended; the duration is its total.
    StuckExitEnd,
    /// An I/O has been in flight past the watchdog's I/O age.
    AgedIo,
    /// An exit ended after at least the slow-exit threshold.
    SlowExit,
    /// A later stack capture of a vCPU still stuck (at 4x, 16x the watchdog threshold).
    StuckExitStack,
}

/// One frame of a captured stack (docs/stacks.md). Borrowed: valid during the hook call only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The instruction (first user frame) or the return address.
    pub ip: u64,
    /// `ip` - the function's start; 0 when unresolved.
    pub offset: u64,
    /// Demangled (`exitscope::vmm::BlockDevice::Write`, `anon_pipe_read`); "" when unresolved.
    pub function: Cow<'a, str>,
    /// `/usr/lib/x86_64-linux-gnu/libc.so.6`, `[kernel]`.
    pub module: Cow<'a, str>,
    /// The source file where DWARF says, else "".
    pub file: Cow<'a, str>,
    /// 0 when unknown.
    pub line: u32,
}

/// What a stuck vCPU thread was doing when the watchdog captured it. Frames innermost first
/// (a thread in a system call: the kernel frames are the innermost).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack<'a> {
    /// The thread captured.
    pub tid: i32,
    /// Its `/proc` state letter ('R', 'S', 'D', ...), `None` when unknown.
    pub state: Option<char>,
    /// 1, 2, 3...: which capture of this stall (1 = when found stuck).
    pub capture: u32,
    /// User frames beyond the capture's limit, not kept.
    pub user_dropped: u32,
    pub user: Vec<Frame<'a>>,
    /// Empty where `/proc/self/task/TID/stack` is not readable (the note says so).
    pub kernel: Vec<Frame<'a>>,
    /// Why something is missing, one line; "" when nothing is.
    pub note: Cow<'a, str>,
}

/// A slow exit or a watchdog finding, as passed to the hook set by
/// [`Recorder::set_finding_hook`]. Borrowed: valid during the hook call only.
#[derive(Clone, Debug)]
pub struct Finding<'a> {
    pub kind: FindingType,
    pub vcpu: u32,
    pub exit_kind: ExitKind,
    pub dir: Dir,
    pub size: u8,
    pub addr: u64,
    pub duration: Duration,
    pub io_id: u64,
    /// "" when unassigned.
    pub device: Cow<'a, str>,
    /// "" when none.
    pub register: Cow<'a, str>,
    /// The log line, e.g. `vCPU 1: stuck in exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)
    /// for 24.21 ms (still inside)`.
    pub line: Cow<'a, str>,
    /// The stuck vCPU thread's capture ([`FindingType::StuckExit`],
    /// [`FindingType::StuckExitStack`]); `None` when none was made.
    pub stack: Option<Stack<'a>>,
}

impl Finding<'_> {
    /// The captured user frames, innermost first; empty without a capture.
    pub fn user_frames(&self) -> &[Frame<'_>] {
        self.stack.as_ref().map_or(&[], |s| &s.user)
    }
    /// The captured kernel frames, innermost first; empty without a capture.
    pub fn kernel_frames(&self) -> &[Frame<'_>] {
        self.stack.as_ref().map_or(&[], |s| &s.kernel)
    }
}

type FindingHook = dyn Fn(&Finding<'_>) + Send + Sync + 'static;

// ---- The recorder ---------------------------------------------------------------------------

struct Inner {
    raw: NonNull<sys::es_recorder>,
    // One flag per vCPU index: set while a Vcpu handle for it exists.
    claimed: Box<[AtomicBool]>,
    // The hook the C trampoline calls. The library copies its hook under a mutex and calls the
    // copy outside it, so a replaced hook may still be running: the trampoline is installed once
    // and clones the Arc out of this slot, and a replaced closure lives until its last call ends.
    hook: RwLock<Option<Arc<FindingHook>>>,
    hook_installed: AtomicBool,
}

// SAFETY: docs/capi.md: every es_* call is thread-safe except the hot path (begin/end of an
// exit), which one thread per vCPU index may call at a time; only `Vcpu` (one per index, its
// methods take &mut self) makes those calls.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stops the watchdog and dump-signal threads (no hook call after this), then frees.
        unsafe { sys::es_recorder_destroy(self.raw.as_ptr()) };
    }
}

/// One VM's flight recorder. Clones share the same recorder; it is destroyed (watchdog and
/// dump-signal threads stopped) when the last clone and the last [`Vcpu`] are gone.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder").field("num_vcpus", &self.num_vcpus()).finish_non_exhaustive()
    }
}

impl Recorder {
    /// Creates a recorder; all of its memory is allocated here (rings sized by `options`).
    pub fn new(options: &Options) -> Result<Recorder> {
        let o = sys::es_options {
            struct_size: std::mem::size_of::<sys::es_options>() as u32,
            num_vcpus: options.num_vcpus,
            events_per_vcpu: options.events_per_vcpu,
            device_events: options.device_events,
            slow_exit_ns: nanos(options.slow_exit),
            stuck_exit_ns: nanos(options.stuck_exit),
            io_age_ns: nanos(options.io_age),
            start_watchdog: c_int::from(options.start_watchdog),
            log_slow_exits: c_int::from(options.log_slow_exits),
        };
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::es_recorder_create(&o, &mut raw) })?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(ErrorCode::Internal, "es_recorder_create returned NULL"))?;
        let claimed = (0..options.num_vcpus).map(|_| AtomicBool::new(false)).collect();
        Ok(Recorder {
            inner: Arc::new(Inner {
                raw,
                claimed,
                hook: RwLock::new(None),
                hook_installed: AtomicBool::new(false),
            }),
        })
    }

    fn raw(&self) -> *mut sys::es_recorder {
        self.inner.raw.as_ptr()
    }

    pub fn num_vcpus(&self) -> u32 {
        self.inner.claimed.len() as u32
    }

    /// The hot-path handle of vCPU `index`, for its thread. One handle per index exists at a
    /// time: a second call fails with [`ErrorCode::AlreadyExists`] until the first is dropped.
    pub fn vcpu(&self, index: u32) -> Result<Vcpu> {
        let flag = self.inner.claimed.get(index as usize).ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidArgument,
                format!("vCPU {index} out of range (the recorder has {} vCPUs)", self.num_vcpus()),
            )
        })?;
        if flag.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return Err(Error::new(
                ErrorCode::AlreadyExists,
                format!("vCPU {index} already has a Vcpu handle"),
            ));
        }
        Ok(Vcpu { inner: Arc::clone(&self.inner), index })
    }

    // ---- Address space ----

    /// Adds a device (`name` as reports show it, `kind` free-form, e.g. "nvme").
    pub fn add_device(&self, name: &str, kind: &str) -> Result<DeviceId> {
        let name = c_string(name, "device name")?;
        let kind = c_string(kind, "device kind")?;
        let mut index = sys::ES_UNASSIGNED;
        check(unsafe { sys::es_add_device(self.raw(), name.as_ptr(), kind.as_ptr(), &mut index) })?;
        Ok(DeviceId(index))
    }

    /// Maps `[base, base + size)` of `space` to `device`, its registers named by `map`.
    /// Overlapping an existing range is [`ErrorCode::AlreadyExists`]. May be called while
    /// vCPUs run (a BAR moved by the guest: [`Recorder::remove_range`], then add it again).
    pub fn add_range(
        &self,
        space: Space,
        base: u64,
        size: u64,
        device: DeviceId,
        map: RegisterMap<'_>,
    ) -> Result<()> {
        let status = match map {
            RegisterMap::None => unsafe {
                sys::es_add_range_builtin(
                    self.raw(),
                    space as c_int,
                    base,
                    size,
                    device.0,
                    std::ptr::null(),
                )
            },
            RegisterMap::Builtin(name) => {
                let name = c_string(name, "register map name")?;
                unsafe {
                    sys::es_add_range_builtin(
                        self.raw(),
                        space as c_int,
                        base,
                        size,
                        device.0,
                        name.as_ptr(),
                    )
                }
            }
            RegisterMap::File(path) => {
                let path = c_path(path, "register map file")?;
                unsafe {
                    sys::es_add_range_file(
                        self.raw(),
                        space as c_int,
                        base,
                        size,
                        device.0,
                        path.as_ptr(),
                    )
                }
            }
        };
        check(status)
    }

    /// Removes the range of `space` that starts at `base`.
    pub fn remove_range(&self, space: Space, base: u64) -> Result<()> {
        check(unsafe { sys::es_remove_range(self.raw(), space as c_int, base) })
    }

    /// Names an access as reports will: `nvme0.SQ1TDBL`, `nvme0.CC+2`, `nvme0+0x2000` or
    /// `unassigned`.
    pub fn resolve(&self, space: Space, addr: u64, size: u32, dir: Dir) -> Result<String> {
        let mut buf = vec![0u8; 256];
        loop {
            let status = unsafe {
                sys::es_resolve(
                    self.raw(),
                    space as c_int,
                    addr,
                    size,
                    dir as c_int,
                    buf.as_mut_ptr().cast::<c_char>(),
                    buf.len(),
                )
            };
            let name = CStr::from_bytes_until_nul(&buf)
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            // A name longer than the buffer is refused with EINVAL: grow and retry.
            if status == sys::ES_EINVAL && name.len() + 1 == buf.len() && buf.len() < 1 << 20 {
                buf.resize(buf.len() * 4, 0);
                continue;
            }
            check(status)?;
            return Ok(name);
        }
    }

    // ---- Device events (any thread, lock-free) ----

    /// An I/O `io_id` was submitted to `device`'s backend (the watchdog ages it until completed).
    pub fn io_submit(&self, device: DeviceId, io_id: u64) {
        unsafe { sys::es_io_submit(self.raw(), device.0, io_id) }
    }

    /// I/O `io_id` completed with `status` (0 or a negative errno, as the backend returns).
    pub fn io_complete(&self, device: DeviceId, io_id: u64, status: i64) {
        unsafe { sys::es_io_complete(self.raw(), device.0, io_id, status) }
    }

    /// `device`'s queue `queue` was full (a request had to wait).
    pub fn queue_full(&self, device: DeviceId, queue: u64) {
        unsafe { sys::es_queue_full(self.raw(), device.0, queue) }
    }

    /// The backend of `device` failed with `error` (e.g. -EIO); `note` says what it was doing.
    /// Allocates for `note` (not for the vCPU hot path).
    pub fn backend_error(&self, device: DeviceId, error: i64, note: &str) -> Result<()> {
        let note = c_string(note, "backend error note")?;
        unsafe { sys::es_backend_error(self.raw(), device.0, error, note.as_ptr()) };
        Ok(())
    }

    /// A free-form note about `device` (a reset, a reconfiguration); allocates for `text`.
    pub fn note(&self, device: DeviceId, text: &str) -> Result<()> {
        let text = c_string(text, "note")?;
        unsafe { sys::es_note(self.raw(), device.0, text.as_ptr()) };
        Ok(())
    }

    // ---- Policy and watchdog ----

    /// Changes the slow-exit threshold (zero is [`ErrorCode::InvalidArgument`]).
    pub fn set_slow_exit_threshold(&self, threshold: Duration) -> Result<()> {
        check(unsafe { sys::es_set_slow_exit_ns(self.raw(), nanos(threshold)) })
    }

    /// Calls `hook` for every slow exit (on the vCPU thread, after the exit ended) and every
    /// watchdog finding (on the watchdog thread). Replaces the previous hook; a call of the
    /// previous one already under way may still finish after this returns. A panic inside the
    /// hook is caught and printed (it cannot unwind into the library).
    pub fn set_finding_hook<F>(&self, hook: F) -> Result<()>
    where
        F: Fn(&Finding<'_>) + Send + Sync + 'static,
    {
        *self.inner.hook.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
        if !self.inner.hook_installed.swap(true, Ordering::AcqRel) {
            // The slot lives in Inner, which outlives the C recorder (destroyed in Inner::drop).
            let user = &self.inner.hook as *const RwLock<Option<Arc<FindingHook>>> as *mut c_void;
            if let Err(e) = check(unsafe {
                sys::es_set_finding_hook(self.raw(), Some(finding_trampoline), user)
            }) {
                self.inner.hook_installed.store(false, Ordering::Release);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes the finding hook.
    pub fn clear_finding_hook(&self) {
        *self.inner.hook.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// (Re)starts the watchdog with these thresholds (a zero one keeps the library default).
    pub fn start_watchdog(&self, stuck_exit: Duration, io_age: Duration) -> Result<()> {
        check(unsafe { sys::es_watchdog_start(self.raw(), nanos(stuck_exit), nanos(io_age)) })
    }

    /// The thread id (`gettid()`) of vCPU `vcpu`, for the watchdog's stack captures; without
    /// it the recorder takes the id of the thread that makes the vCPU's first exit.
    /// [`ErrorCode::InvalidArgument`] for a bad vCPU or a tid <= 0.
    pub fn set_thread_id(&self, vcpu: u32, tid: i32) -> Result<()> {
        check(unsafe { sys::es_set_thread_id(self.raw(), vcpu, tid) })
    }

    /// Installs the handler of real-time signal `signo` (SIGRTMIN..SIGRTMAX) that the watchdog
    /// sends a stuck vCPU thread, which then unwinds its own user stack into the finding
    /// ([`Finding::stack`]). One recorder per process owns it ([`ErrorCode::AlreadyExists`]
    /// otherwise). `nanosleep` and `KVM_RUN` return EINTR when it arrives: retry them.
    pub fn install_stack_signal(&self, signo: i32) -> Result<()> {
        check(unsafe { sys::es_install_stack_signal(self.raw(), signo) })
    }

    /// Stops the watchdog (a stuck exit it reported still gets its end finding).
    pub fn stop_watchdog(&self) {
        unsafe { sys::es_watchdog_stop(self.raw()) }
    }

    // ---- Metadata carried in dumps ----

    /// A key/value shown in the dump's header (`attributes` in `inspect --format json`).
    pub fn set_attribute(&self, key: &str, value: &str) -> Result<()> {
        let key = c_string(key, "attribute key")?;
        let value = c_string(value, "attribute value")?;
        check(unsafe { sys::es_set_attribute(self.raw(), key.as_ptr(), value.as_ptr()) })
    }

    /// A per-vCPU counter carried in dumps (e.g. `kvm.exits` from KVM's binary stats).
    pub fn set_vcpu_counter(&self, vcpu: u32, name: &str, value: u64) -> Result<()> {
        let name = c_string(name, "counter name")?;
        check(unsafe { sys::es_set_vcpu_counter(self.raw(), vcpu, name.as_ptr(), value) })
    }

    // ---- Dumps ----

    /// Writes a dump of everything recorded so far to `path`, without guest data (dumps travel
    /// in support bundles). vCPUs keep running. Only a regular file is replaced.
    pub fn write_dump(&self, path: impl AsRef<Path>) -> Result<()> {
        self.write_dump_impl(path.as_ref(), false)
    }

    /// Same, with the bytes guests wrote and read.
    pub fn write_dump_with_guest_data(&self, path: impl AsRef<Path>) -> Result<()> {
        self.write_dump_impl(path.as_ref(), true)
    }

    fn write_dump_impl(&self, path: &Path, guest_data: bool) -> Result<()> {
        let p = c_path(path, "dump file")?;
        check(unsafe { sys::es_write_dump(self.raw(), p.as_ptr(), c_int::from(guest_data)) })
    }

    /// On signal `signo` (e.g. `SIGUSR1` = 10), a background thread writes a dump into
    /// `directory`. Fault signals, SIGKILL and SIGSTOP are refused.
    pub fn install_dump_signal(&self, signo: i32, directory: impl AsRef<Path>) -> Result<()> {
        let d = c_path(directory.as_ref(), "dump directory")?;
        check(unsafe { sys::es_install_dump_signal(self.raw(), signo, d.as_ptr()) })
    }

    /// Exits written, overwritten and skipped, device events, slow exits, API misuse.
    pub fn counters(&self) -> Result<Counters> {
        let mut c = Counters::default();
        check(unsafe { sys::es_get_counters(self.raw(), &mut c) })?;
        Ok(c)
    }
}

impl Recorder {
    /// Serves the recorder's exits as Prometheus metrics (GET /metrics; names in
    /// docs/prometheus.md) from a collector thread; the hot path is unchanged. `listen` is
    /// "ADDR:PORT" or ":PORT" (127.0.0.1), `None` for "127.0.0.1:9464"; port 0 picks a free one.
    /// The endpoint holds a clone of the recorder, so it always stops before the recorder is
    /// destroyed (the C API's rule); dropping it stops it (up to ~2 s).
    pub fn serve_metrics(&self, listen: Option<&str>) -> Result<MetricsEndpoint> {
        let listen = listen.map(|l| c_string(l, "metrics listen address")).transpose()?;
        let mut raw = std::ptr::null_mut();
        let p = listen.as_ref().map_or(std::ptr::null(), |l| l.as_ptr());
        check(unsafe { sys::es_serve_metrics(self.raw(), p, &mut raw) })?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(ErrorCode::Internal, "es_serve_metrics returned NULL"))?;
        Ok(MetricsEndpoint { raw, _recorder: self.clone() })
    }
}

/// A running Prometheus endpoint (see [`Recorder::serve_metrics`]); stopped on drop.
pub struct MetricsEndpoint {
    raw: NonNull<sys::es_metrics>,
    _recorder: Recorder,
}

// SAFETY: a handle to the exporter's own threads; stopping it from another thread is what
// es_metrics_stop is for. Not Sync: the C API says nothing of concurrent calls on one handle.
unsafe impl Send for MetricsEndpoint {}

impl fmt::Debug for MetricsEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsEndpoint").field("port", &self.port()).finish()
    }
}

impl MetricsEndpoint {
    /// The port it listens on (the one picked when asked for port 0).
    pub fn port(&self) -> u16 {
        unsafe { sys::es_metrics_port(self.raw.as_ptr()) }
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        unsafe { sys::es_metrics_stop(self.raw.as_ptr()) }
    }
}

/// Validates a dump file: Ok, or [`ErrorCode::Corrupt`] / [`ErrorCode::Unsupported`] /
/// [`ErrorCode::NotFound`] / [`ErrorCode::Io`] with the reader's message.
pub fn check_dump(path: impl AsRef<Path>) -> Result<()> {
    let p = c_path(path.as_ref(), "dump file")?;
    check(unsafe { sys::es_check_dump(p.as_ptr()) })
}

unsafe extern "C" fn finding_trampoline(f: *const sys::es_finding, user: *mut c_void) {
    let result = std::panic::catch_unwind(|| {
        // SAFETY: `user` is &Inner::hook (see set_finding_hook); `f` and its strings are valid
        // for this call.
        let slot = unsafe { &*(user as *const RwLock<Option<Arc<FindingHook>>>) };
        let hook = match slot.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(h) => Arc::clone(h),
            None => return,
        };
        let f = unsafe { &*f };
        let text = |p: *const c_char| {
            if p.is_null() {
                Cow::Borrowed("")
            } else {
                unsafe { CStr::from_ptr(p) }.to_string_lossy()
            }
        };
        let finding = Finding {
            kind: match f.type_ {
                sys::ES_STUCK_EXIT => FindingType::StuckExit,
                sys::ES_STUCK_EXIT_END => FindingType::StuckExitEnd,
                sys::ES_AGED_IO => FindingType::AgedIo,
                sys::ES_STUCK_EXIT_STACK => FindingType::StuckExitStack,
                _ => FindingType::SlowExit,
            },
            vcpu: f.vcpu,
            exit_kind: ExitKind::from_raw(f.kind),
            dir: Dir::from_raw(f.dir),
            size: f.size,
            addr: f.addr,
            duration: Duration::from_nanos(f.duration_ns),
            io_id: f.io_id,
            device: text(f.device),
            register: text(f.reg),
            line: text(f.line),
            // SAFETY: `f` is this hook call's finding; the stack and its frames are valid for
            // the call.
            stack: unsafe { sys::es_finding_stack(f).as_ref() }.map(|s| {
                let frames = |p: *const sys::es_frame, n: u32| {
                    let raw: &[sys::es_frame] = if p.is_null() {
                        &[]
                    } else {
                        unsafe { std::slice::from_raw_parts(p, n as usize) }
                    };
                    raw.iter()
                        .map(|fr| Frame {
                            ip: fr.ip,
                            offset: fr.offset,
                            function: text(fr.function),
                            module: text(fr.module),
                            file: text(fr.file),
                            line: fr.line,
                        })
                        .collect::<Vec<_>>()
                };
                Stack {
                    tid: s.tid,
                    state: (s.state != 0).then(|| char::from(s.state as u8)),
                    capture: s.capture,
                    user_dropped: s.user_dropped,
                    user: frames(s.user, s.n_user),
                    kernel: frames(s.kernel, s.n_kernel),
                    note: text(s.note),
                }
            }),
        };
        hook(&finding);
    });
    if result.is_err() {
        eprintln!("exitscope: the finding hook panicked (the panic was caught)");
    }
}

// ---- The vCPU hot path ----------------------------------------------------------------------

/// One exit as the VMM saw it, for [`Vcpu::begin_exit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    pub kind: ExitKind,
    /// Port, guest-physical address, MSR or hypercall number; 0 when none.
    pub addr: u64,
    /// Access size in bytes (0 when none).
    pub size: u8,
    pub dir: Dir,
    /// The guest's data for writes (little-endian, as KVM gives it); 0 otherwise.
    pub value: u64,
}

impl Exit {
    /// KVM_EXIT_IO: `port`, `size` bytes, the written `value` (0 for reads).
    pub fn pio(port: u16, size: u8, dir: Dir, value: u64) -> Exit {
        Exit { kind: ExitKind::Pio, addr: u64::from(port), size, dir, value }
    }

    /// KVM_EXIT_MMIO: `addr` (guest-physical), `size` bytes, the written `value`.
    pub fn mmio(addr: u64, size: u8, dir: Dir, value: u64) -> Exit {
        Exit { kind: ExitKind::Mmio, addr, size, dir, value }
    }

    /// An exit with no address (HLT, SHUTDOWN, INTR, ...).
    pub fn of_kind(kind: ExitKind) -> Exit {
        Exit { kind, addr: 0, size: 0, dir: Dir::None, value: 0 }
    }

    /// Reads the little-endian value of the first `len` bytes of `data` (at most 8), as KVM
    /// lays out `kvm_run.mmio.data` and the PIO data page.
    pub fn le_value(data: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        let n = data.len().min(8);
        b[..n].copy_from_slice(&data[..n]);
        u64::from_le_bytes(b)
    }
}

/// The hot-path handle of one vCPU (see [`Recorder::vcpu`]); move it into the vCPU thread.
/// Keeps the recorder alive. Dropping it frees the index for a new handle.
pub struct Vcpu {
    inner: Arc<Inner>,
    index: u32,
}

impl fmt::Debug for Vcpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vcpu").field("index", &self.index).finish()
    }
}

impl Vcpu {
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Begins timing `exit`; it ends when the returned guard is dropped. Put it right after
    /// `KVM_RUN` returns and before the device model runs, so the VMM's whole handling time
    /// (including a backend it waits on) is inside. Lock-free and allocation-free.
    #[inline]
    pub fn begin_exit(&mut self, exit: Exit) -> ExitGuard<'_> {
        // Only a kind outside the enum is refused; ExitKind cannot hold one.
        let _ = unsafe {
            sys::es_begin_exit(
                self.inner.raw.as_ptr(),
                self.index,
                exit.kind as c_int,
                exit.addr,
                exit.size,
                exit.dir as c_int,
                exit.value,
            )
        };
        ExitGuard { vcpu: self, value: None }
    }

    /// Runs `handler` as one exit: begin, call, end (with the value `handler` set, if any).
    #[inline]
    pub fn record<R>(&mut self, exit: Exit, handler: impl FnOnce(&mut ExitGuard<'_>) -> R) -> R {
        let mut guard = self.begin_exit(exit);
        handler(&mut guard)
    }
}

impl Drop for Vcpu {
    fn drop(&mut self) {
        self.inner.claimed[self.index as usize].store(false, Ordering::Release);
    }
}

/// An exit in progress on one vCPU. Dropping it ends the exit (`es_end_exit`, or
/// `es_end_exit_value` once [`ExitGuard::set_value`] was called), on every path out of the
/// handler: `?`, early `return`, `break`, a panic.
#[must_use = "the exit ends when the guard is dropped: bind it (`let _exit = ...`), not `let _ = ...`"]
pub struct ExitGuard<'v> {
    vcpu: &'v mut Vcpu,
    value: Option<u64>,
}

impl ExitGuard<'_> {
    /// Records `value` as the data returned to the guest (a read's result).
    #[inline]
    pub fn set_value(&mut self, value: u64) {
        self.value = Some(value);
    }

    /// Ends the exit now (same as dropping the guard).
    #[inline]
    pub fn end(self) {}
}

impl Drop for ExitGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        let raw = self.vcpu.inner.raw.as_ptr();
        match self.value {
            Some(v) => unsafe { sys::es_end_exit_value(raw, self.vcpu.index, v) },
            None => unsafe { sys::es_end_exit(raw, self.vcpu.index) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn recorder_is_send_and_sync_vcpu_is_send() {
        assert_send_sync::<Recorder>();
        assert_send::<Vcpu>();
        assert_send_sync::<Error>();
    }

    #[test]
    fn error_codes_round_trip_every_status() {
        for s in -10..=-1 {
            let code = ErrorCode::from_status(s).unwrap();
            assert!(!matches!(code, ErrorCode::Other(_)), "status {s}");
            assert_eq!(code.status(), s);
        }
        assert_eq!(ErrorCode::from_status(sys::ES_OK), None);
        assert_eq!(ErrorCode::from_status(-99), Some(ErrorCode::Other(-99)));
        assert_eq!(ErrorCode::NotFound.name(), "not found");
        assert_eq!(ErrorCode::Other(-99).name(), "unknown status");
    }

    #[test]
    fn default_options_are_the_library_defaults() {
        let o = Options::default();
        assert_eq!(o.num_vcpus, 1);
        assert_eq!(o.slow_exit, Duration::from_millis(20));
        assert_eq!(o.io_age, Duration::from_secs(20));
        assert!(o.start_watchdog);
    }

    #[test]
    fn exit_kind_values_match_the_c_enum() {
        assert_eq!(ExitKind::Other as i32, sys::ES_EXIT_OTHER);
        for k in 0..=12 {
            assert_eq!(ExitKind::from_raw(k) as i32, k);
        }
        assert_eq!(ExitKind::from_raw(99), ExitKind::Unknown);
        assert_eq!(Exit::le_value(&[0x08, 0x10]), 0x1008);
        assert_eq!(Exit::le_value(&[1, 0, 0, 0, 0, 0, 0, 0, 9]), 1);
    }
}
