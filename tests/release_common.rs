//! What the `--release` and `migrate` tests share: `cudaw-ckpt` and ckpt_target run with
//! simgpu's checkpoint API (the driver's `cuCheckpointProcess*`) reached through a
//! private checkpoint folder.

#![allow(dead_code)]

use crate::ckpt_common::{self, text, Target, TempDir};
use cudaw_tests::{cudaw_ckpt, simgpu, Addressing};
use std::path::Path;
use std::process::{Command, Output};

/// cudaw-ckpt against `t`, loading simgpu as its driver, with the shared checkpoint
/// folder `dir` and `env`.
pub fn ckpt(t: &Target, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(cudaw_ckpt());
    cmd.args(args)
        .env("CUDAW_RUN_DIR", &t.run_dir)
        .env("CUDAW_LIBCUDA", simgpu())
        .env("SIMGPU_CHECKPOINT_DIR", dir)
        // The simulated devices' size the targets see (command_under_cudaw's).
        .env("SIMGPU_MEM", "4G")
        .env_remove("SIMGPU_CHECKPOINT")
        .current_dir(&t.work);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running cudaw-ckpt")
}

pub fn ok(t: &Target, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let out = ckpt(t, dir, env, args);
    assert!(
        out.status.success(),
        "cudaw-ckpt {args:?} failed ({}):\n{}{}\n--- the target's log:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr),
        t.log()
    );
    out
}

pub fn json(t: &Target, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = ok(t, dir, env, &a);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{a:?} printed {:?}: {e}", text(&out.stdout)))
}

/// A private checkpoint folder (short: socket paths are limited to 108 bytes).
pub fn ckpt_dir(tag: &str) -> TempDir {
    ckpt_common::temp_dir(&format!("{tag}-sim"))
}

/// ckpt_target whose simgpu serves its checkpoint socket in `dir`.
pub fn start(tag: &str, dir: &Path, env: &[(&str, &str)]) -> Option<Target> {
    let d = dir.to_str().expect("a UTF-8 folder").to_owned();
    let mut all: Vec<(&str, &str)> = vec![("SIMGPU_CHECKPOINT_DIR", d.as_str())];
    all.extend_from_slice(env);
    Target::start_with(Addressing::Mapped, tag, &all)
}

pub fn pid(t: &Target) -> i32 {
    t.pid.parse().expect("a PID")
}

pub fn usage(dir: &Path, t: &Target) -> simgpu::checkpoint::Usage {
    simgpu::checkpoint::usage_in(dir, pid(t)).expect("asking simgpu what the process holds")
}

/// Sends `sig` to `pid`; kill(2)'s result.
pub fn unsafe_kill(pid: i32, sig: i32) -> i32 {
    // SAFETY: kill(2) with our own child's PID; no memory is involved.
    unsafe { libc::kill(pid, sig) }
}
