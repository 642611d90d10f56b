//! `cudaw-ckpt pause --release` on simgpu: `tests/cuda/programs/ckpt_target.cu` under
//! `cudaw run`, paused by cudaw and then checkpointed by the driver's
//! `cuCheckpointProcess*` (simgpu's, reached from `cudaw-ckpt` through its checkpoint
//! socket), resumed by the driver's restore + unlock and cudaw's resume. Its output must
//! equal the uninterrupted run's; while released, the simulated device holds nothing of it
//! (simgpu's own accounting, asked of the process as `nvidia-smi` would show it). Also: the
//! fallback where the driver lacks the API, a resume by signal and a dump of a released
//! process refused, and a process killed while released.

mod ckpt_common;
mod release_common;

use ckpt_common::text;
use release_common::{ckpt, ckpt_dir, json, ok, pid, start, unsafe_kill, usage};

#[test]
fn release_pause_resume_cycles_match_an_uninterrupted_run() {
    let dir = ckpt_dir("cycles");
    let Some(mut t) = start("rel-cycles", &dir.0, &[]) else {
        return;
    };
    t.run(3);
    let before = usage(&dir.0, &t);
    assert!(
        before.used[0] > 0 && before.contexts == [1],
        "running: {before:?}"
    );
    for round in 0..3 {
        let p = json(&t, &dir.0, &[], &["pause", &t.pid, "--release"]);
        assert_eq!(p["released"], true, "round {round}: {p}");
        assert_eq!(p["changed"], true, "round {round}: {p}");
        assert_eq!(
            p["allocations"].as_u64(),
            Some(ckpt_common::ALLOCATIONS),
            "{p}"
        );
        assert!(p["driver"]["lock_ms"].is_number() && p["driver"]["checkpoint_ms"].is_number());
        let st = t.status();
        assert_eq!(st["state"], "released", "{st}");
        let u = usage(&dir.0, &t);
        assert_eq!(u.state, 2, "checkpointed: {u:?}");
        assert_eq!(
            (u.used, u.contexts),
            (vec![0], vec![0]),
            "round {round}: the device still holds memory or a context of the process"
        );
        // A second pause --release changes nothing.
        let again = ok(&t, &dir.0, &[], &["pause", &t.pid, "--release"]);
        assert!(
            text(&again.stdout).contains("context already released"),
            "{}",
            text(&again.stdout)
        );
        // The program's next iterations wait while it is released.
        t.send_run(2);
        let r = json(&t, &dir.0, &[], &["resume", &t.pid]);
        assert_eq!(r["released"], true, "{r}");
        assert_eq!(r["driver"]["found"], "checkpointed", "{r}");
        // What cuInit took in cudaw-ckpt is reported; it is called for simgpu
        // ($CUDAW_LIBCUDA), whatever the machine's GPUs' persistence mode.
        assert!(r["driver"]["init_ms"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert_eq!(r["driver"]["init"], "called", "{r}");
        assert!(r["driver"]["nvml_ms"].is_number(), "{r}");
        assert_eq!(r["bytes"].as_u64(), Some(ckpt_common::BYTES), "{r}");
        t.wait_ran();
        let u = usage(&dir.0, &t);
        assert_eq!((u.state, u.contexts.clone()), (0, vec![1]), "{u:?}");
        assert_eq!(u.used, before.used, "the memory came back");
        t.assert_running();
    }
    // Each time, the stack's local memory was freed before the driver's checkpoint (less
    // for it to copy) and the limit set back before the program went on.
    let log = t.finish();
    assert_eq!(
        log.matches("the stack's local memory is freed").count(),
        3,
        "{log}"
    );
    assert_eq!(
        log.matches("the stack limit is 1024 bytes a thread again")
            .count(),
        3,
        "{log}"
    );
}

#[test]
fn the_fallback_where_the_driver_lacks_the_api_is_a_plain_pause() {
    let dir = ckpt_dir("fallback");
    let Some(mut t) = start("rel-fallback", &dir.0, &[]) else {
        return;
    };
    t.run(2);
    let old = [("SIMGPU_CHECKPOINT", "unsupported")];
    let out = ok(&t, &dir.0, &old, &["pause", &t.pid, "--release"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("--release: ")
            && err.contains("CUDA_ERROR_NOT_SUPPORTED")
            && err.contains("paused without releasing the context"),
        "{err}"
    );
    assert!(
        text(&out.stdout).contains("context kept on the GPU"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(t.status()["state"], "paused");
    assert_eq!(usage(&dir.0, &t).contexts, [1], "the context stays");
    ok(&t, &dir.0, &[], &["resume", &t.pid]);
    t.run(2);
    let p = json(&t, &dir.0, &old, &["pause", &t.pid, "--release"]);
    assert_eq!(p["released"], false, "{p}");
    assert!(
        p["reason"]
            .as_str()
            .is_some_and(|r| r.contains("CUDA_ERROR_NOT_SUPPORTED")),
        "{p}"
    );
    assert_eq!(p["changed"], true, "{p}");
    // A signal's resume works on a process whose context stayed.
    let rc = unsafe_kill(pid(&t), libc::SIGUSR2);
    assert_eq!(rc, 0);
    t.wait_log("resumed: ");
    t.run(2);
    t.finish();
}

#[test]
fn a_released_process_refuses_a_signal_resume_and_a_dump_until_cudaw_ckpt_resume() {
    let dir = ckpt_dir("refuse");
    let Some(mut t) = start("rel-refuse", &dir.0, &[]) else {
        return;
    };
    t.run(2);
    ok(&t, &dir.0, &[], &["pause", &t.pid, "--release"]);
    assert_eq!(unsafe_kill(pid(&t), libc::SIGUSR2), 0);
    t.wait_log("resume refused: the process's context is released to the driver");
    assert_eq!(t.status()["state"], "released");
    assert_eq!(
        usage(&dir.0, &t).state,
        2,
        "still checkpointed by the driver"
    );
    let img = t.path("released.img");
    let out = ckpt(
        &t,
        &dir.0,
        &[],
        &["dump", &t.pid, "-o", img.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("cudaw-ckpt resume {}", t.pid)),
        "{}",
        text(&out.stderr)
    );
    assert!(!img.exists());
    // Status names it, in words too.
    let s = text(&ok(&t, &dir.0, &[], &["status", &t.pid]).stdout);
    assert!(
        s.contains("released") && s.contains("the GPU holds nothing of it"),
        "{s}"
    );
    ok(&t, &dir.0, &[], &["resume", &t.pid]);
    t.run(2);
    // After the resume, a dump works again.
    ok(
        &t,
        &dir.0,
        &[],
        &[
            "dump",
            &t.pid,
            "-o",
            img.to_str().unwrap(),
            "--leave-running",
        ],
    );
    t.finish();
}

#[test]
fn a_process_killed_while_released_is_gone_cleanly() {
    let dir = ckpt_dir("killed");
    let Some(mut t) = start("rel-killed", &dir.0, &[]) else {
        return;
    };
    t.run(2);
    ok(&t, &dir.0, &[], &["pause", &t.pid, "--release"]);
    assert_eq!(unsafe_kill(pid(&t), libc::SIGTERM), 0);
    let status = t.child.wait().expect("waiting for the killed target");
    assert!(!status.success());
    let out = ckpt(&t, &dir.0, &[], &["resume", &t.pid]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("no process with PID {}", t.pid)),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        simgpu::checkpoint::usage_in(&dir.0, pid(&t)).err(),
        Some(simgpu::CuError::CUDA_ERROR_INVALID_VALUE),
        "the driver's API on a process that is gone"
    );
}

#[test]
fn release_on_pause_makes_release_the_default() {
    let dir = ckpt_dir("default");
    let Some(mut t) = start("rel-default", &dir.0, &[("CUDAW_RELEASE_ON_PAUSE", "1")]) else {
        return;
    };
    t.run(2);
    assert_eq!(t.status()["release_on_pause"], true);
    let p = json(&t, &dir.0, &[], &["pause", &t.pid]);
    assert_eq!(p["released"], true, "{p}");
    ok(&t, &dir.0, &[], &["resume", &t.pid]);
    t.run(2);
    let p = json(&t, &dir.0, &[], &["pause", &t.pid, "--no-release"]);
    assert!(p.get("released").is_none(), "{p}");
    assert_eq!(t.status()["state"], "paused");
    ok(&t, &dir.0, &[], &["resume", &t.pid]);
    t.finish();
}
