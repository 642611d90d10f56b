//! Memory shared between processes through simgpu's exported driver functions, as NCCL
//! shares it between the ranks of a job: `cuMemCreate` with the POSIX file-descriptor
//! handle type, `cuMemExportToShareableHandle`, the descriptor passed over a Unix socket
//! (`SCM_RIGHTS`), `cuMemImportFromShareableHandle`, `cuMemMap` at another address.
//!
//! The machine is read from the environment once per process (at `cuInit`), so every case
//! runs in child processes of this test binary with their own variables. The two sides of
//! the cross-process case are two children whose standard inputs are the two ends of one
//! Unix socket pair.

mod common;
use common::Children;

use std::ffi::{c_int, c_void};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Output, Stdio};

use simgpu::driver_api::{self as d, Handle, MemAccessDesc, MemAllocationProp, MemLocation};

const ROLE: &str = "SIMGPU_SHAREABLE_TEST_ROLE";
const MIB: usize = 1 << 20;
const SIZE: usize = 4 * MIB;
const POSIX_FD: u32 = 1;
const INVALID_VALUE: u32 = 1;
const NOT_SUPPORTED: u32 = 801;

fn spawn_child(role: &str, env: &[(&str, &str)], stdin: Stdio) -> Child {
    common::spawn_child(ROLE, role, env, stdin)
}

fn assert_passed(role: &str, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("passed {role}")),
        "child {role} failed ({}):\n--- stdout\n{stdout}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "in_process" => in_process(),
        "exporter" => exporter(),
        "importer" => importer(),
        other => panic!("unknown role {other}"),
    }
    println!("passed {role}");
}

#[test]
fn export_import_and_errors_in_one_process() {
    let mut children = Children(vec![spawn_child(
        "in_process",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "64M")],
        Stdio::null(),
    )]);
    let out = children
        .0
        .pop()
        .expect("one child")
        .wait_with_output()
        .unwrap();
    assert_passed("in_process", &out);
}

#[test]
fn two_processes_share_the_bytes_through_a_passed_descriptor() {
    let (a, b) = UnixStream::pair().expect("a socket pair");
    let two = [("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "64M")];
    let mut children = Children(Vec::new());
    children.0.push(spawn_child(
        "exporter",
        &[two[0], two[1], ("CUDA_VISIBLE_DEVICES", "0")],
        Stdio::from(OwnedFd::from(a)),
    ));
    children.0.push(spawn_child(
        "importer",
        &[two[0], two[1], ("CUDA_VISIBLE_DEVICES", "1")],
        Stdio::from(OwnedFd::from(b)),
    ));
    // Each side exits once done or when the other goes (end of the socket).
    let importer = children.0.pop().unwrap().wait_with_output().unwrap();
    let exporter = children.0.pop().unwrap().wait_with_output().unwrap();
    assert_passed("exporter", &exporter);
    assert_passed("importer", &importer);
}

#[track_caller]
fn ok(code: u32) {
    assert_eq!(code, 0, "expected success");
}

fn init_device(dev: c_int) {
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointers and a context handle from simgpu.
    unsafe {
        ok(d::cuInit(0));
        ok(d::cuDevicePrimaryCtxRetain(&mut ctx, dev));
        ok(d::cuCtxSetCurrent(ctx));
    }
}

fn used() -> usize {
    let (mut f, mut t) = (0, 0);
    // SAFETY: valid out-pointers.
    ok(unsafe { d::cuMemGetInfo_v2(&mut f, &mut t) });
    t - f
}

fn prop(dev: c_int, handle_types: u32) -> MemAllocationProp {
    MemAllocationProp {
        type_: 1,
        requested_handle_types: handle_types,
        location: MemLocation { type_: 1, id: dev },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

fn create(dev: c_int, handle_types: u32) -> u64 {
    let mut h = 0;
    // SAFETY: valid pointers.
    ok(unsafe { d::cuMemCreate(&mut h, SIZE, &prop(dev, handle_types), 0) });
    h
}

fn export(h: u64) -> c_int {
    let mut fd: c_int = -1;
    // SAFETY: an int out-pointer, as the POSIX handle type takes.
    ok(unsafe { d::cuMemExportToShareableHandle((&mut fd as *mut c_int).cast(), h, POSIX_FD, 0) });
    assert!(fd >= 0);
    fd
}

fn import(fd: c_int) -> u64 {
    let mut h = 0;
    // SAFETY: a valid out-pointer; the descriptor travels as the pointer's value.
    ok(unsafe { d::cuMemImportFromShareableHandle(&mut h, fd as usize as *mut c_void, POSIX_FD) });
    h
}

/// Reserves, maps `h` and gives device `dev` read-write access; returns the address.
fn map(h: u64, dev: c_int) -> u64 {
    let mut va = 0;
    let desc = MemAccessDesc {
        location: MemLocation { type_: 1, id: dev },
        flags: 3,
    };
    // SAFETY: valid pointers, simgpu's handle.
    unsafe {
        ok(d::cuMemAddressReserve(&mut va, SIZE, 0, 0, 0));
        ok(d::cuMemMap(va, SIZE, 0, h, 0));
        ok(d::cuMemSetAccess(va, SIZE, &desc, 1));
    }
    va
}

fn unmap(va: u64) {
    // SAFETY: a range this test mapped; nothing references it.
    unsafe {
        ok(d::cuMemUnmap(va, SIZE));
        ok(d::cuMemAddressFree(va, SIZE));
    }
}

fn props_of(h: u64) -> MemAllocationProp {
    let mut p = prop(-1, 99);
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuMemGetAllocationPropertiesFromHandle(&mut p, h) });
    p
}

fn put(va: u64, at: usize, bytes: &[u8]) {
    // SAFETY: simgpu's device memory is host memory; the range is mapped read-write.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (va as usize + at) as *mut u8, bytes.len())
    };
}

fn get(va: u64, at: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    // SAFETY: as in `put`, readable.
    unsafe {
        std::ptr::copy_nonoverlapping((va as usize + at) as *const u8, out.as_mut_ptr(), len)
    };
    out
}

fn close(fd: c_int) {
    // SAFETY: a descriptor this process owns (from an export or a receive).
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
}

fn in_process() {
    init_device(0);
    let before = used();
    let plain = create(0, 0);
    let shared = create(1, POSIX_FD);
    // Device 1's memory, not device 0's.
    assert_eq!(used(), before + SIZE);
    let mut fd: c_int = -1;
    let out = (&mut fd as *mut c_int).cast::<c_void>();
    // SAFETY: valid out-pointers throughout; made-up handles are the point.
    unsafe {
        // Not created with the POSIX handle type; other handle types; flags; null; unknown.
        assert_eq!(
            d::cuMemExportToShareableHandle(out, plain, POSIX_FD, 0),
            INVALID_VALUE
        );
        assert_eq!(
            d::cuMemExportToShareableHandle(out, shared, 8, 0),
            INVALID_VALUE
        );
        assert_eq!(
            d::cuMemExportToShareableHandle(out, shared, 0, 0),
            INVALID_VALUE
        );
        assert_eq!(
            d::cuMemExportToShareableHandle(out, shared, POSIX_FD, 1),
            INVALID_VALUE
        );
        assert_eq!(
            d::cuMemExportToShareableHandle(std::ptr::null_mut(), shared, POSIX_FD, 0),
            INVALID_VALUE
        );
        assert_eq!(
            d::cuMemExportToShareableHandle(out, 12345, POSIX_FD, 0),
            INVALID_VALUE
        );
        let mut h = 0;
        assert_eq!(
            d::cuMemImportFromShareableHandle(&mut h, usize::MAX as *mut c_void, POSIX_FD),
            INVALID_VALUE
        );
        assert_eq!(
            d::cuMemImportFromShareableHandle(&mut h, std::ptr::null_mut(), POSIX_FD),
            INVALID_VALUE,
            "standard input is no simgpu memory"
        );
        assert_eq!(
            d::cuMemImportFromShareableHandle(&mut h, 3 as *mut c_void, 8),
            NOT_SUPPORTED
        );
        assert_eq!(
            d::cuMemImportFromShareableHandle(&mut h, 3 as *mut c_void, 0),
            INVALID_VALUE
        );
    }
    assert_eq!(fd, -1, "no descriptor written on failure");
    // A new descriptor each time.
    let (fd1, fd2) = (export(shared), export(shared));
    assert_ne!(fd1, fd2);
    close(fd2);
    let imported = import(fd1);
    close(fd1);
    assert_ne!(imported, shared);
    assert_eq!(used(), before + SIZE, "an import is not counted again");
    let p = props_of(imported);
    assert_eq!(
        (
            p.type_,
            p.requested_handle_types,
            p.location.type_,
            p.location.id
        ),
        (1, POSIX_FD, 1, 1)
    );
    assert_eq!(props_of(plain).requested_handle_types, 0);
    let a = map(shared, 1);
    let b = map(imported, 0);
    put(a, 100, b"through the first handle");
    assert_eq!(get(b, 100, 24), b"through the first handle");
    put(b, SIZE - 6, b"second");
    assert_eq!(get(a, SIZE - 6, 6), b"second");
    // Release everything; the device's memory comes back once the creator's handle goes.
    // SAFETY: simgpu's handles.
    unsafe {
        ok(d::cuMemRelease(shared));
        ok(d::cuMemRelease(imported));
        ok(d::cuMemRelease(plain));
        assert_eq!(d::cuMemRelease(imported), INVALID_VALUE);
    }
    unmap(a);
    assert_eq!(used(), before);
    assert_eq!(get(b, 100, 24), b"through the first handle");
    unmap(b);
}

/// Sends `fd` over the socket on standard input (`SCM_RIGHTS`).
fn send_fd(fd: c_int) {
    let mut byte = [b'F'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which has room for one header and one int.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as _;
        libc::CMSG_DATA(c).cast::<c_int>().write_unaligned(fd);
        assert_eq!(
            libc::sendmsg(0, &msg, 0),
            1,
            "sendmsg: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Receives one descriptor from the socket on standard input.
fn recv_fd() -> c_int {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at buffers that live through the call; the header read back is
    // the kernel's.
    unsafe {
        assert_eq!(
            libc::recvmsg(0, &mut msg, libc::MSG_CMSG_CLOEXEC),
            1,
            "recvmsg"
        );
        let c = libc::CMSG_FIRSTHDR(&msg);
        assert!(
            !c.is_null() && (*c).cmsg_type == libc::SCM_RIGHTS,
            "no descriptor came"
        );
        libc::CMSG_DATA(c).cast::<c_int>().read_unaligned()
    }
}

/// Standard input as a stream (for the one-byte handshakes after the descriptor).
fn socket() -> UnixStream {
    // SAFETY: standard input is the socket the parent gave; this process uses it through
    // this one object from now on.
    let fd = unsafe { libc::dup(0) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn handshake(s: &mut UnixStream, send: u8, expect: u8) {
    s.write_all(&[send]).unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
    assert_eq!(b[0], expect);
}

fn exporter() {
    init_device(0);
    let before = used();
    let h = create(0, POSIX_FD);
    let va = map(h, 0);
    put(va, 0, b"written by the exporter");
    let fd = export(h);
    send_fd(fd);
    close(fd);
    let mut s = socket();
    // The importer has written its part.
    handshake(&mut s, b'a', b'b');
    assert_eq!(get(va, SIZE - 8, 8), b"imported");
    assert_eq!(used(), before + SIZE);
    // Let go first: the importer still reads the bytes.
    // SAFETY: simgpu's handle.
    ok(unsafe { d::cuMemRelease(h) });
    unmap(va);
    assert_eq!(used(), before);
    handshake(&mut s, b'c', b'd');
}

fn importer() {
    init_device(0);
    let before = used();
    let fd = recv_fd();
    let h = import(fd);
    close(fd);
    let p = props_of(h);
    // Physical device 0 is not visible here: the creator's ordinal, 0, as given.
    assert_eq!((p.requested_handle_types, p.location.id), (POSIX_FD, 0));
    let va = map(h, 0);
    assert_eq!(used(), before, "the exporter's device carries the bytes");
    assert_eq!(get(va, 0, 23), b"written by the exporter");
    put(va, SIZE - 8, b"imported");
    let mut s = socket();
    handshake(&mut s, b'b', b'a');
    // The exporter has released and unmapped: the bytes stay while mapped here.
    handshake(&mut s, b'd', b'c');
    assert_eq!(get(va, 0, 23), b"written by the exporter");
    // SAFETY: simgpu's handle.
    ok(unsafe { d::cuMemRelease(h) });
    unmap(va);
}
