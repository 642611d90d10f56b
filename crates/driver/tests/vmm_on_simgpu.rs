//! `vmm::Vmm` over [`DriverBackend`] on simgpu, both addressing modes: allocate, write,
//! evict, (touching evicted memory faults: checked in a child process), restore, read back.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::{Arc, Mutex};

use driver::{Driver, DriverBackend, LibCuda};
use vmm::{Backend, Config, HostStaging, Residency, Vmm};

mod common;
use common::simgpu_path;

const CHILD_ENV: &str = "CUDAW_TEST_CHILD";

fn new_vmm(config: Config) -> Vmm<DriverBackend> {
    let lib: Arc<dyn Driver> =
        Arc::new(LibCuda::open_path(simgpu_path().to_str().unwrap()).unwrap());
    Vmm::new(DriverBackend::new(lib, 0).unwrap(), config).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Held by each round trip for its whole run.
static DEVICE_MEMORY: Mutex<()> = Mutex::new(());

fn round_trip(config: Config) {
    // The device's free memory is process-wide: the other round trip must not allocate
    // or free between this one's readings.
    let _device = DEVICE_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    let vmm = new_vmm(config);
    let sizes = [1000u64, 3 << 20, 64 << 10, 5 << 20];
    let allocs: Vec<_> = sizes.iter().map(|&s| vmm.alloc(s, 0).unwrap()).collect();
    for (i, a) in allocs.iter().enumerate() {
        let dev = vmm.translate(a.base).unwrap();
        vmm.backend()
            .copy_from_host(dev, &pattern(a.size as usize, i as u8))
            .unwrap();
    }
    let (free_before, _) = vmm.backend().memory_info().unwrap();
    vmm.evict_all(&mut HostStaging).unwrap();
    let (free_evicted, _) = vmm.backend().memory_info().unwrap();
    let requested: u64 = sizes.iter().sum();
    assert!(
        free_evicted >= free_before + requested,
        "eviction gave back {} bytes, the allocations hold {requested}",
        free_evicted as i128 - free_before as i128
    );
    assert_eq!(vmm.stats().mapped, 0);
    for a in &allocs {
        assert!(!matches!(
            vmm.allocation(a.id).unwrap().residency,
            Residency::Resident
        ));
    }
    vmm.restore_all(&mut HostStaging).unwrap();
    for (i, a) in allocs.iter().enumerate() {
        let now = vmm.allocation(a.id).unwrap();
        assert_eq!(now.base, a.base, "the program's address is kept");
        let mut back = vec![0u8; a.size as usize];
        vmm.backend()
            .copy_to_host(&mut back, vmm.translate(a.base).unwrap())
            .unwrap();
        assert!(
            back == pattern(a.size as usize, i as u8),
            "allocation {i} differs after restore"
        );
    }
    for a in &allocs {
        vmm.free(a.base).unwrap();
    }
}

#[test]
fn vmm_mapped_addressing_round_trip() {
    round_trip(Config::mapped());
}

#[test]
fn vmm_translated_addressing_round_trip() {
    round_trip(Config::translated());
}

#[test]
fn child_entry() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let vmm = new_vmm(Config::mapped());
    let a = vmm.alloc(4 << 20, 0).unwrap();
    vmm.backend().copy_from_host(a.base, &[9; 64]).unwrap();
    if role == "touch_evicted" {
        vmm.evict_all(&mut HostStaging).unwrap();
    }
    println!("about to touch");
    // SAFETY: deliberately not, when evicted: the range is unmapped and must fault.
    let v = unsafe { std::ptr::read_volatile(a.base as *const u8) };
    println!("touched, read {v}");
}

#[test]
fn touching_evicted_memory_faults() {
    let run = |role: &str| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role)
            .output()
            .unwrap()
    };
    let out = run("touch_evicted");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("about to touch"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{:?}", out.status);
    let out = run("touch_resident");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("touched, read 9"));
}
