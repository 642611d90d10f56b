//! The driver layer's real backend (`LibCuda`) on simgpu: the simulated device is loaded
//! from the `libsimgpu.so` cargo builds next to this test (simgpu is a dev-dependency).
//!
//! Tests that must die (a fault) or need their own device configuration run in a child
//! process: this binary re-executed with `CUDAW_TEST_CHILD` naming the role.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};

use driver::api::{pinned_device_prop, read_write_access};
use driver::error::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};
use driver::{sys, Driver, DriverBackend, LibCuda, Stream};
use vmm::Backend;

mod common;
use common::simgpu_path;

const MIB: u64 = 1 << 20;
const CHILD_ENV: &str = "CUDAW_TEST_CHILD";

/// The driver shared by this process's tests, initialised, primary context retained.
fn shared() -> &'static (Arc<LibCuda>, DriverBackend) {
    static SHARED: OnceLock<(Arc<LibCuda>, DriverBackend)> = OnceLock::new();
    SHARED.get_or_init(|| {
        let lib = Arc::new(LibCuda::open_path(simgpu_path().to_str().unwrap()).unwrap());
        let backend = DriverBackend::new(lib.clone(), 0).unwrap();
        (lib, backend)
    })
}

/// The driver, with the primary context current on the calling thread.
fn cuda() -> &'static LibCuda {
    let (lib, backend) = shared();
    backend.make_current().unwrap();
    lib
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn run_child(role: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env("CUDAW_LIBCUDA", simgpu_path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the child")
}

/// Maps `size` bytes of fresh physical memory at `addr` with read/write access.
fn map_rw(cuda: &dyn Driver, addr: u64, size: u64) -> driver::PhysicalHandle {
    let h = cuda.mem_create(size, &pinned_device_prop(0)).unwrap();
    cuda.mem_map(addr, size, h).unwrap();
    cuda.mem_set_access(addr, size, &[read_write_access(0)])
        .unwrap();
    h
}

#[test]
fn child_entry() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    // The child loads the driver the way cudaw does: from CUDAW_LIBCUDA.
    let cuda: Arc<dyn Driver> = Arc::new(LibCuda::open().unwrap());
    let backend = DriverBackend::new(cuda.clone(), 0).unwrap();
    match role.as_str() {
        "touch_unmapped" | "touch_mapped" => {
            let g = backend.granularity().unwrap();
            let base = backend.reserve(4 * g, 0).unwrap();
            let h = backend.create_physical(g).unwrap();
            backend.map(base + g, g, h).unwrap();
            backend.copy_from_host(base + g, &[42; 64]).unwrap();
            // SAFETY: mapped read/write above (simgpu device memory is host memory).
            let before = unsafe { std::ptr::read_volatile((base + g) as *const u8) };
            assert_eq!(before, 42);
            if role == "touch_unmapped" {
                backend.unmap(base + g, g).unwrap();
            }
            println!("about to touch {:#x}", base + g);
            // SAFETY: deliberately not: after the unmap this must fault, killing us.
            let v = unsafe { std::ptr::read_volatile((base + g) as *const u8) };
            println!("touched, read {v}");
        }
        "memory_limit" => {
            let (free, total) = cuda.mem_get_info().unwrap();
            assert_eq!((free, total), (64 * MIB, 64 * MIB));
            assert_eq!(cuda.device_total_mem(0).unwrap(), 64 * MIB);
            let a = backend.create_physical(60 * MIB).unwrap();
            let e = backend.create_physical(6 * MIB).unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
            let e = cuda.mem_alloc(8 * MIB).unwrap_err();
            assert_eq!((e.code, e.name.as_str()), (2, "CUDA_ERROR_OUT_OF_MEMORY"));
            backend.release_physical(a).unwrap();
            let b = backend.create_physical(64 * MIB).unwrap();
            backend.release_physical(b).unwrap();
            println!("memory limit ok");
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn init_version_and_attributes() {
    let cuda = cuda();
    assert_eq!(cuda.driver_version().unwrap(), 13000);
    assert_eq!(cuda.device_count().unwrap(), 1);
    let dev = cuda.device_get(0).unwrap();
    assert_eq!(cuda.device_name(dev).unwrap(), "simgpu (simulated H100) #0");
    use sys::CUdevice_attribute as A;
    let attr = |a| cuda.device_attribute(dev, a).unwrap();
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), 9);
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), 0);
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 132);
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
    assert_eq!(
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
        1
    );
    let total = cuda.device_total_mem(dev).unwrap();
    assert_eq!(cuda.mem_get_info().unwrap().1, total);
    let g = cuda
        .mem_allocation_granularity(
            &pinned_device_prop(dev),
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
        .unwrap();
    assert_eq!(g, 2 * MIB);
    assert_eq!(
        cuda.error_name(2).as_deref(),
        Some("CUDA_ERROR_OUT_OF_MEMORY")
    );
    assert_eq!(
        cuda.error_name(400).as_deref(),
        Some("CUDA_ERROR_INVALID_HANDLE")
    );
    let e = cuda.device_get(3).unwrap_err();
    assert_eq!(
        (e.code, e.name.as_str(), e.call),
        (101, "CUDA_ERROR_INVALID_DEVICE", "cuDeviceGet")
    );
}

#[test]
fn calls_without_a_current_context_fail_like_the_driver() {
    let cuda = cuda();
    std::thread::scope(|s| {
        s.spawn(|| {
            let e = cuda.mem_alloc(4096).unwrap_err();
            assert_eq!(
                (e.code, e.name.as_str()),
                (201, "CUDA_ERROR_INVALID_CONTEXT")
            );
        });
    });
}

#[test]
fn reserve_create_map_copy_unmap_remap() {
    let cuda = cuda();
    let g = 2 * MIB;
    let base = cuda.mem_address_reserve(8 * g, 0, 0).unwrap();
    let addr = base + 2 * g;
    let h = map_rw(cuda, addr, 2 * g);
    let data = pattern((2 * g) as usize, 7);
    cuda.memcpy_htod(addr, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    cuda.memcpy_dtoh(&mut back, addr).unwrap();
    assert!(back == data);

    // Driver validation: mapping outside the reservation, double map, copies to
    // unmapped device memory.
    let h2 = cuda.mem_create(g, &pinned_device_prop(0)).unwrap();
    let e = cuda.mem_map(base + 8 * g, g, h2).unwrap_err();
    assert_eq!((e.code, e.call), (CUDA_ERROR_INVALID_VALUE, "cuMemMap"));
    assert_eq!(
        cuda.mem_map(addr, g, h2).unwrap_err().code,
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        cuda.memcpy_htod(base, &[1, 2, 3]).unwrap_err().code,
        CUDA_ERROR_INVALID_VALUE
    );
    cuda.mem_release(h2).unwrap();

    // Unmap, release, re-create and re-map at the same address: the old contents are
    // gone, new contents read back.
    cuda.mem_unmap(addr, 2 * g).unwrap();
    cuda.mem_release(h).unwrap();
    assert_eq!(
        cuda.memcpy_dtoh(&mut back, addr).unwrap_err().code,
        CUDA_ERROR_INVALID_VALUE
    );
    let h = map_rw(cuda, addr, 2 * g);
    let data2 = pattern((2 * g) as usize, 99);
    cuda.memcpy_htod(addr, &data2).unwrap();
    cuda.memcpy_dtoh(&mut back, addr).unwrap();
    assert!(back == data2);

    // A second mapping of the same physical memory shares its bytes.
    let other = cuda.mem_address_reserve(2 * g, 0, 0).unwrap();
    cuda.mem_map(other, 2 * g, h).unwrap();
    cuda.mem_set_access(other, 2 * g, &[read_write_access(0)])
        .unwrap();
    let mut shared = vec![0u8; 4096];
    cuda.memcpy_dtoh(&mut shared, other + 4096).unwrap();
    assert_eq!(shared, data2[4096..8192]);

    // Release while mapped is deferred to the last unmap, as in the driver.
    cuda.mem_release(h).unwrap();
    cuda.mem_unmap(other, 2 * g).unwrap();
    cuda.mem_unmap(addr, 2 * g).unwrap();
    cuda.mem_address_free(other, 2 * g).unwrap();
    cuda.mem_address_free(base, 8 * g).unwrap();
}

#[test]
fn touching_unmapped_memory_faults() {
    let out = run_child("touch_unmapped", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("about to touch"),
        "child did not get to the touch: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("touched, read"), "{stdout}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "child status {:?}",
        out.status
    );

    // The control: the same child without the unmap exits normally.
    let out = run_child("touch_mapped", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("touched, read 42"));
}

#[test]
fn out_of_memory_beyond_simgpu_mem() {
    let out = run_child("memory_limit", &[("SIMGPU_MEM", "64M")]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("memory limit ok"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // In this process (default 16 GiB): one creation beyond the total fails too.
    let cuda = cuda();
    let total = cuda.mem_get_info().unwrap().1;
    let e = cuda
        .mem_create(total + 2 * MIB, &pinned_device_prop(0))
        .unwrap_err();
    assert_eq!(
        (e.code, e.name.as_str(), e.call),
        (
            CUDA_ERROR_OUT_OF_MEMORY,
            "CUDA_ERROR_OUT_OF_MEMORY",
            "cuMemCreate"
        )
    );
}

#[test]
fn async_copies_on_two_streams_with_events() {
    let cuda = cuda();
    let len = 64 * MIB as usize;
    let (x, y) = (
        cuda.mem_alloc(len as u64).unwrap(),
        cuda.mem_alloc(len as u64).unwrap(),
    );
    let pinned = cuda.mem_host_alloc(2 * len, 0).unwrap();
    // SAFETY: `pinned` holds 2 * len bytes until freed below; only this test uses it.
    let host = unsafe { std::slice::from_raw_parts_mut(pinned, 2 * len) };
    host[..len].copy_from_slice(&pattern(len, 1));
    host[len..].copy_from_slice(&pattern(len, 2));

    let s1 = cuda.stream_create(0).unwrap();
    let s2 = cuda.stream_create(0).unwrap();
    let (start, end) = (cuda.event_create(0).unwrap(), cuda.event_create(0).unwrap());
    cuda.event_record(start, s1).unwrap();
    // SAFETY: the host range outlives the copies (synchronised below before freeing).
    unsafe {
        for _ in 0..4 {
            cuda.memcpy_htod_async(x, host.as_ptr(), len, s1).unwrap();
        }
        cuda.memcpy_htod_async(y, host.as_ptr().add(len), len, s2)
            .unwrap();
    }
    cuda.memset_d8_async(y, 0xAB, 16, s2).unwrap();
    cuda.event_record(end, s1).unwrap();
    // The copies are asynchronous: 256 MiB have not been copied yet.
    assert!(
        !cuda.event_query(end).unwrap(),
        "async copies completed before returning"
    );
    assert!(!cuda.stream_query(s1).unwrap());
    let e = cuda.event_elapsed_ms(start, end).unwrap_err();
    assert_eq!(e.name, "CUDA_ERROR_NOT_READY");

    // Work on the NULL stream waits for both streams: this synchronous copy sees them.
    let mut back = vec![0u8; len];
    cuda.memcpy_dtoh(&mut back, y).unwrap();
    assert_eq!(&back[..16], &[0xAB; 16]);
    assert!(back[16..] == host[len + 16..]);
    assert!(cuda.event_query(end).unwrap());
    cuda.memcpy_dtoh(&mut back, x).unwrap();
    assert!(back[..] == host[..len]);

    cuda.event_synchronize(end).unwrap();
    let ms = cuda.event_elapsed_ms(start, end).unwrap();
    assert!(ms > 0.0 && ms < 60_000.0, "{ms} ms");
    // Ordering within a stream: a device-to-device copy after an upload sees it.
    cuda.memcpy_dtod_async(y, x, len, s2).unwrap();
    // SAFETY: as above.
    unsafe { cuda.memcpy_dtoh_async(pinned.add(len), y, len, s2) }.unwrap();
    cuda.stream_synchronize(s2).unwrap();
    assert!(host[len..] == host[..len]);
    assert!(cuda.stream_query(s2).unwrap());

    for s in [s1, s2] {
        cuda.stream_destroy(s).unwrap();
    }
    for e in [start, end] {
        cuda.event_destroy(e).unwrap();
    }
    assert_eq!(
        cuda.stream_destroy(s1).unwrap_err().name,
        "CUDA_ERROR_INVALID_HANDLE"
    );
    cuda.ctx_synchronize().unwrap();
    // SAFETY: all copies using it are done (synchronised above).
    unsafe { cuda.mem_free_host(pinned) }.unwrap();
    cuda.mem_free(x).unwrap();
    cuda.mem_free(y).unwrap();
}

#[test]
fn plain_allocations_for_translated_addressing() {
    let cuda = cuda();
    let p = cuda.mem_alloc(1000).unwrap();
    let q = cuda.mem_alloc(1000).unwrap();
    cuda.memset_d8(p, 0x5A, 1000).unwrap();
    cuda.memcpy_dtod(q, p, 1000).unwrap();
    let mut back = vec![0u8; 1000];
    cuda.memcpy_dtoh(&mut back, q).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A));
    cuda.memcpy_htod(p + 10, b"cudaw").unwrap();
    cuda.memcpy_dtoh(&mut back[..5], p + 10).unwrap();
    assert_eq!(&back[..5], b"cudaw");
    cuda.mem_free(p).unwrap();
    cuda.mem_free(q).unwrap();
    let e = cuda.mem_free(p).unwrap_err();
    assert_eq!((e.code, e.call), (CUDA_ERROR_INVALID_VALUE, "cuMemFree_v2"));

    // Registered host memory works for async copies.
    let mut buf = vec![0u8; 8192];
    // SAFETY: `buf` outlives the registration (unregistered below).
    unsafe { cuda.mem_host_register(buf.as_mut_ptr(), buf.len(), 0) }.unwrap();
    let d = cuda.mem_alloc(8192).unwrap();
    cuda.memset_d8(d, 3, 8192).unwrap();
    // SAFETY: synchronised before `buf` is read or dropped.
    unsafe { cuda.memcpy_dtoh_async(buf.as_mut_ptr(), d, 8192, Stream::NULL) }.unwrap();
    cuda.stream_synchronize(Stream::NULL).unwrap();
    assert!(buf.iter().all(|&b| b == 3));
    // SAFETY: registered above.
    unsafe { cuda.mem_host_unregister(buf.as_mut_ptr()) }.unwrap();
    cuda.mem_free(d).unwrap();
}

#[test]
fn backend_round_trip() {
    let (_, backend) = shared();
    let g = backend.granularity().unwrap();
    assert_eq!(g, 2 * MIB);
    let base = backend.reserve(16 * g, 0).unwrap();
    let (free_before, total) = backend.memory_info().unwrap();
    let p = backend.create_physical(2 * g).unwrap();
    let (free_after, _) = backend.memory_info().unwrap();
    assert!(
        free_after <= free_before - 2 * g,
        "{free_after} {free_before}"
    );
    assert!(total >= 2 * g);
    backend.map(base, 2 * g, p).unwrap();
    let data = pattern((2 * g) as usize, 5);
    backend.copy_from_host(base, &data).unwrap();
    let mut saved = vec![0u8; data.len()];
    backend.copy_to_host(&mut saved, base).unwrap();
    assert!(saved == data);
    // Evict and restore by hand, at the same address.
    backend.unmap(base, 2 * g).unwrap();
    backend.release_physical(p).unwrap();
    let p = backend.create_physical(2 * g).unwrap();
    backend.map(base, 2 * g, p).unwrap();
    backend.copy_from_host(base, &saved).unwrap();
    let mut back = vec![0u8; data.len()];
    backend.copy_to_host(&mut back, base).unwrap();
    assert!(back == data);
    assert!(backend.map(base + 16 * g, g, p).unwrap_err().code == CUDA_ERROR_INVALID_VALUE);
    backend.unmap(base, 2 * g).unwrap();
    backend.release_physical(p).unwrap();
    backend.free_reservation(base, 16 * g).unwrap();

    let l = backend.alloc_linear(12345).unwrap();
    backend.copy_from_host(l, &data[..12345]).unwrap();
    backend.copy_to_host(&mut back[..12345], l).unwrap();
    assert_eq!(back[..12345], data[..12345]);
    backend.free_linear(l).unwrap();
}
