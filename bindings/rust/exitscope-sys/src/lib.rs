//! Raw declarations of libexitscope's C API, written by hand from
//! `include/exitscope/exitscope.h` (no bindgen): the same names, types and values.
//!
//! C enums are `c_int` type aliases with constants, not Rust enums: the library may hand back
//! any value of the C type, and a Rust enum must never hold a value it does not list.
//! Everything here is `unsafe` to call; the `exitscope` crate is the safe layer. Threading
//! (docs/capi.md): `es_begin_exit` / `es_end_exit` / `es_end_exit_value` for one vCPU index
//! from one thread at a time; every other call from any thread.
//!
//! Keep this file in step with the header: the tests below check the struct layouts against
//! what the library writes and the status names it returns.
#![allow(non_camel_case_types)]
#![no_std]

use core::ffi::{c_char, c_int, c_void};

/// Opaque recorder handle (`es_recorder*`).
#[repr(C)]
pub struct es_recorder {
    _private: [u8; 0],
    // Not Send, not Sync, not Unpin: a handle, owned and shared by the safe layer.
    _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

/// Opaque Prometheus endpoint handle (`es_metrics*`).
#[repr(C)]
pub struct es_metrics {
    _private: [u8; 0],
    _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

pub type es_status = c_int;
pub const ES_OK: es_status = 0;
pub const ES_EINVAL: es_status = -1;
pub const ES_EEXIST: es_status = -2;
pub const ES_ENOENT: es_status = -3;
pub const ES_ECORRUPT: es_status = -4;
pub const ES_EUNSUPPORTED: es_status = -5;
pub const ES_EIO: es_status = -6;
pub const ES_EUNAVAILABLE: es_status = -7;
pub const ES_EPERM: es_status = -8;
pub const ES_EINTERNAL: es_status = -9;
pub const ES_ENOMEM: es_status = -10;

pub type es_exit_kind = c_int;
pub const ES_EXIT_UNKNOWN: es_exit_kind = 0;
pub const ES_EXIT_MMIO: es_exit_kind = 1;
pub const ES_EXIT_PIO: es_exit_kind = 2;
pub const ES_EXIT_HLT: es_exit_kind = 3;
pub const ES_EXIT_SHUTDOWN: es_exit_kind = 4;
pub const ES_EXIT_INTR: es_exit_kind = 5;
pub const ES_EXIT_HYPERCALL: es_exit_kind = 6;
pub const ES_EXIT_MSR: es_exit_kind = 7;
pub const ES_EXIT_DEBUG: es_exit_kind = 8;
pub const ES_EXIT_SYSTEM_EVENT: es_exit_kind = 9;
pub const ES_EXIT_INTERNAL_ERROR: es_exit_kind = 10;
pub const ES_EXIT_FAIL_ENTRY: es_exit_kind = 11;
pub const ES_EXIT_OTHER: es_exit_kind = 12;

pub type es_dir = c_int;
pub const ES_DIR_NONE: es_dir = 0;
pub const ES_DIR_READ: es_dir = 1;
pub const ES_DIR_WRITE: es_dir = 2;

pub type es_space = c_int;
pub const ES_SPACE_MMIO: es_space = 0;
pub const ES_SPACE_PIO: es_space = 1;

pub const ES_UNASSIGNED: u32 = 0xffff_ffff;

/// Creation options; initialise with `es_options_init`. `struct_size` is the caller's
/// `size_of::<es_options>()`: the struct can grow at its end (docs/capi.md, "Compatibility").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct es_options {
    pub struct_size: u32,
    pub num_vcpus: u32,
    pub events_per_vcpu: u64,
    pub device_events: u64,
    pub slow_exit_ns: u64,
    pub stuck_exit_ns: u64,
    pub io_age_ns: u64,
    pub start_watchdog: c_int,
    pub log_slow_exits: c_int,
}

pub type es_event_type = c_int;
pub const ES_STUCK_EXIT: es_event_type = 0;
pub const ES_STUCK_EXIT_END: es_event_type = 1;
pub const ES_AGED_IO: es_event_type = 2;
pub const ES_SLOW_EXIT: es_event_type = 3;
pub const ES_STUCK_EXIT_STACK: es_event_type = 4;

/// A slow exit or watchdog finding, passed to the hook; strings valid during the call only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct es_finding {
    pub type_: es_event_type,
    pub vcpu: u32,
    pub kind: es_exit_kind,
    pub dir: es_dir,
    pub size: u8,
    pub addr: u64,
    pub duration_ns: u64,
    pub io_id: u64,
    pub device: *const c_char,
    pub reg: *const c_char,
    pub line: *const c_char,
}

pub type es_finding_hook =
    Option<unsafe extern "C" fn(finding: *const es_finding, user: *mut c_void)>;

/// One frame of a captured stack; strings never NULL ("" when unknown).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct es_frame {
    pub ip: u64,
    pub offset: u64,
    pub function: *const c_char,
    pub module: *const c_char,
    pub file: *const c_char,
    pub line: u32,
}

/// A stuck vCPU thread's capture (es_finding_stack), library memory valid during the hook call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct es_stack {
    pub tid: i32,
    pub state: c_char,
    pub capture: u32,
    pub user_dropped: u32,
    pub n_user: u32,
    pub user: *const es_frame,
    pub n_kernel: u32,
    pub kernel: *const es_frame,
    pub note: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct es_counters {
    pub exits_written: u64,
    pub exits_overwritten: u64,
    pub exits_skipped: u64,
    pub device_events_written: u64,
    pub device_events_overwritten: u64,
    pub slow_exits: u64,
    pub bad_vcpu: u64,
    pub end_without_begin: u64,
    pub begin_without_end: u64,
    pub io_in_flight: u64,
}

extern "C" {
    pub fn es_last_error() -> *const c_char;
    pub fn es_status_name(s: es_status) -> *const c_char;

    pub fn es_version() -> *const c_char;
    pub fn es_version_number() -> u32;

    pub fn es_options_init_sized(opts: *mut es_options, size: usize) -> es_status;
    pub fn es_recorder_create(opts: *const es_options, out: *mut *mut es_recorder) -> es_status;
    pub fn es_recorder_destroy(rec: *mut es_recorder);

    pub fn es_add_device(
        rec: *mut es_recorder,
        name: *const c_char,
        kind: *const c_char,
        out_index: *mut u32,
    ) -> es_status;
    pub fn es_add_range_builtin(
        rec: *mut es_recorder,
        space: es_space,
        base: u64,
        size: u64,
        device: u32,
        map_name: *const c_char,
    ) -> es_status;
    pub fn es_add_range_file(
        rec: *mut es_recorder,
        space: es_space,
        base: u64,
        size: u64,
        device: u32,
        map_path: *const c_char,
    ) -> es_status;
    pub fn es_remove_range(rec: *mut es_recorder, space: es_space, base: u64) -> es_status;
    pub fn es_resolve(
        rec: *const es_recorder,
        space: es_space,
        addr: u64,
        size: u32,
        dir: es_dir,
        buf: *mut c_char,
        buf_len: usize,
    ) -> es_status;

    pub fn es_begin_exit(
        rec: *mut es_recorder,
        vcpu: u32,
        kind: es_exit_kind,
        addr: u64,
        size: u8,
        dir: es_dir,
        value: u64,
    ) -> es_status;
    pub fn es_end_exit(rec: *mut es_recorder, vcpu: u32);
    pub fn es_end_exit_value(rec: *mut es_recorder, vcpu: u32, value: u64);

    pub fn es_io_submit(rec: *mut es_recorder, device: u32, io_id: u64);
    pub fn es_io_complete(rec: *mut es_recorder, device: u32, io_id: u64, status: i64);
    pub fn es_queue_full(rec: *mut es_recorder, device: u32, queue: u64);
    pub fn es_backend_error(rec: *mut es_recorder, device: u32, error: i64, note: *const c_char);
    pub fn es_note(rec: *mut es_recorder, device: u32, text: *const c_char);

    pub fn es_set_slow_exit_ns(rec: *mut es_recorder, threshold_ns: u64) -> es_status;
    pub fn es_set_finding_hook(
        rec: *mut es_recorder,
        hook: es_finding_hook,
        user: *mut c_void,
    ) -> es_status;
    pub fn es_finding_stack(finding: *const es_finding) -> *const es_stack;
    pub fn es_set_thread_id(rec: *mut es_recorder, vcpu: u32, tid: i32) -> es_status;
    pub fn es_install_stack_signal(rec: *mut es_recorder, signo: c_int) -> es_status;
    pub fn es_watchdog_start(
        rec: *mut es_recorder,
        stuck_exit_ns: u64,
        io_age_ns: u64,
    ) -> es_status;
    pub fn es_watchdog_stop(rec: *mut es_recorder);

    pub fn es_set_attribute(
        rec: *mut es_recorder,
        key: *const c_char,
        value: *const c_char,
    ) -> es_status;
    pub fn es_set_vcpu_counter(
        rec: *mut es_recorder,
        vcpu: u32,
        name: *const c_char,
        value: u64,
    ) -> es_status;

    pub fn es_write_dump(
        rec: *const es_recorder,
        path: *const c_char,
        include_guest_data: c_int,
    ) -> es_status;
    pub fn es_install_dump_signal(
        rec: *mut es_recorder,
        signo: c_int,
        directory: *const c_char,
    ) -> es_status;
    pub fn es_get_counters(rec: *const es_recorder, out: *mut es_counters) -> es_status;
    pub fn es_check_dump(path: *const c_char) -> es_status;

    pub fn es_serve_metrics(
        rec: *const es_recorder,
        listen: *const c_char,
        out: *mut *mut es_metrics,
    ) -> es_status;
    pub fn es_metrics_port(metrics: *const es_metrics) -> u16;
    pub fn es_metrics_stop(metrics: *mut es_metrics);
}

/// The header's `static inline es_options_init`: the defaults, and `struct_size` set to this
/// declaration's size.
///
/// # Safety
/// `opts` must point to a writable `es_options`.
pub unsafe fn es_options_init(opts: *mut es_options) {
    es_options_init_sized(opts, core::mem::size_of::<es_options>());
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::ffi::CStr;
    use core::mem::{offset_of, size_of};

    // The x86-64 / aarch64 Linux layouts of the header's structs (C enums are int there).
    #[test]
    fn struct_layouts_match_the_header() {
        assert_eq!(size_of::<es_options>(), 56);
        assert_eq!(offset_of!(es_options, num_vcpus), 4);
        assert_eq!(offset_of!(es_options, events_per_vcpu), 8);
        assert_eq!(offset_of!(es_options, start_watchdog), 48);
        assert_eq!(size_of::<es_finding>(), 72);
        assert_eq!(offset_of!(es_finding, size), 16);
        assert_eq!(offset_of!(es_finding, addr), 24);
        assert_eq!(offset_of!(es_finding, device), 48);
        assert_eq!(size_of::<es_counters>(), 80);
        assert_eq!(size_of::<es_frame>(), 48);
        assert_eq!(offset_of!(es_frame, function), 16);
        assert_eq!(offset_of!(es_frame, line), 40);
        assert_eq!(size_of::<es_stack>(), 56);
        assert_eq!(offset_of!(es_stack, state), 4);
        assert_eq!(offset_of!(es_stack, capture), 8);
        assert_eq!(offset_of!(es_stack, user), 24);
        assert_eq!(offset_of!(es_stack, kernel), 40);
        assert_eq!(offset_of!(es_stack, note), 48);
    }

    // es_options_init fills every field with the documented default: a field at the wrong
    // offset would read another field's value, and a struct too small would hit the canary.
    #[test]
    fn options_init_writes_the_documented_defaults() {
        #[repr(C)]
        struct Guarded {
            opts: es_options,
            canary: u64,
        }
        let mut g = Guarded { opts: es_options::default(), canary: 0x5a5a_5a5a_5a5a_5a5a };
        unsafe { es_options_init(&mut g.opts) };
        assert_eq!(g.opts.struct_size as usize, size_of::<es_options>());
        assert_eq!(g.opts.num_vcpus, 1);
        assert_eq!(g.opts.events_per_vcpu, 4096);
        assert_eq!(g.opts.device_events, 4096);
        assert_eq!(g.opts.slow_exit_ns, 20_000_000);
        assert_eq!(g.opts.stuck_exit_ns, 20_000_000);
        assert_eq!(g.opts.io_age_ns, 20_000_000_000);
        assert_eq!(g.opts.start_watchdog, 1);
        assert_eq!(g.opts.log_slow_exits, 1);
        assert_eq!(g.canary, 0x5a5a_5a5a_5a5a_5a5a);
    }

    #[test]
    fn status_names_and_last_error() {
        let name = |s| unsafe { CStr::from_ptr(es_status_name(s)) }.to_str().unwrap();
        assert_eq!(name(ES_OK), "ok");
        assert_eq!(name(ES_EEXIST), "already exists");
        assert_eq!(name(ES_ENOMEM), "out of memory");
        let mut rec: *mut es_recorder = core::ptr::null_mut();
        assert_eq!(
            unsafe { es_recorder_create(core::ptr::null(), core::ptr::null_mut()) },
            ES_EINVAL
        );
        let msg = unsafe { CStr::from_ptr(es_last_error()) }.to_str().unwrap();
        assert_eq!(msg, "es_recorder_create: out is NULL");
        let mut o = es_options::default();
        unsafe { es_options_init(&mut o) };
        o.start_watchdog = 0;
        assert_eq!(unsafe { es_recorder_create(&o, &mut rec) }, ES_OK);
        let mut c = es_counters::default();
        assert_eq!(unsafe { es_begin_exit(rec, 0, ES_EXIT_HLT, 0, 0, ES_DIR_NONE, 0) }, ES_OK);
        unsafe { es_end_exit(rec, 0) };
        assert_eq!(unsafe { es_get_counters(rec, &mut c) }, ES_OK);
        assert_eq!(c.exits_written, 1);
        unsafe { es_recorder_destroy(rec) };
    }
}
