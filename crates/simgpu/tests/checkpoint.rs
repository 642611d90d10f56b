//! The driver's process checkpoint API across processes, through simgpu's exported
//! functions as `cudaw-ckpt` calls them: a target child (a context, a `cuMemAlloc`
//! allocation holding a pattern) and a caller child that locks, checkpoints, restores and
//! unlocks it by PID, checking the states, the target's device memory (0 while
//! checkpointed) and the errors. The target then checks its bytes.
//!
//! The machine and the checkpoint folder are read from the environment, so every side
//! runs in a child process of this test binary with its own variables.

mod common;
use common::Children;

use std::ffi::{c_int, c_void};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};

use simgpu::driver_api::{self as d, Handle};

const ROLE: &str = "SIMGPU_CHECKPOINT_TEST_ROLE";
const TARGET: &str = "SIMGPU_CHECKPOINT_TEST_TARGET";
const BYTES: usize = 3 << 20;
const INVALID_VALUE: u32 = 1;
const ILLEGAL_STATE: u32 = 401;
const NOT_SUPPORTED: u32 = 801;

fn spawn_child(role: &str, env: &[(&str, &str)]) -> Child {
    common::spawn_child(ROLE, role, env, Stdio::piped())
}

fn ok(code: u32) {
    assert_eq!(code, 0, "a driver call failed");
}

#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "target" => target(),
        "caller" => caller(),
        "unsupported" => unsupported(),
        other => panic!("unknown role {other}"),
    }
    println!("passed {role}");
}

fn pattern() -> Vec<u8> {
    (0..BYTES).map(|i| (i * 7 + 3) as u8).collect()
}

/// Holds memory, says `ready`, waits for a line, checks the memory.
fn target() {
    // SAFETY: simgpu's exports with valid arguments.
    unsafe {
        let mut ctx: Handle = std::ptr::null_mut();
        ok(d::cuInit(0));
        ok(d::cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(d::cuCtxSetCurrent(ctx));
        let mut ptr = 0u64;
        ok(d::cuMemAlloc_v2(&mut ptr, BYTES));
        let data = pattern();
        ok(d::cuMemcpyHtoD_v2(ptr, data.as_ptr().cast(), BYTES));
        println!("ready {ptr:#x}");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let mut back = vec![0u8; BYTES];
        ok(d::cuMemcpyDtoH_v2(
            back.as_mut_ptr().cast::<c_void>(),
            ptr,
            BYTES,
        ));
        assert!(back == data, "the bytes differ after the checkpoint");
    }
}

fn state(pid: c_int) -> c_int {
    let mut s = -1;
    // SAFETY: a valid out-pointer.
    ok(unsafe { d::cuCheckpointProcessGetState(pid, &mut s) });
    s
}

fn caller() {
    let pid: c_int = std::env::var(TARGET).unwrap().parse().unwrap();
    let null = std::ptr::null();
    // SAFETY: simgpu's exports with valid (or null, optional) arguments.
    unsafe {
        ok(d::cuInit(0));
        assert_eq!(state(pid), 0, "running");
        assert_eq!(d::cuCheckpointProcessUnlock(pid, null), ILLEGAL_STATE);
        assert_eq!(d::cuCheckpointProcessCheckpoint(pid, null), ILLEGAL_STATE);
        let mut lock = [0u64; 8];
        lock[0] = 5000;
        lock[3] = 1;
        assert_eq!(d::cuCheckpointProcessLock(pid, &lock), INVALID_VALUE);
        lock[3] = 0;
        ok(d::cuCheckpointProcessLock(pid, &lock));
        assert_eq!(state(pid), 1, "locked");
        let u = simgpu::checkpoint::usage(pid).unwrap();
        assert!(u.used[0] >= BYTES as u64 && u.contexts == [1], "{u:?}");
        ok(d::cuCheckpointProcessCheckpoint(pid, null));
        assert_eq!(state(pid), 2, "checkpointed");
        let u = simgpu::checkpoint::usage(pid).unwrap();
        assert_eq!((u.used, u.contexts), (vec![0], vec![0]));
        let mut tid = 0;
        ok(d::cuCheckpointProcessGetRestoreThreadId(pid, &mut tid));
        assert!(tid > 0);
        assert_eq!(d::cuCheckpointProcessUnlock(pid, null), ILLEGAL_STATE);
        ok(d::cuCheckpointProcessRestore(pid, null));
        assert_eq!(state(pid), 1, "locked after the restore");
        assert!(simgpu::checkpoint::usage(pid).unwrap().used[0] >= BYTES as u64);
        ok(d::cuCheckpointProcessUnlock(pid, null));
        assert_eq!(state(pid), 0, "running again");
        let mut s = 0;
        assert_eq!(
            d::cuCheckpointProcessGetState(c_int::MAX, &mut s),
            INVALID_VALUE,
            "no such process"
        );
    }
}

fn unsupported() {
    let pid: c_int = std::env::var(TARGET).unwrap().parse().unwrap();
    // SAFETY: simgpu's exports with valid arguments.
    unsafe {
        ok(d::cuInit(0));
        assert_eq!(
            d::cuCheckpointProcessLock(pid, std::ptr::null()),
            NOT_SUPPORTED
        );
        let mut s = 0;
        assert_eq!(d::cuCheckpointProcessGetState(pid, &mut s), NOT_SUPPORTED);
    }
}

fn run_to_end(mut c: Child, role: &str) {
    let out = c.stdout.take();
    let mut text = String::new();
    if let Some(mut o) = out {
        std::io::Read::read_to_string(&mut o, &mut text).unwrap();
    }
    let mut err = String::new();
    if let Some(mut e) = c.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).unwrap();
    }
    let status = c.wait().unwrap();
    assert!(
        status.success() && text.contains(&format!("passed {role}")),
        "child {role} failed ({status}):\n--- stdout\n{text}--- stderr\n{err}"
    );
}

#[test]
fn lock_checkpoint_restore_unlock_another_process() {
    let dir = tempfile::tempdir().expect("a private folder");
    let dir_s = dir.path().to_str().unwrap().to_owned();
    let env = [("SIMGPU_CHECKPOINT_DIR", dir_s.as_str())];
    let mut kids = Children(vec![spawn_child("target", &env)]);
    let mut out = BufReader::new(kids.0[0].stdout.take().unwrap());
    let mut ready = String::new();
    // The test harness's own lines come first.
    while !ready.contains("ready 0x") {
        ready.clear();
        assert!(
            out.read_line(&mut ready).unwrap() > 0,
            "the target ended before it was ready"
        );
    }
    let pid = kids.0[0].id().to_string();
    let with_target = [env[0], (TARGET, pid.as_str())];
    run_to_end(spawn_child("caller", &with_target), "caller");
    let with_unsupported = [
        env[0],
        (TARGET, pid.as_str()),
        ("SIMGPU_CHECKPOINT", "unsupported"),
    ];
    run_to_end(spawn_child("unsupported", &with_unsupported), "unsupported");
    let mut target = kids.0.remove(0);
    target.stdin.take().unwrap().write_all(b"go\n").unwrap();
    target.stdout = Some(out.into_inner());
    run_to_end(target, "target");
}
