//! `cudaw-ckpt migrate` on simgpu with two simulated GPUs: ckpt_target under `cudaw run`
//! moved from GPU 0 to GPU 1 and back while it runs — cudaw's pause, the driver's
//! checkpoint, the driver's restore with GPU pairs (simgpu's `cuCheckpointProcessRestore`
//! moves an ordinal onto another simulated GPU), cudaw's resume on the new GPU. The
//! program's own checks of its data run after every move. Also the failures, each leaving
//! the process running where it was: no such GPU, the GPU it is on, a target without room
//! in the node ledger (refused before anything moves; and, past that check, moved back
//! after the ledger refused the memory), a driver without the API, and a process that
//! exits mid-migration. Beside them, what a migration's and the node scheduler's room
//! rests on: an allocation that does not fit waits for room (`CUDAW_ALLOC_WAIT`).

mod ckpt_common;
mod release_common;

use ckpt_common::{text, Target, TempDir};
use release_common::{ckpt, ckpt_dir, json, ok, pid, start, usage};
use simgpu::config::{uuid_of, uuid_text};
use std::path::Path;

const TWO: (&str, &str) = ("SIMGPU_DEVICES", "2");

fn gpu(i: usize) -> String {
    uuid_text(&uuid_of(i))
}

/// The target on a machine of two simulated GPUs, seeing GPU 0 only (as a job's process
/// sees its own GPU); `env` added.
fn start2(tag: &str, dir: &Path, env: &[(&str, &str)]) -> Option<Target> {
    let mut all = vec![TWO, ("CUDA_VISIBLE_DEVICES", "0")];
    all.extend_from_slice(env);
    start(tag, dir, &all)
}

/// The GPU behind the target's device 0, as its status says.
fn status_gpu(t: &Target) -> String {
    let st = t.status();
    st["devices"][0]["gpu"]
        .as_str()
        .unwrap_or_else(|| panic!("no gpu in {st}"))
        .to_owned()
}

#[test]
fn a_running_process_moves_to_the_other_gpu_and_back() {
    let dir = ckpt_dir("mig");
    let Some(mut t) = start2("mig-there", &dir.0, &[]) else {
        return;
    };
    t.run(3);
    let before = usage(&dir.0, &t);
    assert_eq!(before.physical[0], 0, "{before:?}");
    assert_eq!(status_gpu(&t), gpu(0));
    let m = json(&t, &dir.0, &[TWO], &["migrate", &t.pid, "--to", "1"]);
    assert_eq!(m["pid"].as_u64(), Some(u64::from(pid(&t) as u32)), "{m}");
    assert_eq!(m["moved"][0]["ordinal"], 0, "{m}");
    assert_eq!(m["moved"][0]["from"], gpu(0).as_str(), "{m}");
    assert_eq!(m["moved"][0]["to"], gpu(1).as_str(), "{m}");
    assert_eq!(m["bytes"].as_u64(), Some(ckpt_common::BYTES), "{m}");
    assert_eq!(
        m["allocations"].as_u64(),
        Some(ckpt_common::ALLOCATIONS),
        "{m}"
    );
    for k in [
        "pause_ms",
        "release_ms",
        "restore_ms",
        "resume_ms",
        "total_ms",
    ] {
        assert!(m[k].is_number(), "{k}: {m}");
    }
    // The ordinal stays; the GPU behind it, its memory and its context are on GPU 1.
    let u = usage(&dir.0, &t);
    assert_eq!(u.physical[0], 1, "{u:?}");
    assert_eq!((u.state, u.contexts.clone()), (0, vec![1]), "{u:?}");
    assert_eq!(u.used[0], before.used[0], "the memory came back, on GPU 1");
    let st = t.status();
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(st["devices"][0]["gpu"], gpu(1).as_str(), "{st}");
    assert!(
        t.log().contains("its node-ledger entry moved with it"),
        "{}",
        t.log()
    );
    // The program's own checks of its data pass on GPU 1.
    t.run(2);
    // Back, by UUID, in words.
    let out = ok(&t, &dir.0, &[TWO], &["migrate", &t.pid, "--to", &gpu(0)]);
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("device 0 moved from {} to {}", gpu(1), gpu(0)))
            && said.contains("moved in "),
        "{said}"
    );
    assert_eq!(usage(&dir.0, &t).physical[0], 0);
    assert_eq!(status_gpu(&t), gpu(0));
    t.run(2);
    t.finish();
}

#[test]
fn bad_targets_are_refused_and_the_process_runs_on_where_it_was() {
    let dir = ckpt_dir("migbad");
    let Some(mut t) = start2("mig-bad", &dir.0, &[]) else {
        return;
    };
    t.run(2);
    for (to, code, says) in [
        ("7", 2, "no such GPU; this machine has 0: "),
        ("0", 2, "the process is already there"),
        ("banana", 2, "not a GPU index"),
        ("0=1,0=1", 2, "GPU 0 is named twice"),
        ("1=0", 2, "the process is not on GPU 1"),
    ] {
        let out = ckpt(&t, &dir.0, &[TWO], &["migrate", &t.pid, "--to", to]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "--to {to}: {err}");
        assert!(err.contains(says), "--to {to}: {err}");
        t.assert_running();
        assert_eq!(usage(&dir.0, &t).physical[0], 0);
    }
    t.run(2);
    t.finish();
}

/// A private node-ledger folder (the ledger trusts only a folder of its user's, 0700).
fn node_dir(tag: &str) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = ckpt_common::temp_dir(tag);
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// This test process, in GPU 1's node ledger, holding all of its 4 GiB but 1 MiB.
fn fill_gpu1(node: &Path) -> cudaw_ledger::Ledger {
    let mut l = cudaw_ledger::Ledger::join(node, &gpu(1), 4 << 30, None).unwrap();
    let g = l.acquire((4 << 30) - (1 << 20)).unwrap();
    assert_eq!(g, cudaw_ledger::Grant::Granted);
    l
}

#[test]
fn a_target_without_room_is_refused_before_anything_moves() {
    let dir = ckpt_dir("migroom");
    let node = node_dir("mig-room-node");
    let nd = node.0.to_str().unwrap();
    let Some(mut t) = start2("mig-room", &dir.0, &[("CUDAW_NODE_DIR", nd)]) else {
        return;
    };
    t.run(2);
    let _full = fill_gpu1(&node.0);
    let out = ckpt(&t, &dir.0, &[TWO], &["migrate", &t.pid, "--to", "1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("free in the node ledger") && err.contains("not moved"),
        "{err}"
    );
    // Nothing moved: never paused, never released.
    assert!(!t.log().contains("pause: "), "{}", t.log());
    t.assert_running();
    let u = usage(&dir.0, &t);
    assert_eq!((u.physical[0], u.state), (0, 0), "{u:?}");

    // Past that check (a test build's fault point skips it), cudaw's resume on GPU 1 is
    // refused by the ledger: the process is moved back, and runs on GPU 0 with its data.
    let skip = [TWO, ("CUDAW_CKPT_FAULT", "skip-room-check")];
    let out = ckpt(&t, &dir.0, &skip, &["migrate", &t.pid, "--to", "1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("did not come back on the new GPU")
            && err.contains("refused")
            && err.contains("was moved back: it runs where it was"),
        "{err}\n{}",
        t.log()
    );
    t.assert_running();
    assert_eq!(usage(&dir.0, &t).physical[0], 0);
    assert_eq!(status_gpu(&t), gpu(0));
    t.run(2);
    t.finish();
}

#[test]
fn a_driver_without_the_api_moves_nothing() {
    let dir = ckpt_dir("migapi");
    let Some(mut t) = start2("mig-api", &dir.0, &[]) else {
        return;
    };
    t.run(2);
    let old = [TWO, ("SIMGPU_CHECKPOINT", "unsupported")];
    let out = ckpt(&t, &dir.0, &old, &["migrate", &t.pid, "--to", "1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not moved: ")
            && err.contains("CUDA_ERROR_NOT_SUPPORTED")
            && err.contains("it runs where it was"),
        "{err}"
    );
    t.assert_running();
    assert_eq!(usage(&dir.0, &t).physical[0], 0);
    t.run(2);
    // A paused process is left paused by a migration that fails, and resumed on its new
    // GPU by one that succeeds.
    ok(&t, &dir.0, &[], &["pause", &t.pid]);
    let out = ckpt(&t, &dir.0, &old, &["migrate", &t.pid, "--to", "1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("it stays paused where it was"), "{err}");
    assert_eq!(t.status()["state"], "paused");
    ok(&t, &dir.0, &[TWO], &["migrate", &t.pid, "--to", "1"]);
    t.assert_running();
    assert_eq!(usage(&dir.0, &t).physical[0], 1);
    t.run(2);
    t.finish();
}

#[test]
fn a_process_that_exits_mid_migration_is_reported_gone() {
    let dir = ckpt_dir("miggone");
    let Some(mut t) = start2("mig-gone", &dir.0, &[]) else {
        return;
    };
    t.run(2);
    let kill = [TWO, ("CUDAW_CKPT_FAULT", "kill-after-release")];
    let out = ckpt(&t, &dir.0, &kill, &["migrate", &t.pid, "--to", "1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("process {} exited during the migration", t.pid)),
        "{err}"
    );
    let status = t.child.wait().expect("waiting for the killed target");
    assert!(!status.success());
}

/// A process of its own whose card the node ledger says is full: its first allocation
/// waits (CUDAW_ALLOC_WAIT), says so in its status (`wanted`), and goes on once room is
/// made — here by the test leaving the ledger, as the node daemon swapping a job out would.
#[test]
fn an_allocation_that_does_not_fit_waits_for_room() {
    let Some(nvcc) = cudaw_tests::nvcc() else {
        return;
    };
    let exe = cudaw_tests::compile_program(&nvcc, "vector_add");
    let node = node_dir("room-wait-node");
    let run = node_dir("room-wait-run");
    let mut blocker = {
        let mut l =
            cudaw_ledger::Ledger::join(&node.0, &gpu(0), 4 << 30, None).expect("joining GPU 0");
        assert_eq!(
            l.acquire((4 << 30) - (1 << 20)).unwrap(),
            cudaw_ledger::Grant::Granted
        );
        l
    };
    let mut cmd = cudaw_tests::command_under_cudaw(
        &exe,
        cudaw_tests::Addressing::Mapped,
        &[
            ("CUDAW_NODE_DIR", node.0.to_str().unwrap()),
            ("CUDAW_RUN_DIR", run.0.to_str().unwrap()),
            ("CUDAW_ALLOC_WAIT", "60s"),
            ("CUDAW_LOG", "info"),
        ],
    );
    let err_path = run.0.join("err");
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let child = cmd.spawn().expect("starting vector_add");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(child);
    let pid = child.0.id();
    let socket = run.0.join(format!("{pid}.sock"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let wanted = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "vector_add never said it waits for room"
        );
        if socket.exists() {
            let st = ckpt_common::raw(&socket, "{\"cmd\":\"status\"}\n");
            let w = st["status"]["devices"][0]["wanted"].as_u64().unwrap_or(0);
            if w > 0 {
                break w;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(wanted >= 4 << 20, "{wanted}");
    blocker.leave().expect("leaving the ledger");
    let status = cudaw_tests::wait_timeout(&mut child.0, std::time::Duration::from_secs(60))
        .expect("vector_add did not end within 60 s once room was made");
    let mut out = String::new();
    use std::io::Read;
    let mut stdout = child.0.stdout.take().expect("stdout");
    stdout.read_to_string(&mut out).unwrap();
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "{status:?}\n{err}");
    assert_eq!(out, cudaw_tests::expected("vector_add"), "{err}");
    assert!(
        err.contains("waiting up to 60.0 s for the node scheduler to make room")
            && err.contains("allocated after waiting"),
        "{err}"
    );
}
