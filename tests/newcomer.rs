//! A newcomer's first session, on a machine without a GPU (issue 24): a user's own
//! nvcc-built program runs under `cudaw run` with no variables set (on simgpu, said once);
//! a program whose every CUDA call would fail is not started; a copy of `cudaw` outside
//! the build (as `cargo install` makes) still finds its libraries; no command of either
//! CLI panics on a closed standard output; failures under `--json` have one shape in both
//! CLIs; and the messages that misled (restore into no process, another process's image,
//! stale sockets left by `kill -9`) say what is so.

mod ckpt_common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ckpt_common::{images, Target};
use cudaw_tests::{compile_program, cudaw, cudaw_ckpt, expected, nvcc, shims, simgpu, Addressing};
use serde_json::Value;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `cmd` as a newcomer's shell runs it: no CUDAW_* or SIMGPU_* variables, no
/// LD_PRELOAD or LD_LIBRARY_PATH.
fn clean(mut cmd: Command) -> Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CUDAW_")
            || k.starts_with("SIMGPU_")
            || k == "LD_PRELOAD"
            || k == "LD_LIBRARY_PATH"
        {
            cmd.env_remove(&*k);
        }
    }
    cmd
}

/// A private folder holding a copy of `program` (run as `./NAME` from there).
fn folder_with(program: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary folder");
    std::fs::copy(program, dir.path().join(program.file_name().unwrap())).expect("copying");
    dir
}

/// Whether the machine has a usable GPU, as `cudaw run` decides (it says so when not).
fn said_no_gpu(stderr: &str) -> bool {
    stderr.contains("no GPU here")
}

#[test]
fn own_program_runs_on_simgpu_with_no_variables_set() {
    let Some(nvcc) = nvcc() else { return };
    shims();
    let exe = compile_program(&nvcc, "vector_add");
    let dir = folder_with(&exe);
    let mut cmd = clean(Command::new(cudaw()));
    cmd.args(["run", "--", "./vector_add"])
        .current_dir(dir.path());
    let out = cmd.output().expect("running cudaw run");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}:\n{stdout}{stderr}", out.status);
    assert_eq!(stdout, expected("vector_add"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    if said_no_gpu(&stderr) {
        // Said once, plainly, with where simgpu is.
        assert_eq!(stderr.matches("no GPU here").count(), 1, "{stderr}");
        assert!(
            stderr.contains("Running ./vector_add on simgpu, cudaw's simulated GPU"),
            "{stderr}"
        );
        assert!(stderr.contains("libsimgpu.so"), "{stderr}");
    }

    // --device sim: simgpu without asking, and without a word.
    let mut cmd = clean(Command::new(cudaw()));
    cmd.args(["run", "--device", "sim", "--", "./vector_add"])
        .current_dir(dir.path());
    let out = cmd.output().expect("running cudaw run --device sim");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), expected("vector_add"));
    assert!(!said_no_gpu(&text(&out.stderr)), "{out:?}");
}

#[test]
fn without_a_gpu_device_gpu_refuses_and_runs_nothing() {
    let Some(nvcc) = nvcc() else { return };
    shims();
    let exe = compile_program(&nvcc, "vector_add");
    let dir = folder_with(&exe);
    let mut cmd = clean(Command::new(cudaw()));
    cmd.args(["run", "--device", "gpu", "--", "./vector_add"])
        .current_dir(dir.path());
    let out = cmd.output().expect("running cudaw run --device gpu");
    if out.status.success() {
        // A GPU here: nothing to show.
        return;
    }
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "the program ran: {out:?}");
    assert!(
        stderr.contains("cudaw: error: --device gpu, but no GPU is usable: "),
        "{stderr}"
    );
    assert!(stderr.contains("--device sim runs on simgpu"), "{stderr}");
    assert!(!stderr.contains("dlopen failed (500)"), "{stderr}");
}

#[test]
fn a_program_whose_every_cuda_call_would_fail_is_not_started() {
    let Some(nvcc) = nvcc() else { return };
    shims();
    let exe = compile_program(&nvcc, "vector_add");
    let dir = folder_with(&exe);
    // A driver named (no probe), and a real runtime that is not there.
    let mut cmd = clean(Command::new(cudaw()));
    cmd.args(["run", "--", "./vector_add"])
        .current_dir(dir.path())
        .env("CUDAW_LIBCUDA", simgpu())
        .env("CUDAW_REAL_CUDART", dir.path().join("no/libcudart.so.13"));
    let out = cmd.output().expect("running cudaw run");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "the program ran: {out:?}");
    for want in [
        "cudaw: error: not starting ./vector_add: it links libcudart.so.13, and there is no \
         real CUDA 13 runtime for cudaw to forward to, so every CUDA call it makes would fail",
        "CUDAW_REAL_CUDART=",
        "no such file",
        "--device sim",
    ] {
        assert!(stderr.contains(want), "{want:?} missing from {stderr}");
    }
}

#[test]
fn a_copy_of_cudaw_outside_the_build_finds_its_libraries() {
    let Some(nvcc) = nvcc() else { return };
    let lib = shims();
    let exe = compile_program(&nvcc, "vector_add");
    let dir = folder_with(&exe);
    // As `cargo install --path crates/cli` leaves it: the binary alone in a bin folder.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(cudaw(), bin.join("cudaw")).unwrap();
    let mut cmd = clean(Command::new(bin.join("cudaw")));
    cmd.args(["run", "--device", "sim", "--", "./vector_add"])
        .current_dir(dir.path());
    let out = cmd.output().expect("running the copy");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), expected("vector_add"));
    // And what it sets names files of the source tree.
    let mut cmd = clean(Command::new(bin.join("cudaw")));
    cmd.args([
        "run",
        "--device",
        "sim",
        "--print-env",
        "--",
        "./vector_add",
    ])
    .current_dir(dir.path());
    let out = cmd.output().expect("running the copy");
    let env = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let preload = env
        .lines()
        .find_map(|l| l.strip_prefix("LD_PRELOAD="))
        .unwrap_or_else(|| panic!("no LD_PRELOAD in {env}"));
    let shim = preload.split(':').next_back().unwrap();
    assert!(Path::new(shim).is_file(), "{env}");
    let shim_dir = Path::new(shim).parent().unwrap().canonicalize().unwrap();
    let built = [lib.canonicalize().unwrap()];
    let tree = cudaw_tests::workspace().canonicalize().unwrap();
    assert!(
        built.contains(&shim_dir) || shim_dir.starts_with(&tree),
        "{shim_dir:?} is not the source tree's"
    );
    assert!(env.contains("CUDAW_LIBCUDA="), "{env}");
}

/// A pipe whose reading end is closed: every write to the other end fails with EPIPE,
/// as when `| head -1` has read its line and gone.
fn closed_pipe() -> Stdio {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is two writable ints, as pipe(2) needs.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe()");
    // SAFETY: pipe() returned these two fresh descriptors, owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

/// Runs `exe ARGS` with its standard output a closed pipe; asserts it exits 0 and says
/// nothing of a panic or a broken pipe.
fn quiet_on_a_closed_pipe(exe: &Path, args: &[&str], env: &[(&str, &Path)]) {
    let mut cmd = Command::new(exe);
    cmd.args(args).stdout(closed_pipe()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running the command");
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{} {args:?} on a closed pipe: {}\n{stderr}",
        exe.display(),
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{} {args:?}: {stderr}",
        exe.display()
    );
}

#[test]
fn no_command_panics_on_a_closed_stdout() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "vector_add");
    let exe_s = exe.to_str().unwrap();
    for args in [
        &["--help"][..],
        &["--version"],
        &["fatbin", exe_s],
        &["fatbin", exe_s, "--json"],
        &["run", "--device", "sim", "--print-env", "--", exe_s],
        &[
            "demo",
            "--device",
            "sim",
            "--mib",
            "4",
            "--iterations",
            "10",
        ],
        &["demo", "--help"],
    ] {
        quiet_on_a_closed_pipe(&cudaw(), args, &[]);
    }

    let Some(mut t) = Target::start(Addressing::Mapped, "pipe") else {
        return;
    };
    t.run(5);
    t.ok(&["dump", &t.pid, "-o", "a.img", "--leave-running"]);
    let img = t.path("a.img");
    let img_s = img.to_str().unwrap().to_owned();
    let pid = t.pid.clone();
    let run_dir = t.run_dir.clone();
    let env = [("CUDAW_RUN_DIR", run_dir.as_path())];
    for args in [
        &["--help"][..],
        &["inspect", &img_s, "--all"],
        &["inspect", &img_s, "--verify", "--json"],
        &["status", &pid],
        &["status", &pid, "--json"],
        &["status"],
        &["pause", &pid],
        &["status", &pid],
        &["resume", &pid],
    ] {
        quiet_on_a_closed_pipe(&cudaw_ckpt(), args, &env);
    }
    t.assert_running();
    t.finish();
}

/// Runs a command with `--json` that must fail: exactly one JSON line on stdout,
/// {"ok":false,"kind":KIND,"error":...}, the same message on stderr; returns it.
fn json_failure(exe: &Path, args: &[&str], kind: &str, code: i32) -> Value {
    let out = Command::new(exe)
        .args(args)
        .env_remove("CUDAW_LOG")
        .output()
        .expect("running the command");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stdout}{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{args:?}: {stdout:?}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{stdout:?}: {e}"));
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["kind"], kind, "{args:?}: {v}");
    let msg = v["error"].as_str().expect("an error message");
    assert!(!msg.is_empty());
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words(&stderr).contains(&words(msg)),
        "{args:?}: {msg:?} not in {stderr:?}"
    );
    v
}

#[test]
fn failures_under_json_have_one_shape_in_both_clis() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "no device code here\n").unwrap();
    let notes = notes.to_str().unwrap();
    let missing = dir.path().join("missing").to_str().unwrap().to_owned();
    let v = json_failure(&cudaw(), &["fatbin", notes, "--json"], "bad_input", 1);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no usable device code"),
        "{v}"
    );
    json_failure(&cudaw(), &["fatbin", &missing, "--json"], "io", 1);
    json_failure(&cudaw(), &["fatbin", "--json"], "usage", 2);
    json_failure(
        &cudaw(),
        &["demo", "--json", "--device", "nowhere"],
        "usage",
        2,
    );
    json_failure(&cudaw_ckpt(), &["inspect", notes, "--json"], "bad_image", 3);
    json_failure(&cudaw_ckpt(), &["pause", "--json"], "usage", 2);
    json_failure(
        &cudaw_ckpt(),
        &["status", "4000000000", "--json"],
        "no_process",
        1,
    );
    // --help lists the shape, in both.
    for exe in [cudaw(), cudaw_ckpt()] {
        let out = Command::new(&exe).arg("--help").output().unwrap();
        let help = text(&out.stdout);
        assert!(
            help.contains("{\"ok\":false,\"kind\":KIND,\"error\":MESSAGE}"),
            "{}: {help}",
            exe.display()
        );
    }
}

#[test]
fn restore_into_no_process_says_there_is_none() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.img");
    std::fs::write(&notes, "not an image\n").unwrap();
    let v = json_failure(
        &cudaw_ckpt(),
        &[
            "restore",
            "4000000000",
            "-i",
            notes.to_str().unwrap(),
            "--json",
        ],
        "no_process",
        1,
    );
    let e = v["error"].as_str().unwrap();
    assert!(
        e.starts_with("no process with PID 4000000000: nothing to restore into"),
        "{e}"
    );
    assert!(!e.contains("left unchanged"), "{e}");
    assert!(e.contains("not a cudaw image"), "{e}");
}

#[test]
fn another_processs_image_is_refused_saying_what_differs_and_whether_force_helps() {
    let Some(mut t) = Target::start(Addressing::Mapped, "force") else {
        return;
    };
    t.run(5);
    t.ok(&["dump", &t.pid, "-o", "a.img"]);
    let a = t.path("a.img");
    let pid = t.pid.clone();
    // Another process's image of the same table: --force is the way.
    let same = t.path("same.img");
    images::rewritten(&a, &same, |meta, _| meta.process.pid = 1);
    let err = t.fails(
        &["restore", &pid, "-i", same.to_str().unwrap()],
        3,
        "made by process 1 (",
    );
    assert!(
        err.contains("its allocation table matches this process's, so --force would restore it"),
        "{err}"
    );
    t.assert_paused_in(&a);
    // Another process's image of another table: --force cannot help, and the message says
    // what differs, with both values.
    let other = t.path("other.img");
    images::rewritten(&a, &other, |meta, table| {
        meta.process.pid = 1;
        table[5].size = 128;
        table[5].base += 1 << 36;
    });
    let err = t.fails(
        &["restore", &pid, "-i", other.to_str().unwrap()],
        3,
        "made by process 1 (",
    );
    for want in [
        "--force would not help",
        "its allocation table differs from the process's (the image has 6 allocations, the process 6): 1 differs in address, 1 differs in size; the first: allocation ",
        " in the image, ",
        " bytes in the image, ",
        "; then: allocation ",
    ] {
        assert!(err.contains(want), "{want:?} missing from {err}");
    }
    assert!(!err.contains("--force would restore"), "{err}");
    assert!(!err.contains("--force restores"), "{err}");
    let err = t.fails(
        &["restore", &pid, "-i", other.to_str().unwrap(), "--force"],
        3,
        "differs in size",
    );
    assert!(!err.contains("made by process 1"), "{err}");
    t.assert_paused_in(&a);
    t.ok(&["resume", &pid]);
    t.finish();
}

#[test]
fn the_socket_of_a_killed_process_is_removed_once() {
    let Some(mut t) = Target::start(Addressing::Mapped, "kill9") else {
        return;
    };
    t.run(3);
    let socket: PathBuf = t.socket();
    let pid = t.pid.clone();
    // kill -9: the shim cannot remove its socket.
    t.child.kill().expect("SIGKILL");
    t.child.wait().expect("reaping it");
    assert!(socket.exists(), "the socket went with the process");
    let out = t.ckpt(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let n: u64 = pid.parse().unwrap();
    assert_eq!(v["stale"], serde_json::json!([n]), "{v}");
    assert_eq!(v["removed"], serde_json::json!([n]), "{v}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("removed stale socket {}", socket.display()))
            && stderr.contains(&format!("no process {pid}")),
        "{stderr}"
    );
    assert!(!socket.exists(), "{} left behind", socket.display());
    // Said once: the next status is quiet.
    let out = t.ckpt(&["status"]);
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stderr).is_empty(), "{out:?}");
    assert!(
        text(&out.stdout).starts_with("no processes under cudaw"),
        "{out:?}"
    );
}

#[test]
fn only_sockets_of_processes_surely_gone_are_removed() {
    let dir = tempfile::Builder::new()
        .prefix("cudaw-nc-")
        .tempdir()
        .unwrap();
    // This test process is alive but runs no cudaw runtime: its PID's socket is stale.
    let me = std::process::id();
    let socket = dir.path().join(format!("{me}.sock"));
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    // A link named like a socket is neither followed nor removed.
    let target = dir.path().join("precious");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.path().join("4000000001.sock");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let status = || {
        let out = Command::new(cudaw_ckpt())
            .args(["status", "--json"])
            .env("CUDAW_RUN_DIR", dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, text(&out.stderr))
    };
    let (v, stderr) = status();
    assert_eq!(v["removed"], serde_json::json!([me]), "{v}");
    assert!(
        stderr.contains(&format!("process {me} does not run cudaw's runtime")),
        "{stderr}"
    );
    assert!(stderr.contains("is not a socket of yours"), "{stderr}");
    assert!(!socket.exists());
    let (v, stderr) = status();
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");
    assert_eq!(v["stale"], serde_json::json!([4000000001u64]), "{v}");
    assert!(!stderr.contains("removed stale socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert!(link.symlink_metadata().is_ok());
}

#[test]
fn a_cudaw_process_that_does_not_answer_keeps_its_socket() {
    let Some(mut t) = Target::start(Addressing::Mapped, "stop") else {
        return;
    };
    t.run(3);
    let pid: i32 = t.pid.parse().unwrap();
    // Stopped, it cannot answer (status gives up after its 10 s deadline), but it is
    // the socket's process: the socket stays.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let out = t.ckpt(&["status", "--json"]);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stale"], serde_json::json!([pid]), "{v}");
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("kept: process {pid} still runs")),
        "{stderr}"
    );
    assert!(t.socket().exists());
    t.assert_running();
    t.finish();
}
