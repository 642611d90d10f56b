//! simgpu as a machine of several devices, through its exported driver and runtime
//! functions. The machine is read from the environment once per process (at `cuInit`), so
//! every case runs in a child process of this test binary with its own variables
//! (`SIMGPU_DEVICES`, `SIMGPU_MEM`, `CUDA_VISIBLE_DEVICES`).

use std::ffi::{c_char, c_int, c_void};
use std::process::{Command, Output};

use simgpu::config::{uuid_of, uuid_text};
use simgpu::driver_api::{self as d, Handle, MemAccessDesc, MemAllocationProp, MemLocation};
use simgpu::runtime::Dim3;
use simgpu::runtime_api as rt;

const ROLE: &str = "SIMGPU_DEVICES_TEST_ROLE";
const MIB: usize = 1 << 20;
const INVALID_VALUE: u32 = 1;
const NO_DEVICE: u32 = 100;
const INVALID_DEVICE: u32 = 101;
const INVALID_CONTEXT: u32 = 201;
const INVALID_HANDLE: u32 = 400;
const ALREADY_ENABLED: u32 = 704;
const NOT_ENABLED: u32 = 705;
const ILLEGAL_ADDRESS: u32 = 700;

/// Runs this binary's `child` test as `role` with `env` (and without the variables the
/// parent's environment may carry).
fn run_child(role: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env_remove("SIMGPU_DEVICES")
        .env_remove("SIMGPU_MEM")
        .env_remove("CUDA_VISIBLE_DEVICES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the child")
}

/// Runs `role` and asserts it passed (its last line says `passed ROLE`).
fn child_passes(role: &str, env: &[(&str, &str)]) -> Output {
    let out = run_child(role, env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("passed {role}")),
        "child {role} with {env:?} failed ({}):\n--- stdout\n{stdout}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "count" => count(),
        "visible" => visible(),
        "no_device" => no_device(),
        "bad_count" => bad_count(),
        "memory" => memory(),
        "peers" => peers(),
        "kernel_without_peer_access" => kernel_access(false),
        "kernel_with_peer_access" => kernel_access(true),
        "vmm_rights" => vmm_rights(),
        other => panic!("unknown role {other}"),
    }
    println!("passed {role}");
}

#[track_caller]
fn ok(code: u32) {
    assert_eq!(code, 0, "expected success");
}

fn init() {
    // SAFETY: no pointers.
    ok(unsafe { d::cuInit(0) });
}

fn count_devices() -> c_int {
    let mut n = -1;
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuDeviceGetCount(&mut n) });
    n
}

fn uuid(dev: c_int) -> [u8; 16] {
    let mut u = [0u8; 16];
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuDeviceGetUuid_v2(&mut u, dev) });
    u
}

fn name(dev: c_int) -> String {
    let mut buf = [0 as c_char; 64];
    // SAFETY: a buffer of the length given.
    ok(unsafe { d::cuDeviceGetName(buf.as_mut_ptr(), 64, dev) });
    // SAFETY: cuDeviceGetName wrote a NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn total(dev: c_int) -> usize {
    let mut t = 0;
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuDeviceTotalMem_v2(&mut t, dev) });
    t
}

fn primary(dev: c_int) -> Handle {
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuDevicePrimaryCtxRetain(&mut ctx, dev) });
    ctx
}

fn set_current(ctx: Handle) {
    // SAFETY: a context handle from simgpu.
    ok(unsafe { d::cuCtxSetCurrent(ctx) });
}

fn mem_info() -> (usize, usize) {
    let (mut f, mut t) = (0, 0);
    // SAFETY: valid out-pointers.
    ok(unsafe { d::cuMemGetInfo_v2(&mut f, &mut t) });
    (f, t)
}

fn prop(dev: c_int) -> MemAllocationProp {
    MemAllocationProp {
        type_: 1,
        requested_handle_types: 0,
        location: MemLocation { type_: 1, id: dev },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

fn count() {
    init();
    assert_eq!(count_devices(), 3);
    let uuids: Vec<[u8; 16]> = (0..3).map(uuid).collect();
    assert_eq!(uuids, [uuid_of(0), uuid_of(1), uuid_of(2)]);
    assert_eq!(name(2), "simgpu (simulated H100) #2");
    let mut bus = [0 as c_char; 32];
    // SAFETY: a buffer of the length given.
    ok(unsafe { d::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, 1) });
    let mut found = -1;
    // SAFETY: a valid out-pointer and the NUL-terminated id just written.
    ok(unsafe { d::cuDeviceGetByPCIBusId(&mut found, bus.as_ptr()) });
    assert_eq!(found, 1);
    let mut dev = -1;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(d::cuDeviceGet(&mut dev, 3), INVALID_DEVICE);
        assert_eq!(d::cuDeviceGet(&mut dev, -1), INVALID_DEVICE);
        ok(d::cuDeviceGet(&mut dev, 2));
    }
    assert_eq!(dev, 2);
    // Each device's primary context is its own; switching makes calls act on its device.
    let contexts: Vec<Handle> = (0..3).map(primary).collect();
    assert!(contexts[0] != contexts[1] && contexts[1] != contexts[2]);
    for (i, &ctx) in contexts.iter().enumerate() {
        set_current(ctx);
        let mut cur = -1;
        // SAFETY: a valid out-pointer.
        ok(unsafe { d::cuCtxGetDevice(&mut cur) });
        assert_eq!(cur, i as c_int);
    }
    // SAFETY: a made-up handle and valid out-pointers.
    unsafe {
        assert_eq!(d::cuCtxSetCurrent(0x1234 as Handle), INVALID_CONTEXT);
        let mut ctx: Handle = std::ptr::null_mut();
        ok(d::cuCtxPushCurrent_v2(contexts[0]));
        ok(d::cuCtxGetCurrent(&mut ctx));
        assert_eq!(ctx, contexts[0]);
        ok(d::cuCtxPopCurrent_v2(&mut ctx));
        assert_eq!(ctx, contexts[0]);
        ok(d::cuCtxGetCurrent(&mut ctx));
        assert_eq!(ctx, contexts[2], "the pushed-over context is current again");
    }
}

fn visible() {
    // CUDA_VISIBLE_DEVICES=2,0 of three devices, with 3 sizes.
    init();
    assert_eq!(count_devices(), 2);
    assert_eq!(uuid(0), uuid_of(2));
    assert_eq!(uuid(1), uuid_of(0));
    assert_eq!(name(0), "simgpu (simulated H100) #2");
    assert_eq!(total(0), 256 * MIB);
    assert_eq!(total(1), 1024 * MIB);
    let mut dev = -1;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { d::cuDeviceGet(&mut dev, 2) }, INVALID_DEVICE);
    // The runtime sees the same.
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    ok(unsafe { rt::cudaGetDeviceCount(&mut n) });
    assert_eq!(n, 2);
}

fn no_device() {
    // SAFETY: no pointers; then a valid out-pointer.
    unsafe {
        assert_eq!(d::cuInit(0), NO_DEVICE);
        let mut n = -1;
        assert_eq!(d::cuDeviceGetCount(&mut n), NO_DEVICE);
        assert_eq!(n, 0);
        n = -1;
        assert_eq!(rt::cudaGetDeviceCount(&mut n), 100);
        assert_eq!(n, 0);
    }
}

fn bad_count() {
    // SAFETY: no pointers.
    unsafe {
        assert_eq!(d::cuInit(0), INVALID_VALUE);
        assert_eq!(d::cuInit(0), INVALID_VALUE, "the failure stays");
    }
}

fn memory() {
    // Two devices of 1 GiB and 512 MiB.
    init();
    let (c0, c1) = (primary(0), primary(1));
    set_current(c0);
    assert_eq!(mem_info(), (1024 * MIB, 1024 * MIB));
    set_current(c1);
    assert_eq!(mem_info(), (512 * MIB, 512 * MIB));
    let mut p1 = 0u64;
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuMemAlloc_v2(&mut p1, 64 * MIB) });
    assert_eq!(mem_info().0, 448 * MIB);
    set_current(c0);
    assert_eq!(mem_info().0, 1024 * MIB, "device 0 is untouched");
    // cuMemCreate on device 1 from device 0's context: device 1's memory.
    let mut h = 0u64;
    // SAFETY: valid out-pointers and properties.
    unsafe {
        ok(d::cuMemCreate(&mut h, 2 * MIB, &prop(1), 0));
        assert_eq!(d::cuMemCreate(&mut h, 2 * MIB, &prop(2), 0), INVALID_DEVICE);
        assert_eq!(
            d::cuMemCreate(&mut h, 2 * MIB, &prop(-1), 0),
            INVALID_DEVICE
        );
        let mut g = 0usize;
        assert_eq!(
            d::cuMemGetAllocationGranularity(&mut g, &prop(7), 0),
            INVALID_DEVICE
        );
    }
    assert_eq!(mem_info().0, 1024 * MIB);
    set_current(c1);
    assert_eq!(mem_info().0, 446 * MIB);
    // SAFETY: handles from simgpu.
    unsafe {
        ok(d::cuMemFree_v2(p1));
    }
    assert_eq!(mem_info().0, 510 * MIB);
    // The runtime's cudaMalloc lands on the current device (cudaSetDevice).
    ok(rt::cudaSetDevice(0));
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    ok(unsafe { rt::cudaMalloc(&mut p, 32 * MIB) });
    let (mut f, mut t) = (0, 0);
    // SAFETY: valid out-pointers.
    ok(unsafe { rt::cudaMemGetInfo(&mut f, &mut t) });
    assert_eq!((f, t), (992 * MIB, 1024 * MIB));
    assert_eq!(rt::cudaSetDevice(2), 101);
}

fn peers() {
    init();
    let (c0, c1) = (primary(0), primary(1));
    let mut can = -1;
    // SAFETY: valid out-pointers throughout.
    unsafe {
        ok(d::cuDeviceCanAccessPeer(&mut can, 0, 1));
        assert_eq!(can, 1);
        ok(d::cuDeviceCanAccessPeer(&mut can, 1, 1));
        assert_eq!(can, 0);
        assert_eq!(d::cuDeviceCanAccessPeer(&mut can, 0, 2), INVALID_DEVICE);
        let mut v = -1;
        ok(d::cuDeviceGetP2PAttribute(&mut v, 2, 0, 1));
        assert_eq!(v, 1);
        assert_eq!(d::cuDeviceGetP2PAttribute(&mut v, 2, 1, 1), INVALID_DEVICE);
        assert_eq!(d::cuDeviceGetP2PAttribute(&mut v, 99, 0, 1), INVALID_VALUE);

        assert_eq!(
            d::cuCtxEnablePeerAccess(c1, 0),
            INVALID_CONTEXT,
            "no context"
        );
        set_current(c0);
        assert_eq!(d::cuCtxEnablePeerAccess(c0, 0), INVALID_DEVICE, "itself");
        assert_eq!(d::cuCtxEnablePeerAccess(c1, 1), INVALID_VALUE, "flags");
        assert_eq!(d::cuCtxEnablePeerAccess(0x40 as Handle, 0), INVALID_CONTEXT);
        ok(d::cuCtxEnablePeerAccess(c1, 0));
        assert_eq!(d::cuCtxEnablePeerAccess(c1, 0), ALREADY_ENABLED);
        ok(d::cuCtxDisablePeerAccess(c1));
        assert_eq!(d::cuCtxDisablePeerAccess(c1), NOT_ENABLED);
        assert_eq!(d::cuCtxDisablePeerAccess(c0), INVALID_DEVICE);

        // The runtime's forms.
        ok(rt::cudaSetDevice(1));
        assert_eq!(rt::cudaDeviceEnablePeerAccess(1, 0), 101);
        assert_eq!(rt::cudaDeviceEnablePeerAccess(5, 0), 101);
        ok(rt::cudaDeviceEnablePeerAccess(0, 0));
        assert_eq!(rt::cudaDeviceEnablePeerAccess(0, 0), 704);
        ok(rt::cudaDeviceDisablePeerAccess(0));
        assert_eq!(rt::cudaDeviceDisablePeerAccess(0), 705);
        ok(rt::cudaDeviceCanAccessPeer(&mut can, 1, 0));
        assert_eq!(can, 1);

        // Peer copies move bytes between the devices' memory, without peer access.
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut a, mut b) = (0u64, 0u64);
        set_current(c0);
        ok(d::cuMemAlloc_v2(&mut a, 4096));
        ok(d::cuMemcpyHtoD_v2(a, pattern.as_ptr().cast(), 4096));
        set_current(c1);
        ok(d::cuMemAlloc_v2(&mut b, 4096));
        ok(d::cuMemcpyPeer(b, c1, a, c0, 4096));
        let mut back = vec![0u8; 4096];
        ok(d::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), b, 4096));
        assert_eq!(back, pattern);
        // A context that is not the memory's device, or host memory, is refused.
        assert_eq!(d::cuMemcpyPeer(b, c0, a, c0, 4096), INVALID_VALUE);
        assert_eq!(
            d::cuMemcpyPeer(back.as_mut_ptr() as u64, c1, a, c0, 16),
            INVALID_VALUE
        );
        ok(d::cuMemsetD8_v2(b, 0, 4096));
        let mut stream: Handle = std::ptr::null_mut();
        ok(d::cuStreamCreate(&mut stream, 0));
        ok(d::cuMemcpyPeerAsync(b, c1, a, c0, 4096, stream));
        ok(d::cuStreamSynchronize(stream));
        ok(rt::cudaMemcpyPeer(
            a as *mut c_void,
            0,
            b as *const c_void,
            1,
            4096,
        ));
        ok(d::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), b, 4096));
        assert_eq!(back, pattern);
        // An event records on its own device's streams only.
        let mut event: Handle = std::ptr::null_mut();
        ok(d::cuEventCreate(&mut event, 0));
        ok(d::cuEventRecord(event, stream));
        set_current(c0);
        let mut other: Handle = std::ptr::null_mut();
        ok(d::cuStreamCreate(&mut other, 0));
        assert_eq!(d::cuEventRecord(event, other), INVALID_HANDLE);
        ok(d::cuEventSynchronize(event));
        ok(d::cuStreamSynchronize(stream));
    }
}

/// Registers kernel `name` under a fresh fake host stub; returns the stub.
fn register(name: &std::ffi::CStr, stub: usize) -> *const c_void {
    let handle = rt::__cudaRegisterFatBinary(std::ptr::null_mut());
    // SAFETY: a static NUL-terminated name; the other pointers are unused.
    unsafe {
        rt::__cudaRegisterFunction(
            handle,
            stub as *const c_char,
            std::ptr::null_mut(),
            name.as_ptr(),
            -1,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    rt::__cudaRegisterFatBinaryEnd(handle);
    stub as *const c_void
}

/// Launches `add_into(a, acc, n)` (`acc[i] += a[i]`) on the current device's NULL stream.
fn launch_add_into(stub: *const c_void, a: u64, acc: u64, n: c_int) -> u32 {
    let mut args = [
        (&a) as *const u64 as *mut c_void,
        (&acc) as *const u64 as *mut c_void,
        (&n) as *const c_int as *mut c_void,
    ];
    // SAFETY: the kernel's three arguments, alive during the call.
    unsafe {
        rt::cudaLaunchKernel(
            stub,
            Dim3::x(4),
            Dim3::x(256),
            args.as_mut_ptr(),
            0,
            std::ptr::null_mut(),
        )
    }
}

fn to_device(values: &[i32]) -> u64 {
    let mut p: *mut c_void = std::ptr::null_mut();
    let bytes = std::mem::size_of_val(values);
    // SAFETY: a valid out-pointer and a host buffer of `bytes` bytes.
    unsafe {
        ok(rt::cudaMalloc(&mut p, bytes));
        ok(rt::cudaMemcpy(p, values.as_ptr().cast(), bytes, 1));
    }
    p as u64
}

fn from_device(p: u64, n: usize) -> Vec<i32> {
    let mut out = vec![0i32; n];
    // SAFETY: a host buffer of n ints.
    ok(unsafe { rt::cudaMemcpy(out.as_mut_ptr().cast(), p as *const c_void, n * 4, 2) });
    out
}

/// A kernel on device 1 adds device 0's `cudaMalloc` buffer into its own: with peer
/// access it runs; without, it faults with an illegal address, device 1's context stays
/// broken, and device 0's is untouched.
fn kernel_access(enable: bool) {
    let stub = register(c"_Z8add_intoPKiPii", 0x5010);
    let n = 1000usize;
    let a: Vec<i32> = (0..n as i32).collect();
    ok(rt::cudaSetDevice(0));
    let on0 = to_device(&a);
    ok(rt::cudaSetDevice(1));
    let on1 = to_device(&vec![5; n]);
    if enable {
        ok(rt::cudaDeviceEnablePeerAccess(0, 0));
    }
    ok(launch_add_into(stub, on0, on1, n as c_int));
    let sync = rt::cudaDeviceSynchronize();
    if enable {
        ok(sync);
        let sum = from_device(on1, n);
        assert!(sum.iter().enumerate().all(|(i, &v)| v == i as i32 + 5));
        // Its own memory needs no peer access: device 0 adds device 0's buffer.
        ok(rt::cudaSetDevice(0));
        ok(launch_add_into(stub, on0, on0, n as c_int));
        ok(rt::cudaDeviceSynchronize());
        assert_eq!(from_device(on0, 3), [0, 2, 4]);
        // Peer access is one way: device 0 cannot reach device 1's buffer.
        ok(launch_add_into(stub, on1, on0, n as c_int));
        assert_eq!(rt::cudaDeviceSynchronize(), ILLEGAL_ADDRESS);
    } else {
        assert_eq!(sync, ILLEGAL_ADDRESS);
        assert_eq!(
            rt::cudaGetLastError(),
            ILLEGAL_ADDRESS,
            "sticky on device 1"
        );
        ok(rt::cudaSetDevice(0));
        ok(rt::cudaDeviceSynchronize());
        assert_eq!(from_device(on0, 3), [0, 1, 2], "device 0 works on");
    }
}

/// VMM memory on device 0, mapped with access for devices 0 and 1: a kernel on device 1
/// reads it; once `cuMemSetAccess` takes device 1's right away, the same kernel faults,
/// and peer access does not stand in for the right.
fn vmm_rights() {
    let stub = register(c"_Z8add_intoPKiPii", 0x5020);
    let n = 1000usize;
    ok(rt::cudaSetDevice(0));
    let size = 2 * MIB;
    let (mut base, mut h) = (0u64, 0u64);
    let desc = |dev: c_int, flags: u32| MemAccessDesc {
        location: MemLocation { type_: 1, id: dev },
        flags,
    };
    let access_of = |base: u64, dev: c_int| {
        let mut flags = 9u64;
        let loc = MemLocation { type_: 1, id: dev };
        // SAFETY: valid pointers.
        ok(unsafe { d::cuMemGetAccess(&mut flags, &loc, base) });
        flags
    };
    let a: Vec<i32> = (0..n as i32).collect();
    // SAFETY: valid out-pointers, properties and descriptors.
    unsafe {
        ok(d::cuMemAddressReserve(&mut base, size, 0, 0, 0));
        ok(d::cuMemCreate(&mut h, size, &prop(0), 0));
        ok(d::cuMemMap(base, size, 0, h, 0));
        let both = [desc(0, 3), desc(1, 3)];
        ok(d::cuMemSetAccess(base, size, both.as_ptr(), 2));
        ok(d::cuMemcpyHtoD_v2(base, a.as_ptr().cast(), n * 4));
        assert_eq!(
            d::cuMemSetAccess(base, size, &desc(2, 3), 1),
            INVALID_DEVICE
        );
    }
    assert_eq!((access_of(base, 0), access_of(base, 1)), (3, 3));
    ok(rt::cudaSetDevice(1));
    let acc = to_device(&vec![1; n]);
    ok(launch_add_into(stub, base, acc, n as c_int));
    ok(rt::cudaDeviceSynchronize());
    assert_eq!(from_device(acc, 3), [1, 2, 3]);
    // Device 1 loses its right; device 0 keeps its own.
    // SAFETY: a valid descriptor.
    ok(unsafe { d::cuMemSetAccess(base, size, &desc(1, 0), 1) });
    assert_eq!((access_of(base, 0), access_of(base, 1)), (3, 0));
    ok(rt::cudaDeviceEnablePeerAccess(0, 0));
    ok(launch_add_into(stub, base, acc, n as c_int));
    assert_eq!(rt::cudaDeviceSynchronize(), ILLEGAL_ADDRESS);
    // Device 0 still reads it.
    ok(rt::cudaSetDevice(0));
    let own = to_device(&vec![2; n]);
    ok(launch_add_into(stub, base, own, n as c_int));
    ok(rt::cudaDeviceSynchronize());
    assert_eq!(from_device(own, 3), [2, 3, 4]);
}

#[test]
fn device_count_and_identity() {
    child_passes("count", &[("SIMGPU_DEVICES", "3")]);
}

#[test]
fn visible_devices_renumber_and_keep_identity() {
    child_passes(
        "visible",
        &[
            ("SIMGPU_DEVICES", "3"),
            ("SIMGPU_MEM", "1G,2G,256M"),
            ("CUDA_VISIBLE_DEVICES", "2,0"),
        ],
    );
    // By UUID prefix too.
    let prefix = &uuid_text(&uuid_of(2))[..12];
    child_passes(
        "visible",
        &[
            ("SIMGPU_DEVICES", "3"),
            ("SIMGPU_MEM", "1G,2G,256M"),
            ("CUDA_VISIBLE_DEVICES", &format!("{prefix},0,9,1")),
        ],
    );
}

#[test]
fn no_visible_device_is_no_device() {
    child_passes(
        "no_device",
        &[("SIMGPU_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", "")],
    );
    child_passes(
        "no_device",
        &[("SIMGPU_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", "7")],
    );
    let out = child_passes("no_device", &[("SIMGPU_DEVICES", "0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SIMGPU_DEVICES=0: a machine without GPUs"),
        "{stderr}"
    );
}

#[test]
fn a_broken_device_count_fails_cu_init_saying_why() {
    for bad in ["two", "-1", "65"] {
        let out = child_passes("bad_count", &[("SIMGPU_DEVICES", bad)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "simgpu: SIMGPU_DEVICES={bad:?} is not a device count (a whole number from 0 \
                 to 64); cuInit fails with CUDA_ERROR_INVALID_VALUE"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn each_device_has_its_own_memory() {
    child_passes(
        "memory",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G,512M")],
    );
}

#[test]
fn peer_access_errors_and_peer_copies_are_the_drivers() {
    child_passes("peers", &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G")]);
}

#[test]
fn a_kernel_reaches_another_devices_memory_only_with_peer_access() {
    let out = child_passes(
        "kernel_without_peer_access",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("on device 1 reaches device 0's memory without access"),
        "{stderr}"
    );
    child_passes(
        "kernel_with_peer_access",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G")],
    );
}

#[test]
fn vmm_memory_is_reached_by_the_devices_granted_access() {
    child_passes(
        "vmm_rights",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G")],
    );
}
