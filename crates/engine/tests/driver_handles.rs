//! Driver-level handles (`cuMemCreate` through the engine's handles API, as the runtime
//! shim's entry points and the driver layer call it), in this process on simgpu: a pause
//! evicts them and a resume re-creates them mapped at the same addresses, with their bytes;
//! a dump and a restore carry them too.

mod common;
use common::*;
use cudaw_engine::{handles, state, Host};
use driver::api::{pinned_device_prop, read_write_access};
use driver::Driver;
use std::ffi::c_void;

const MIB: u64 = 1 << 20;

/// A handle of `size` bytes through the engine, mapped at `va` with read-write access.
fn mapped_handle(va: u64, size: u64) -> u64 {
    let prop = pinned_device_prop(0);
    let mut h = 0u64;
    // SAFETY: a writable handle and a CUmemAllocationProp, both live locals.
    let rc = unsafe {
        handles::create(
            &mut h,
            size as usize,
            (&prop as *const driver::sys::CUmemAllocationProp).cast::<c_void>(),
            0,
            true,
        )
    };
    assert_eq!(rc, 0, "cuMemCreate through the engine");
    assert_eq!(h & handles::TAG, handles::TAG, "a virtual handle");
    assert_eq!(handles::map(va, size as usize, 0, h, 0), 0, "cuMemMap");
    let access = read_write_access(0);
    // SAFETY: one CUmemAccessDesc, a live local.
    let rc = unsafe {
        handles::set_access(
            va,
            size as usize,
            (&access as *const driver::sys::CUmemAccessDesc).cast::<c_void>(),
            1,
        )
    };
    assert_eq!(rc, 0, "cuMemSetAccess");
    h
}

/// Two handles through the engine, of 4 and 2 MiB, mapped one after the other in an 8 MiB
/// reservation and filled with the patterns of `seed` and `seed + 1`: (the reservation,
/// the handles, the patterns).
struct Two {
    va: u64,
    a: u64,
    b: u64,
    pa: Vec<u8>,
    pb: Vec<u8>,
}

fn two_handles(seed: u64) -> Two {
    let drv = cudaw_engine::memory::driver().unwrap();
    // Device 0's primary context, current on this test's thread.
    device().vmm.backend().make_current().unwrap();
    let va = drv.mem_address_reserve(8 * MIB, 0, 0).unwrap();
    let (a, b) = (
        mapped_handle(va, 4 * MIB),
        mapped_handle(va + 4 * MIB, 2 * MIB),
    );
    let (pa, pb) = (pattern(4 << 20, seed), pattern(2 << 20, seed + 1));
    write(va, &pa);
    write(va + 4 * MIB, &pb);
    Two { va, a, b, pa, pb }
}

#[test]
fn driver_handles_are_evicted_and_restored_at_the_same_address() {
    let _turn = setup();
    let drv = cudaw_engine::memory::driver().unwrap();
    let Two { va, a, b, pa, pb } = two_handles(1);
    assert_eq!(handles::counts(0).resident, 6 * MIB);

    ok(&pause(), "pause");
    let c = handles::counts(0);
    assert_eq!((c.resident, c.evicted, c.handles), (0, 6 * MIB, 2));
    assert!(
        drv.memcpy_dtoh(&mut [0u8; 16], va).is_err(),
        "the handle's memory is still mapped while paused"
    );

    ok(&resume(), "resume");
    assert_eq!(handles::counts(0).resident, 6 * MIB);
    assert!(read(va, pa.len()) == pa, "handle a lost its bytes");
    assert!(
        read(va + 4 * MIB, pb.len()) == pb,
        "handle b lost its bytes"
    );

    // A dump carries them; a restore brings back the dump's bytes.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("handles.img");
    let r = dump(&img, true);
    ok(&r, "dump --leave-running");
    assert_eq!(r.dump.unwrap().bytes, 6 * MIB);
    write(va, &pattern(4 << 20, 9));
    ok(&restore(&img, false), "restore");
    assert!(
        read(va, pa.len()) == pa,
        "the restore did not bring back handle a"
    );
    assert!(!state::is_paused() && !HOST.gate_closed());

    assert_eq!(handles::unmap(va, (6 * MIB) as usize), 0);
    assert_eq!((handles::release(a), handles::release(b)), (0, 0));
    assert_eq!(handles::counts(0).handles, 0);
    drv.mem_address_free(va, 8 * MIB).unwrap();
}

/// A resume that cannot make every handle of a device again (its memory taken by another
/// allocation while paused) undoes the ones it made: the process stays paused with all of
/// them evicted, and a resume once the memory is free brings every one back intact.
#[test]
fn a_resume_without_room_for_every_handle_leaves_them_all_evicted() {
    let _turn = setup();
    let drv = cudaw_engine::memory::driver().unwrap();
    let Two { va, a, b, pa, pb } = two_handles(3);
    ok(&pause(), "pause");

    // Another allocation takes all but 5 MiB: handle a (4 MiB) fits again, b (2 MiB) not.
    let (free, _) = drv.mem_get_info().unwrap();
    let hog = drv.mem_alloc(free - 5 * MIB).unwrap();
    let r = resume();
    assert!(r.error.is_some(), "a resume without room succeeded: {r:?}");
    assert!(
        state::is_paused(),
        "the failed resume left the process running"
    );
    let c = handles::counts(0);
    assert_eq!(
        (c.resident, c.evicted),
        (0, 6 * MIB),
        "the handle made before the failure was not undone"
    );

    drv.mem_free(hog).unwrap();
    ok(&resume(), "resume with room again");
    assert!(read(va, pa.len()) == pa, "handle a lost its bytes");
    assert!(
        read(va + 4 * MIB, pb.len()) == pb,
        "handle b lost its bytes"
    );

    assert_eq!(handles::unmap(va, (6 * MIB) as usize), 0);
    assert_eq!((handles::release(a), handles::release(b)), (0, 0));
    drv.mem_address_free(va, 8 * MIB).unwrap();
}
