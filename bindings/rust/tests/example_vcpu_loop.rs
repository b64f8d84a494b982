//! Runs examples/vcpu_loop.rs (a real-mode guest on /dev/kvm) and reads its dump back with
//! `exitscope inspect --format json`. Skips, saying why, where /dev/kvm cannot be opened.
mod common;

#[path = "../examples/vcpu_loop.rs"]
mod vcpu_loop;

use common::{dump_path, inspect};

#[test]
fn the_example_vcpu_loop_records_a_real_guest() {
    let dump = dump_path("vcpu-loop");
    let backing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("vcpu-loop-{}.img", std::process::id()));
    let summary = match vcpu_loop::run(&dump, &backing) {
        Ok(s) => s,
        Err(e) if e.to_string().starts_with("/dev/kvm: ") => {
            eprintln!("SKIPPED: no KVM on this machine ({e})");
            return;
        }
        Err(e) => panic!("vcpu_loop: {e}"),
    };
    // Three loop iterations of: out THR, in LSR, doorbell write, CSTS read; then hlt.
    assert_eq!(summary.uart_output, "KKK");
    assert_eq!((summary.exits, summary.ios), (13, 3));
    // The backend thread wrote one 4 KiB block per doorbell.
    assert_eq!(std::fs::metadata(&backing).unwrap().len(), 3 * 4096);
    std::fs::remove_file(&backing).unwrap();

    let j = inspect(&dump);
    assert_eq!(j.get("exits").u64(), 13);
    assert!(j.get("attributes").get("vmm").str().starts_with("vcpu_loop"));
    let kinds = j.get("by_kind");
    assert_eq!((kinds.count_of("PIO"), kinds.count_of("MMIO"), kinds.count_of("HLT")), (6, 6, 1));
    let regs = j.get("by_register");
    for key in ["uart0.THR write", "uart0.LSR read", "nvme0.SQ1TDBL write", "nvme0.CSTS read"] {
        assert_eq!(regs.count_of(key), 3, "{key} in {:?}", regs.keys_of());
    }
    assert_eq!(j.get("by_device").keys_of().len(), 2, "no unassigned access");
    // One note, three submits, three completions.
    assert_eq!(j.get("losses").get("device_events_written").u64(), 7);
    std::fs::remove_file(&dump).unwrap();
}
