//! Stack captures of a stuck vCPU thread reach the Rust finding hook: a thread inside an exit,
//! blocked in a socket read for ~300 ms, with the stack signal installed; the watchdog's
//! finding carries its user frames, one of them naming the blocking function.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exitscope::{Dir, ErrorCode, Exit, FindingType, Options, Recorder};

extern "C" {
    // glibc's SIGRTMIN (a function: glibc keeps the first real-time signals for itself).
    fn __libc_current_sigrtmin() -> std::os::raw::c_int;
    fn gettid() -> std::os::raw::c_int;
}

/// The vCPU thread's handler: inside the exit, blocked until the test writes a byte.
#[inline(never)]
fn block_in_socket_read(vcpu: &mut exitscope::Vcpu, sock: &mut UnixStream) {
    let _exit = vcpu.begin_exit(Exit::mmio(0xd000_0050, 4, Dir::Write, 1));
    let mut b = [0u8; 1];
    sock.read_exact(&mut b).unwrap();
}

#[derive(Debug, Default)]
struct Seen {
    kind: Option<FindingType>,
    tid: i32,
    user: Vec<String>,
    kernel: Vec<String>,
    note: String,
}

#[test]
fn a_stuck_thread_s_frames_reach_the_hook() {
    let opts = Options { num_vcpus: 1, log_slow_exits: false, ..Options::default() };
    let rec = Recorder::new(&opts).unwrap();
    let signo = unsafe { __libc_current_sigrtmin() } + 3;
    rec.install_stack_signal(signo).unwrap();
    assert_eq!(rec.set_thread_id(1, 1234).unwrap_err().code(), ErrorCode::InvalidArgument);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sink = Arc::clone(&seen);
    rec.set_finding_hook(move |f| {
        if let Some(s) = &f.stack {
            sink.lock().unwrap().push(Seen {
                kind: Some(f.kind),
                tid: s.tid,
                user: f.user_frames().iter().map(|fr| fr.function.to_string()).collect(),
                kernel: f.kernel_frames().iter().map(|fr| fr.function.to_string()).collect(),
                note: s.note.to_string(),
            });
        } else {
            assert!(f.user_frames().is_empty() && f.kernel_frames().is_empty());
        }
    })
    .unwrap();
    rec.start_watchdog(Duration::from_millis(20), Duration::from_secs(20)).unwrap();

    let (mut ours, mut theirs) = UnixStream::pair().unwrap();
    let mut vcpu = rec.vcpu(0).unwrap();
    let r = rec.clone();
    let thread = std::thread::spawn(move || {
        let tid = unsafe { gettid() };
        r.set_thread_id(0, tid).unwrap();
        block_in_socket_read(&mut vcpu, &mut theirs);
        tid
    });
    std::thread::sleep(Duration::from_millis(300));
    ours.write_all(b"x").unwrap();
    let tid = thread.join().unwrap();
    rec.stop_watchdog();

    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "no finding carried a stack");
    let first = &seen[0];
    assert_eq!(first.kind, Some(FindingType::StuckExit));
    assert_eq!(first.tid, tid);
    assert!(
        seen.iter().any(|s| s.user.iter().any(|f| f.contains("block_in_socket_read"))),
        "no user frame names block_in_socket_read: {seen:#?}"
    );
    // Kernel frames need root (/proc/self/task/TID/stack); without them the note says why.
    assert!(!first.kernel.is_empty() || !first.note.is_empty(), "{first:?}");
}
