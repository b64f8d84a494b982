//! The crate end to end: record exits, device events and watchdog findings through the safe
//! API, write a dump, and read it back with `exitscope inspect --format json`.
mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::{dump_path, inspect, wait_for};
use exitscope::{
    Dir, ErrorCode, Exit, ExitKind, FindingType, Options, Recorder, RegisterMap, Space,
};

const NVME_BAR0: u64 = 0xfebf_0000;
const VIRTIO_NET: u64 = 0xd000_0000;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn quiet(num_vcpus: u32) -> Options {
    Options { num_vcpus, start_watchdog: false, log_slow_exits: false, ..Options::default() }
}

#[test]
fn exits_devices_and_registers_read_back() {
    let rec = Recorder::new(&quiet(2)).unwrap();
    let uart = rec.add_device("uart0", "uart16550").unwrap();
    rec.add_range(Space::Pio, 0x3f8, 8, uart, RegisterMap::Builtin("uart16550")).unwrap();
    let pvpanic = rec.add_device("pvpanic0", "pvpanic").unwrap();
    let map = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pvpanic.map");
    rec.add_range(Space::Pio, 0x505, 1, pvpanic, RegisterMap::File(&map)).unwrap();
    let nvme = rec.add_device("nvme0", "nvme").unwrap();
    rec.add_range(Space::Mmio, NVME_BAR0, 0x4000, nvme, RegisterMap::Builtin("nvme")).unwrap();
    let net = rec.add_device("virtio-net0", "virtio-mmio").unwrap();
    let virtio_map = repo().join("data/regmaps/virtio-mmio.map");
    rec.add_range(Space::Mmio, VIRTIO_NET, 0x200, net, RegisterMap::File(&virtio_map)).unwrap();
    let rom = rec.add_device("rom0", "").unwrap();
    rec.add_range(Space::Mmio, 0xfff0_0000, 0x1000, rom, RegisterMap::None).unwrap();
    rec.set_attribute("vmm", "exitscope crate test (no guest: the calls a vCPU loop makes)")
        .unwrap();
    rec.set_vcpu_counter(1, "kvm.exits", 42).unwrap();

    assert_eq!(
        rec.resolve(Space::Mmio, NVME_BAR0 + 0x1008, 4, Dir::Write).unwrap(),
        "nvme0.SQ1TDBL"
    );
    assert_eq!(rec.resolve(Space::Mmio, NVME_BAR0 + 0x16, 2, Dir::Read).unwrap(), "nvme0.CC+2");
    assert_eq!(rec.resolve(Space::Pio, 0x3f8, 1, Dir::Read).unwrap(), "uart0.RBR");
    assert_eq!(rec.resolve(Space::Pio, 0x505, 1, Dir::Write).unwrap(), "pvpanic0.EVENTS");
    assert_eq!(rec.resolve(Space::Mmio, 0xfff0_0010, 4, Dir::Read).unwrap(), "rom0+0x10");
    assert_eq!(rec.resolve(Space::Mmio, 0xdead_0000, 4, Dir::Read).unwrap(), "unassigned");

    // Each vCPU in its own thread, as a VMM runs them; the Vcpu handle moves in.
    let mut v0 = rec.vcpu(0).unwrap();
    let t0 = thread::spawn(move || {
        for b in b"hello" {
            let _exit = v0.begin_exit(Exit::pio(0x3f8, 1, Dir::Write, u64::from(*b)));
        }
        for _ in 0..2 {
            let mut exit = v0.begin_exit(Exit::pio(0x3fd, 1, Dir::Read, 0));
            exit.set_value(0x60); // LSR: THR empty
        }
        v0.record(Exit::pio(0x505, 1, Dir::Write, 1), |_| {});
    });
    let mut v1 = rec.vcpu(1).unwrap();
    let t1 = thread::spawn(move || {
        for tail in 1..=3u64 {
            let exit = v1.begin_exit(Exit::mmio(NVME_BAR0 + 0x1008, 4, Dir::Write, tail));
            exit.end();
        }
        for _ in 0..2 {
            let csts = v1.record(Exit::mmio(NVME_BAR0 + 0x1c, 4, Dir::Read, 0), |exit| {
                exit.set_value(1);
                1u32
            });
            assert_eq!(csts, 1);
        }
        for q in 0..4 {
            let _exit = v1.begin_exit(Exit::mmio(VIRTIO_NET + 0x50, 4, Dir::Write, q));
        }
        drop(v1.begin_exit(Exit::of_kind(ExitKind::Hlt)));
        drop(v1.begin_exit(Exit::mmio(0xdead_0000, 4, Dir::Read, 0)));
        drop(v1.begin_exit(Exit::mmio(0xfff0_0010, 4, Dir::Read, 0)));
    });
    t0.join().unwrap();
    t1.join().unwrap();

    let c = rec.counters().unwrap();
    assert_eq!(c.exits_written, 8 + 12);
    assert_eq!((c.begin_without_end, c.end_without_begin, c.bad_vcpu), (0, 0, 0));

    let dump = dump_path("exits");
    rec.write_dump(&dump).unwrap();
    exitscope::check_dump(&dump).unwrap();
    let j = inspect(&dump);
    assert_eq!(j.get("schema").str(), "exitscope.exit-health.v1");
    assert_eq!(j.get("exits").u64(), 20);
    assert!(!j.get("includes_guest_data").bool());
    let kinds = j.get("by_kind");
    assert_eq!((kinds.count_of("PIO"), kinds.count_of("MMIO"), kinds.count_of("HLT")), (8, 11, 1));
    let devices = j.get("by_device");
    assert_eq!(devices.count_of("uart0"), 7);
    assert_eq!(devices.count_of("pvpanic0"), 1);
    assert_eq!(devices.count_of("nvme0"), 5);
    assert_eq!(devices.count_of("virtio-net0"), 4);
    assert_eq!(devices.count_of("rom0"), 1);
    assert_eq!(devices.count_of("unassigned"), 1);
    let regs = j.get("by_register");
    assert_eq!(regs.count_of("uart0.THR write"), 5);
    assert_eq!(regs.count_of("uart0.LSR read"), 2);
    assert_eq!(regs.count_of("pvpanic0.EVENTS write"), 1);
    assert_eq!(regs.count_of("nvme0.SQ1TDBL write"), 3);
    assert_eq!(regs.count_of("nvme0.CSTS read"), 2);
    assert_eq!(regs.count_of("virtio-net0.QUEUE_NOTIFY write"), 4);
    assert_eq!(regs.count_of("rom0+0x10 read"), 1);
    assert_eq!(regs.count_of("unassigned 0xdead0000 read"), 1);
    let vcpus = j.get("by_vcpu");
    assert_eq!((vcpus.count_of("0"), vcpus.count_of("1")), (8, 12));
    assert_eq!(
        j.get("attributes").get("vmm").str(),
        "exitscope crate test (no guest: the calls a vCPU loop makes)"
    );
    let per_vcpu = j.get("counters_by_vcpu").arr();
    assert_eq!(per_vcpu.len(), 1);
    assert_eq!(per_vcpu[0].get("vcpu").u64(), 1);
    assert_eq!(per_vcpu[0].get("counters").get("kvm.exits").u64(), 42);
    let losses = j.get("losses");
    assert_eq!(losses.get("exits_written").u64(), 20);
    assert_eq!(losses.get("exits_overwritten").u64(), 0);

    let with_data = dump_path("exits-guest-data");
    rec.write_dump_with_guest_data(&with_data).unwrap();
    assert!(inspect(&with_data).get("includes_guest_data").bool());
    std::fs::remove_file(&dump).unwrap();
    std::fs::remove_file(&with_data).unwrap();
}

#[derive(Debug, Clone, PartialEq)]
struct Seen {
    kind: FindingType,
    exit_kind: ExitKind,
    dir: Dir,
    size: u8,
    addr: u64,
    io_id: u64,
    device: String,
    register: String,
    line: String,
}

#[test]
fn device_events_and_watchdog_findings_read_back() {
    let rec = Recorder::new(&quiet(1)).unwrap();
    let nvme = rec.add_device("nvme0", "nvme").unwrap();
    rec.add_range(Space::Mmio, NVME_BAR0, 0x4000, nvme, RegisterMap::Builtin("nvme")).unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sink = Arc::clone(&seen);
    rec.set_finding_hook(move |f| {
        sink.lock().unwrap().push(Seen {
            kind: f.kind,
            exit_kind: f.exit_kind,
            dir: f.dir,
            size: f.size,
            addr: f.addr,
            io_id: f.io_id,
            device: f.device.to_string(),
            register: f.register.to_string(),
            line: f.line.to_string(),
        })
    })
    .unwrap();
    // Thresholds far below how long the test holds the exit and the I/O: the test waits for
    // the findings themselves, whatever the machine's load.
    rec.start_watchdog(Duration::from_millis(20), Duration::from_millis(50)).unwrap();
    let has = |k: FindingType| seen.lock().unwrap().iter().any(|s| s.kind == k);

    // The device model's backend, from its own thread: I/O 7 never completes, 8 does.
    rec.io_submit(nvme, 7);
    rec.io_submit(nvme, 8);
    rec.io_complete(nvme, 8, 0);
    rec.queue_full(nvme, 1);
    rec.backend_error(nvme, -5, "pwrite to the backing file: EIO").unwrap();
    rec.note(nvme, "controller reset by the guest").unwrap();

    let mut vcpu = rec.vcpu(0).unwrap();
    {
        let _exit = vcpu.begin_exit(Exit::mmio(NVME_BAR0 + 0x1008, 4, Dir::Write, 1));
        // The vCPU is stuck in the doorbell write until the watchdog has reported it.
        assert!(wait_for(20, || has(FindingType::StuckExit)), "no stuck-exit finding");
    }
    assert!(wait_for(20, || has(FindingType::StuckExitEnd)), "no end of the stuck exit");
    assert!(wait_for(20, || has(FindingType::AgedIo)), "no aged-io finding for I/O 7");
    rec.stop_watchdog();

    let all = seen.lock().unwrap().clone();
    let stuck = all.iter().find(|s| s.kind == FindingType::StuckExit).unwrap();
    assert_eq!(
        (stuck.exit_kind, stuck.dir, stuck.size, stuck.addr),
        (ExitKind::Mmio, Dir::Write, 4, NVME_BAR0 + 0x1008)
    );
    assert_eq!((stuck.device.as_str(), stuck.register.as_str()), ("nvme0", "SQ1TDBL"));
    assert!(stuck.line.contains("stuck in exit MMIO write 4B to nvme0.SQ1TDBL"), "{}", stuck.line);
    let aged = all.iter().find(|s| s.kind == FindingType::AgedIo).unwrap();
    assert_eq!((aged.io_id, aged.device.as_str()), (7, "nvme0"));
    assert!(all.iter().all(|s| s.io_id != 8), "I/O 8 completed yet was reported: {all:?}");
    // A stall is also a slow exit (20 ms default threshold).
    assert!(all.iter().any(|s| s.kind == FindingType::SlowExit));

    let c = rec.counters().unwrap();
    assert_eq!(c.device_events_written, 6);
    assert_eq!(c.io_in_flight, 1);

    let dump = dump_path("device-events");
    rec.write_dump(&dump).unwrap();
    let j = inspect(&dump);
    assert_eq!(j.get("losses").get("device_events_written").u64(), 6);
    assert_eq!(j.get("by_register").count_of("nvme0.SQ1TDBL write"), 1);
    let findings = j.get("findings").arr();
    let of_type =
        |t: &str| findings.iter().filter(|f| f.get("type").str() == t).collect::<Vec<_>>();
    let stuck = of_type("stuck-exit");
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].get("device").str(), "nvme0");
    // The I/Os in flight when the vCPU was stuck, replayed from the dump's device events.
    let in_flight: Vec<(String, u64)> = stuck[0]
        .get("in_flight")
        .arr()
        .iter()
        .map(|io| (io.get("device").str().to_string(), io.get("io_id").u64()))
        .collect();
    assert_eq!(in_flight, vec![("nvme0".to_string(), 7)]);
    assert_eq!(of_type("stuck-exit-end").len(), 1);
    let aged = of_type("aged-io");
    assert!(!aged.is_empty());
    assert!(aged.iter().all(|f| f.get("io_id").u64() == 7 && f.get("device").str() == "nvme0"));
    let slow = j.get("slow_exits").arr();
    assert_eq!(slow.len(), 1);
    assert_eq!(slow[0].get("target").str(), "nvme0.SQ1TDBL");
    assert!(slow[0].get("stalled").bool());
    std::fs::remove_file(&dump).unwrap();
}

#[test]
fn the_guard_ends_the_exit_on_every_path_out() {
    let rec = Recorder::new(&quiet(1)).unwrap();
    let mut vcpu = rec.vcpu(0).unwrap();
    fn handler(vcpu: &mut exitscope::Vcpu, fail: bool) -> Result<u64, String> {
        let mut exit = vcpu.begin_exit(Exit::pio(0x60, 1, Dir::Read, 0));
        if fail {
            return Err("backend gone".into()); // `?`-style early return
        }
        exit.set_value(0xfa);
        Ok(0xfa)
    }
    assert_eq!(handler(&mut vcpu, false), Ok(0xfa));
    assert!(handler(&mut vcpu, true).is_err());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _exit = vcpu.begin_exit(Exit::of_kind(ExitKind::Hlt));
        panic!("device model bug");
    }));
    assert!(panicked.is_err());
    drop(vcpu.begin_exit(Exit::of_kind(ExitKind::Shutdown)));
    let c = rec.counters().unwrap();
    assert_eq!(c.exits_written, 4);
    assert_eq!((c.begin_without_end, c.end_without_begin), (0, 0));
}

#[test]
fn a_panicking_hook_is_caught() {
    let rec = Recorder::new(&quiet(1)).unwrap();
    rec.set_slow_exit_threshold(Duration::from_nanos(1)).unwrap(); // every exit is slow
    let calls = Arc::new(Mutex::new(0u32));
    let c2 = Arc::clone(&calls);
    rec.set_finding_hook(move |_| {
        *c2.lock().unwrap() += 1;
        panic!("hook bug");
    })
    .unwrap();
    let mut vcpu = rec.vcpu(0).unwrap();
    thread::sleep(Duration::from_micros(1));
    for _ in 0..3 {
        let _exit = vcpu.begin_exit(Exit::of_kind(ExitKind::Hlt));
        thread::sleep(Duration::from_micros(10));
    }
    assert_eq!(*calls.lock().unwrap(), 3);
    // Replaced hook: the new one is called, the old one no more.
    let calls2 = Arc::new(Mutex::new(0u32));
    let c3 = Arc::clone(&calls2);
    rec.set_finding_hook(move |f| {
        assert_eq!(f.kind, FindingType::SlowExit);
        *c3.lock().unwrap() += 1;
    })
    .unwrap();
    drop(vcpu.begin_exit(Exit::of_kind(ExitKind::Hlt)));
    rec.clear_finding_hook();
    drop(vcpu.begin_exit(Exit::of_kind(ExitKind::Hlt)));
    assert_eq!((*calls.lock().unwrap(), *calls2.lock().unwrap()), (3, 1));
    assert_eq!(rec.counters().unwrap().exits_written, 5);
}

#[test]
fn errors_carry_the_status_and_the_library_message() {
    let rec = Recorder::new(&quiet(2)).unwrap();
    let nvme0 = rec.add_device("nvme0", "nvme").unwrap();
    let nvme1 = rec.add_device("nvme1", "nvme").unwrap();
    rec.add_range(Space::Mmio, NVME_BAR0, 0x4000, nvme0, RegisterMap::Builtin("nvme")).unwrap();

    let e = rec
        .add_range(Space::Mmio, NVME_BAR0 + 0x2000, 0x4000, nvme1, RegisterMap::Builtin("nvme"))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    assert_eq!(
        e.to_string(),
        "mmio range [0xfebf2000, 0xfebf5fff] of nvme1 overlaps [0xfebf0000, 0xfebf3fff] of nvme0"
    );
    assert_eq!(rec.add_device("nvme0", "nvme").unwrap_err().code(), ErrorCode::AlreadyExists);

    let e =
        rec.add_range(Space::Pio, 0x3f8, 8, nvme1, RegisterMap::Builtin("uart8250")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.message().contains("uart8250"), "{e}");

    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such.map");
    let e = rec.add_range(Space::Pio, 0x3f8, 8, nvme1, RegisterMap::File(&missing)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.message().contains("no-such.map"), "{e}");

    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad-width.map");
    let e = rec.add_range(Space::Pio, 0x3f8, 8, nvme1, RegisterMap::File(&bad)).unwrap_err();
    assert!(e.message().contains("bad-width.map:3: bad width '3'"), "{e}");

    let e = rec.write_dump(env!("CARGO_TARGET_TMPDIR")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(!e.message().is_empty());
    assert_eq!(exitscope::check_dump(&bad).unwrap_err().code(), ErrorCode::Corrupt);
    assert_eq!(exitscope::check_dump(&missing).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(
        rec.set_slow_exit_threshold(Duration::ZERO).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        rec.set_vcpu_counter(9, "kvm.exits", 1).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    let e = rec.add_device("nv\0me", "nvme").unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("NUL"), "{e}");

    // One Vcpu handle per index at a time.
    assert_eq!(rec.vcpu(2).unwrap_err().code(), ErrorCode::InvalidArgument);
    let v0 = rec.vcpu(0).unwrap();
    assert_eq!(rec.vcpu(0).unwrap_err().code(), ErrorCode::AlreadyExists);
    drop(v0);
    rec.vcpu(0).unwrap();

    // The recorder outlives its last handle: a Vcpu keeps it alive.
    let v1 = rec.vcpu(1).unwrap();
    drop(rec);
    let mut v1 = v1;
    drop(v1.begin_exit(Exit::of_kind(ExitKind::Hlt)));
}

#[test]
fn metrics_endpoint_serves_the_recorded_exits() {
    use std::io::{Read, Write};
    let rec = Recorder::new(&quiet(1)).unwrap();
    let uart = rec.add_device("uart0", "uart16550").unwrap();
    rec.add_range(Space::Pio, 0x3f8, 8, uart, RegisterMap::Builtin("uart16550")).unwrap();
    assert_eq!(
        rec.serve_metrics(Some("not-an-address")).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    let endpoint = rec.serve_metrics(Some("127.0.0.1:0")).unwrap();
    assert_ne!(endpoint.port(), 0);
    let mut vcpu = rec.vcpu(0).unwrap();
    for b in b"abc" {
        drop(vcpu.begin_exit(Exit::pio(0x3f8, 1, Dir::Write, u64::from(*b))));
    }
    // The collector folds the rings on its own schedule: scrape until the exits show up.
    let scrape = || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", endpoint.port())).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    };
    let mut last = String::new();
    let seen = wait_for(20, || {
        last = scrape();
        last.lines().any(|l| {
            l.starts_with("exitscope_exit_duration_seconds_count")
                && l.contains("uart0")
                && l.ends_with(" 3")
        })
    });
    assert!(seen, "no count of 3 uart0 exits in:\n{last}");
    drop(endpoint);
}
