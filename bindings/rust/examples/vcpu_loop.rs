//! A vCPU loop instrumented with exitscope, in the shape of crosvm's and propolis's exit
//! handlers: `KVM_RUN` returns, the exit is decoded into a `VcpuExit`, one `match` hands it to
//! the device bus. The exitscope guard is taken right after decoding and dropped after the
//! device model is done, so it times what the VMM did instead of running the vCPU.
//!
//! It runs a real guest on /dev/kvm with std only (raw ioctls, no kvm-ioctls crate): 30 bytes
//! of real-mode code that, three times, writes 'K' to a 16550 UART at port 0x3f8, reads its
//! LSR, rings NVMe submission-queue 1's tail doorbell (MMIO) and reads CSTS, then halts. The
//! NVMe device model submits one write per doorbell to a backend thread, which writes a block
//! to a real file and completes it (device events). Then a dump is written:
//!
//!   cargo run --offline --example vcpu_loop -- /tmp/vcpu_loop.esdump
//!   build/exitscope inspect /tmp/vcpu_loop.esdump
//!
//! docs/rust.md walks through it. Without /dev/kvm it says why and exits 1.
#![allow(dead_code)] // tests/example_vcpu_loop.rs includes this file as a module

use std::error::Error;
use std::ffi::{c_int, c_ulong, c_void};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use exitscope::{DeviceId, Dir, Exit, ExitKind, Options, Recorder, RegisterMap, Space};

// ---- The guest and its machine --------------------------------------------------------------

const COM1: u16 = 0x3f8;
/// NVMe BAR0 where real-mode code can reach it (0xd000:0000); no memory slot there, so every
/// access is a KVM_EXIT_MMIO.
const NVME_BAR0: u64 = 0xd_0000;
const GUEST_MEM: usize = 0x1_0000;
const ENTRY: u64 = 0x1000;

#[rustfmt::skip]
const GUEST_CODE: [u8; 30] = [
    0xb9, 0x03, 0x00,                   // mov cx, 3
    0xb8, 0x00, 0xd0,                   // mov ax, 0xd000
    0x8e, 0xd8,                         // mov ds, ax          ; ds:0 = NVMe BAR0
    0xba, 0xf8, 0x03,                   // L: mov dx, 0x3f8
    0xb0, b'K',                         // mov al, 'K'
    0xee,                               // out dx, al          ; THR
    0x83, 0xc2, 0x05,                   // add dx, 5
    0xec,                               // in al, dx           ; LSR
    0x66, 0x89, 0x0e, 0x08, 0x10,       // mov [0x1008], ecx   ; SQ1TDBL = cx
    0x66, 0xa1, 0x1c, 0x00,             // mov eax, [0x1c]     ; CSTS
    0xe2, 0xeb,                         // loop L
    0xf4,                               // hlt
];

// ---- KVM through raw ioctls (linux/kvm.h, x86-64) -------------------------------------------

extern "C" {
    fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
}

const KVM_CREATE_VM: c_ulong = 0xae01;
const KVM_GET_VCPU_MMAP_SIZE: c_ulong = 0xae04;
const KVM_CREATE_VCPU: c_ulong = 0xae41;
const KVM_SET_USER_MEMORY_REGION: c_ulong = 0x4020_ae46;
const KVM_RUN: c_ulong = 0xae80;
const KVM_SET_REGS: c_ulong = 0x4090_ae82;
const KVM_GET_SREGS: c_ulong = 0x8138_ae83;
const KVM_SET_SREGS: c_ulong = 0x4138_ae84;

const KVM_EXIT_IO: u32 = 2;
const KVM_EXIT_HLT: u32 = 5;
const KVM_EXIT_MMIO: u32 = 6;
const KVM_EXIT_SHUTDOWN: u32 = 8;
const KVM_EXIT_INTR: u32 = 10;
const KVM_EXIT_IO_OUT: u8 = 1;

#[repr(C)]
struct KvmUserspaceMemoryRegion {
    slot: u32,
    flags: u32,
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
}

fn check_ioctl(what: &str, r: c_int) -> std::io::Result<c_int> {
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r)
}

/// An anonymous or file mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize, fd: RawFd, what: &str) -> std::io::Result<Mapping> {
        const PROT_RW: c_int = 0x1 | 0x2;
        const MAP_SHARED: c_int = 0x01;
        const MAP_PRIVATE_ANON: c_int = 0x02 | 0x20;
        let flags = if fd < 0 { MAP_PRIVATE_ANON } else { MAP_SHARED };
        let p = unsafe { mmap(std::ptr::null_mut(), len, PROT_RW, flags, fd, 0) };
        if p as isize == -1 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(e.kind(), format!("mmap {what}: {e}")));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

// SAFETY: the mapping is owned memory; the KVM vCPU that uses it moves into its thread whole.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// One exit as the loop sees it (crosvm's `VcpuExit`, propolis's `VmExitKind`), borrowing the
/// data of `kvm_run`.
enum VcpuExit<'a> {
    IoOut { port: u16, data: &'a [u8] },
    IoIn { port: u16, data: &'a mut [u8] },
    MmioWrite { addr: u64, data: &'a [u8] },
    MmioRead { addr: u64, data: &'a mut [u8] },
    Hlt,
    Shutdown,
    Intr,
    Other(u32),
}

struct KvmVcpu {
    _kvm: File,
    _vm: OwnedFd,
    fd: OwnedFd,
    run: Mapping,
    _mem: Mapping,
}

impl KvmVcpu {
    /// A VM with GUEST_MEM bytes of RAM at 0 holding `code` at ENTRY, and one vCPU in real
    /// mode at 0:ENTRY.
    fn new(code: &[u8]) -> std::io::Result<KvmVcpu> {
        let kvm = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map_err(|e| std::io::Error::new(e.kind(), format!("/dev/kvm: {e}")))?;
        let vm = check_ioctl("KVM_CREATE_VM", unsafe { ioctl(kvm.as_raw_fd(), KVM_CREATE_VM, 0) })?;
        let vm = unsafe { OwnedFd::from_raw_fd(vm) };
        let mem = Mapping::new(GUEST_MEM, -1, "guest memory")?;
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), mem.ptr.add(ENTRY as usize), code.len())
        };
        let region = KvmUserspaceMemoryRegion {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: GUEST_MEM as u64,
            userspace_addr: mem.ptr as u64,
        };
        check_ioctl("KVM_SET_USER_MEMORY_REGION", unsafe {
            ioctl(vm.as_raw_fd(), KVM_SET_USER_MEMORY_REGION, &region)
        })?;
        let fd =
            check_ioctl("KVM_CREATE_VCPU", unsafe { ioctl(vm.as_raw_fd(), KVM_CREATE_VCPU, 0) })?;
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = check_ioctl("KVM_GET_VCPU_MMAP_SIZE", unsafe {
            ioctl(kvm.as_raw_fd(), KVM_GET_VCPU_MMAP_SIZE, 0)
        })?;
        let run = Mapping::new(size as usize, fd.as_raw_fd(), "kvm_run")?;
        // struct kvm_sregs is 312 bytes; cs (a kvm_segment: base u64, limit u32, selector u16,
        // ...) comes first. Real mode with cs = 0.
        let mut sregs = [0u64; 39];
        check_ioctl("KVM_GET_SREGS", unsafe {
            ioctl(fd.as_raw_fd(), KVM_GET_SREGS, sregs.as_mut_ptr())
        })?;
        sregs[0] = 0; // cs.base
        sregs[1] &= 0xffff_0000_ffff_ffff; // cs.selector (bytes 12..14)
        check_ioctl("KVM_SET_SREGS", unsafe {
            ioctl(fd.as_raw_fd(), KVM_SET_SREGS, sregs.as_ptr())
        })?;
        let mut regs = [0u64; 18]; // struct kvm_regs: rax ... r15, rip, rflags
        regs[16] = ENTRY;
        regs[17] = 0x2;
        check_ioctl("KVM_SET_REGS", unsafe { ioctl(fd.as_raw_fd(), KVM_SET_REGS, regs.as_ptr()) })?;
        Ok(KvmVcpu { _kvm: kvm, _vm: vm, fd, run, _mem: mem })
    }

    /// KVM_RUN, then the exit decoded from `kvm_run` (layout of linux/kvm.h).
    fn run(&mut self) -> std::io::Result<VcpuExit<'_>> {
        loop {
            let r = unsafe { ioctl(self.fd.as_raw_fd(), KVM_RUN, 0) };
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            check_ioctl("KVM_RUN", r)?;
            break;
        }
        let run = self.run.ptr;
        let at = |off: usize| unsafe { run.add(off) };
        let reason = unsafe { at(8).cast::<u32>().read() };
        Ok(match reason {
            KVM_EXIT_IO => unsafe {
                let dir = at(32).read();
                let size = at(33).read() as usize;
                let port = at(34).cast::<u16>().read_unaligned();
                let count = at(36).cast::<u32>().read_unaligned() as usize;
                let off = at(40).cast::<u64>().read_unaligned() as usize;
                let data = std::slice::from_raw_parts_mut(at(off), size * count);
                if dir == KVM_EXIT_IO_OUT {
                    VcpuExit::IoOut { port, data }
                } else {
                    VcpuExit::IoIn { port, data }
                }
            },
            KVM_EXIT_MMIO => unsafe {
                let addr = at(32).cast::<u64>().read_unaligned();
                let len = (at(48).cast::<u32>().read_unaligned() as usize).min(8);
                let data = std::slice::from_raw_parts_mut(at(40), len);
                if at(52).read() != 0 {
                    VcpuExit::MmioWrite { addr, data }
                } else {
                    VcpuExit::MmioRead { addr, data }
                }
            },
            KVM_EXIT_HLT => VcpuExit::Hlt,
            KVM_EXIT_SHUTDOWN => VcpuExit::Shutdown,
            KVM_EXIT_INTR => VcpuExit::Intr,
            other => VcpuExit::Other(other),
        })
    }
}

// ---- Devices --------------------------------------------------------------------------------

/// The device models behind the bus: a UART that collects what the guest writes, and an NVMe
/// controller whose doorbell submits a block write to a backend thread.
struct Bus {
    rec: Recorder,
    uart_out: Vec<u8>,
    nvme: DeviceId,
    backend: mpsc::Sender<u64>,
    next_io: u64,
}

impl Bus {
    fn io_write(&mut self, port: u16, data: &[u8]) {
        if port == COM1 {
            self.uart_out.extend_from_slice(data);
        }
    }

    fn io_read(&mut self, port: u16, data: &mut [u8]) {
        data.fill(0);
        if port == COM1 + 5 {
            data[0] = 0x60; // LSR: THR empty, transmitter idle
        }
    }

    fn mmio_write(&mut self, addr: u64, _data: &[u8]) {
        if addr == NVME_BAR0 + 0x1008 {
            // SQ1TDBL: one new command. Submitted while the vCPU is still inside its exit.
            self.next_io += 1;
            self.rec.io_submit(self.nvme, self.next_io);
            if self.backend.send(self.next_io).is_err() {
                self.rec.io_complete(self.nvme, self.next_io, -5);
            }
        }
    }

    fn mmio_read(&mut self, addr: u64, data: &mut [u8]) {
        data.fill(0);
        if addr == NVME_BAR0 + 0x1c {
            data[0] = 1; // CSTS.RDY
        }
    }
}

/// The backend: writes one 4 KiB block per I/O to `file`, completes it with the result.
fn spawn_backend(
    rec: Recorder,
    nvme: DeviceId,
    file: File,
) -> (mpsc::Sender<u64>, thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<u64>();
    let handle = thread::spawn(move || {
        let block = [0xa5u8; 4096];
        for id in rx {
            let status = match file.write_all_at(&block, (id - 1) * 4096) {
                Ok(()) => 0,
                Err(e) => {
                    let errno = -i64::from(e.raw_os_error().unwrap_or(5));
                    let _ = rec.backend_error(nvme, errno, &format!("pwrite: {e}"));
                    errno
                }
            };
            rec.io_complete(nvme, id, status);
        }
    });
    (tx, handle)
}

// ---- The loop -------------------------------------------------------------------------------

/// What one run did.
pub struct Summary {
    pub uart_output: String,
    pub exits: u64,
    pub ios: u64,
}

/// The vCPU thread's loop. The guard (`_exit`) is taken as soon as the exit is decoded and
/// dropped at the end of each arm, after the device model returned: whatever the handler does
/// (wait for a lock, call a backend, `?`, `break`) is inside the timed exit.
fn vcpu_loop(
    kvm: &mut KvmVcpu,
    vcpu: &mut exitscope::Vcpu,
    bus: &mut Bus,
) -> Result<(), Box<dyn Error>> {
    loop {
        match kvm.run()? {
            VcpuExit::IoOut { port, data } => {
                let _exit = vcpu.begin_exit(Exit::pio(
                    port,
                    data.len() as u8,
                    Dir::Write,
                    Exit::le_value(data),
                ));
                bus.io_write(port, data);
            }
            VcpuExit::IoIn { port, data } => {
                let mut exit = vcpu.begin_exit(Exit::pio(port, data.len() as u8, Dir::Read, 0));
                bus.io_read(port, data);
                exit.set_value(Exit::le_value(data));
            }
            VcpuExit::MmioWrite { addr, data } => {
                let _exit = vcpu.begin_exit(Exit::mmio(
                    addr,
                    data.len() as u8,
                    Dir::Write,
                    Exit::le_value(data),
                ));
                bus.mmio_write(addr, data);
            }
            VcpuExit::MmioRead { addr, data } => {
                let mut exit = vcpu.begin_exit(Exit::mmio(addr, data.len() as u8, Dir::Read, 0));
                bus.mmio_read(addr, data);
                exit.set_value(Exit::le_value(data));
            }
            VcpuExit::Hlt => {
                let _exit = vcpu.begin_exit(Exit::of_kind(ExitKind::Hlt));
                return Ok(()); // this guest halts once, at its end
            }
            VcpuExit::Intr => {
                let _exit = vcpu.begin_exit(Exit::of_kind(ExitKind::Intr));
            }
            VcpuExit::Shutdown => {
                let _exit = vcpu.begin_exit(Exit::of_kind(ExitKind::Shutdown));
                return Err("guest shut down (triple fault)".into());
            }
            VcpuExit::Other(reason) => {
                let _exit = vcpu.begin_exit(Exit::of_kind(ExitKind::Other));
                return Err(format!("unhandled KVM exit reason {reason}").into());
            }
        }
    }
}

/// Sets up the recorder and the devices, boots the guest on one vCPU thread, writes `dump`.
/// Fails with "/dev/kvm: ..." where there is no KVM.
pub fn run(dump: &Path, backing: &Path) -> Result<Summary, Box<dyn Error>> {
    let mut kvm = KvmVcpu::new(&GUEST_CODE)?;

    let rec = Recorder::new(&Options { num_vcpus: 1, ..Options::default() })?;
    rec.set_attribute("vmm", "vcpu_loop (bindings/rust/examples): real-mode guest on /dev/kvm")?;
    let uart = rec.add_device("uart0", "uart16550")?;
    rec.add_range(Space::Pio, u64::from(COM1), 8, uart, RegisterMap::Builtin("uart16550"))?;
    let nvme = rec.add_device("nvme0", "nvme")?;
    rec.add_range(Space::Mmio, NVME_BAR0, 0x4000, nvme, RegisterMap::Builtin("nvme"))?;

    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(backing)
        .map_err(|e| format!("{}: {e}", backing.display()))?;
    rec.note(nvme, &format!("backing file {}", backing.display()))?;
    let (tx, backend) = spawn_backend(rec.clone(), nvme, file);
    let mut bus = Bus { rec: rec.clone(), uart_out: Vec::new(), nvme, backend: tx, next_io: 0 };

    // The vCPU thread owns its Vcpu handle (and the KVM vCPU), as in crosvm and propolis.
    let mut vcpu = rec.vcpu(0)?;
    let vcpu_thread = thread::spawn(move || -> Result<Bus, String> {
        vcpu_loop(&mut kvm, &mut vcpu, &mut bus).map_err(|e| e.to_string())?;
        Ok(bus)
    });
    let bus = vcpu_thread.join().map_err(|_| "the vCPU thread panicked")??;
    let ios = bus.next_io;
    let uart_output = String::from_utf8_lossy(&bus.uart_out).into_owned();
    drop(bus); // closes the backend's queue
    backend.join().map_err(|_| "the backend thread panicked")?;

    rec.write_dump(dump)?;
    Ok(Summary { uart_output, exits: rec.counters()?.exits_written, ios })
}

fn main() {
    let dump =
        PathBuf::from(std::env::args_os().nth(1).unwrap_or_else(|| "vcpu_loop.esdump".into()));
    let backing = std::env::temp_dir().join(format!("vcpu_loop-{}.img", std::process::id()));
    let result = run(&dump, &backing);
    let _ = std::fs::remove_file(&backing);
    match result {
        Ok(s) => {
            println!("guest wrote {:?} to uart0; {} NVMe writes completed", s.uart_output, s.ios);
            println!("dump written: {} ({} exits)", dump.display(), s.exits);
        }
        Err(e) => {
            eprintln!("vcpu_loop: {e}");
            std::process::exit(1);
        }
    }
}
