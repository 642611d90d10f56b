//! Jobs (`cudaw-ckpt … --job PID`): a job of two processes, each on its own simulated
//! device, started by one shell under `cudaw run`, paused and resumed as a job at random
//! instants, dumped into a job folder and restored from it, and both outputs equal to the
//! uninterrupted run's (`ckpt_target.expected`).

mod ckpt_common;
use cudaw_tests::{
    compile_program, cudaw, cudaw_ckpt, expected, node_dir, nvcc, shims, simgpu, Rng,
};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A process group started by the test, killed whole when dropped (a failed test leaves
/// none of the ranks behind).
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's process group; no memory involved.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn ckpt(run_dir: &Path, args: &[&str]) -> Output {
    Command::new(cudaw_ckpt())
        .args(args)
        .env("CUDAW_RUN_DIR", run_dir)
        .output()
        .expect("running cudaw-ckpt")
}

fn ok_json(out: &Output, what: &str) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"))
}

/// Two `ckpt_target`s, on simulated devices 0 and 1, started by one shell under cudaw, each
/// reading its commands ("run K", "end") from a FIFO the test writes: they advance only when
/// told, so nothing here depends on timing.
struct TwoRanks {
    group: Group,
    run_dir: tempfile::TempDir,
    work: tempfile::TempDir,
    inputs: Vec<std::fs::File>,
}

impl TwoRanks {
    fn start(exe: &Path) -> TwoRanks {
        let e = format!("'{}'", exe.display());
        TwoRanks::start_with([e.clone(), e], "ckpt_target:")
    }

    /// Two ranks: `commands[r]` (shell words; `{w}` names the work folder) with
    /// CUDA_VISIBLE_DEVICES=r; started once both outputs have a line beginning `ready`.
    fn start_with(commands: [String; 2], ready: &str) -> TwoRanks {
        TwoRanks::start_with_env(commands, ready, &[])
    }

    /// As [`TwoRanks::start_with`], with `env` set for the job's processes too.
    fn start_with_env(commands: [String; 2], ready: &str, env: &[(&str, &str)]) -> TwoRanks {
        let run_dir = tempfile::Builder::new()
            .prefix("cj")
            .tempdir_in("/tmp")
            .unwrap();
        let work = tempfile::tempdir().unwrap();
        for r in 0..2 {
            let fifo = std::ffi::CString::new(work.path().join(format!("in{r}")).to_str().unwrap())
                .unwrap();
            // SAFETY: mkfifo(3) on a NUL-terminated path we own.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
        }
        let sim = simgpu();
        let w = work.path().display().to_string();
        let script = format!(
            "CUDA_VISIBLE_DEVICES=0 {c0} <'{w}/in0' >'{w}/out0' 2>'{w}/err0' & \
             CUDA_VISIBLE_DEVICES=1 {c1} <'{w}/in1' >'{w}/out1' 2>'{w}/err1' & wait",
            c0 = commands[0].replace("{w}", &w),
            c1 = commands[1].replace("{w}", &w),
        );
        let mut cmd = Command::new(cudaw());
        cmd.arg("run")
            .arg("--lib-dir")
            .arg(shims())
            .arg("--real-cudart")
            .arg(&sim)
            .args(["--", "sh", "-c", &script])
            .env("CUDAW_LIBCUDA", &sim)
            .env("CUDAW_NODE_DIR", node_dir())
            .env("CUDAW_RUN_DIR", run_dir.path())
            .env("CUDAW_LOG", "info")
            .env("SIMGPU_MEM", "4G")
            .env("SIMGPU_DEVICES", "2")
            .env_remove("LD_PRELOAD")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .process_group(0);
        let group = Group(cmd.spawn().expect("starting the job"));
        // A FIFO opens for writing once its reader has it open (the rank's redirection):
        // non-blocking tries until then, so a job that never starts fails the test.
        let inputs = (0..2)
            .map(|r| {
                use std::os::unix::fs::OpenOptionsExt;
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    match std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(work.path().join(format!("in{r}")))
                    {
                        Ok(f) => break f,
                        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                            assert!(Instant::now() < deadline, "rank {r} never opened its input");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => panic!("opening rank {r}'s input: {e}"),
                    }
                }
            })
            .collect();
        let ranks = TwoRanks {
            group,
            run_dir,
            work,
            inputs,
        };
        // Each rank prints its first line once its memory is allocated (a bounded wait for
        // an event, not a timing assumption).
        ranks.wait_for(
            |out| out.lines().any(|l| l.starts_with(ready)),
            "the ranks' first line",
        );
        ranks
    }

    /// Sends `line` to both ranks.
    fn send(&mut self, line: &str) {
        use std::io::Write;
        for f in &mut self.inputs {
            writeln!(f, "{line}").expect("writing a rank's input");
        }
    }

    fn wait_for(&self, done: impl Fn(&str) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !(0..2).all(|r| done(&self.output(r))) {
            assert!(Instant::now() < deadline, "{what}: not within 120 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Tells both ranks to run `k` more iterations (not waiting for them).
    fn run(&mut self, k: u32) {
        use std::io::Write;
        for f in &mut self.inputs {
            writeln!(f, "run {k}").expect("writing a rank's input");
        }
    }

    fn pid(&self) -> String {
        self.group.0.id().to_string()
    }

    fn output(&self, rank: usize) -> String {
        std::fs::read_to_string(self.work.path().join(format!("out{rank}"))).unwrap_or_default()
    }

    /// Rank `rank`'s log (its standard error).
    fn log(&self, rank: usize) -> String {
        std::fs::read_to_string(self.work.path().join(format!("err{rank}"))).unwrap_or_default()
    }

    /// Waits (up to 120 s) until `done` holds for both ranks' logs.
    fn wait_for_log(&self, done: impl Fn(&str) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !(0..2).all(|r| done(&self.log(r))) {
            assert!(
                Instant::now() < deadline,
                "{what}: not within 120 s\n{}\n{}",
                self.log(0),
                self.log(1)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn ckpt(&self, args: &[&str]) -> Output {
        ckpt(self.run_dir.path(), args)
    }

    fn states(&self) -> Vec<String> {
        let v = ok_json(
            &self.ckpt(&["status", &self.pid(), "--job", "--json"]),
            "status --job",
        );
        v["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|p| p["state"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    /// Ends the ranks' input (they run the rest and print their checksums): both outputs
    /// without the "ran" lines.
    fn finish(mut self) -> (String, String) {
        self.inputs.clear();
        let status = cudaw_tests::wait_timeout(&mut self.group.0, Duration::from_secs(300))
            .expect("the job did not end within 300 s");
        let errs: Vec<String> = (0..2)
            .map(|r| {
                std::fs::read_to_string(self.work.path().join(format!("err{r}")))
                    .unwrap_or_default()
            })
            .collect();
        assert!(
            status.success(),
            "the job failed: {status:?}\n{}",
            errs.join("\n")
        );
        let strip = |s: String| -> String {
            s.lines()
                .filter(|l| !l.starts_with("ran "))
                .map(|l| format!("{l}\n"))
                .collect()
        };
        (strip(self.output(0)), strip(self.output(1)))
    }
}

fn job_image(dir: &Path) -> PathBuf {
    dir.join("job")
}

#[test]
fn a_job_of_two_ranks_pauses_dumps_and_restores_as_one() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "ckpt_target");
    let want = expected("ckpt_target");
    let mut job = TwoRanks::start(&exe);
    let pid = job.pid();
    let seed = std::env::var("CUDAW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0026);
    eprintln!("seed {seed} (CUDAW_TEST_SEED replays it)");
    let mut rng = Rng(seed);

    for i in 0..3 {
        // The ranks work while the job is paused: wherever their kernels and copies are.
        job.run(10 + rng.below(20) as u32);
        rng.sleep_us(5_000);
        let p = ok_json(
            &job.ckpt(&["pause", &pid, "--job", "--json"]),
            "pause --job",
        );
        let members = p["members"].as_array().expect("members");
        // Both ranks; the shell serves no socket (it never loaded CUDA).
        assert_eq!(members.len(), 2, "pause {i}: {p}");
        assert!(p["attempts"].as_u64().unwrap() >= 1, "{p}");
        assert!(
            members.iter().all(|m| m["changed"] == true),
            "pause {i}: {p}"
        );
        assert_eq!(job.states(), ["paused", "paused"], "pause {i}");
        let r = ok_json(
            &job.ckpt(&["resume", &pid, "--job", "--json"]),
            "resume --job",
        );
        assert_eq!(r["members"].as_array().unwrap().len(), 2, "{r}");
        assert_eq!(job.states(), ["running", "running"], "resume {i}");
    }

    job.run(30);
    // A job image: one image per rank and the manifest; the ranks stay paused, their memory
    // only in the images, until restored from them.
    let dir = job_image(job.work.path());
    let d = ok_json(
        &job.ckpt(&["dump", &pid, "--job", "-o", dir.to_str().unwrap(), "--json"]),
        "dump --job",
    );
    assert_eq!(d["members"].as_array().unwrap().len(), 2, "{d}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("job.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "cudaw-job/1");
    let mut uuids = Vec::new();
    for m in manifest["members"].as_array().unwrap() {
        let img = dir.join(m["image"].as_str().unwrap());
        assert!(img.is_file(), "{} missing", img.display());
        let i = ok_json(
            &job.ckpt(&["inspect", img.to_str().unwrap(), "--json"]),
            "inspect",
        );
        uuids.push(i["gpu"]["uuid"].as_str().unwrap_or_default().to_owned());
    }
    // Each rank saw one device (CUDA_VISIBLE_DEVICES), a different one.
    assert_eq!(uuids.len(), 2);
    assert_ne!(uuids[0], uuids[1], "both ranks on one device: {uuids:?}");
    assert_eq!(job.states(), ["paused", "paused"]);
    let r = ok_json(
        &job.ckpt(&[
            "restore",
            &pid,
            "--job",
            "-i",
            dir.to_str().unwrap(),
            "--json",
        ]),
        "restore --job",
    );
    assert_eq!(r["members"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(job.states(), ["running", "running"]);

    // A folder that holds no job image is refused before anything is touched.
    let empty = job.work.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = job.ckpt(&[
        "restore",
        &pid,
        "--job",
        "-i",
        empty.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "bad_image", "{v}");
    assert!(v["error"].as_str().unwrap().contains("job.json"), "{v}");
    assert_eq!(job.states(), ["running", "running"]);

    // Once more, left running.
    job.run(30);
    ok_json(
        &job.ckpt(&[
            "dump",
            &pid,
            "--job",
            "-o",
            dir.to_str().unwrap(),
            "--leave-running",
            "--json",
        ]),
        "dump --job --leave-running",
    );
    assert_eq!(job.states(), ["running", "running"]);

    let (out0, out1) = job.finish();
    assert_eq!(out0, want, "rank 0's output");
    assert_eq!(out1, want, "rank 1's output");
}

#[test]
fn a_job_with_no_process_under_cudaw_is_refused_by_kind() {
    let run_dir = tempfile::tempdir().unwrap();
    // Our own PID: a process, with no control socket in its tree.
    let me = std::process::id().to_string();
    let out = ckpt(run_dir.path(), &["pause", &me, "--job", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "not_under_cudaw", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no process under cudaw"),
        "{v}"
    );
    // A PID that is no process.
    let out = ckpt(run_dir.path(), &["resume", "999999999", "--job", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "no_process", "{v}");
}

/// One raw request line to process `pid`'s socket in `run_dir`: its reply.
fn raw(run_dir: &Path, pid: u32, line: &str) -> serde_json::Value {
    ckpt_common::raw(&run_dir.join(format!("{pid}.sock")), line)
}

#[test]
fn a_hold_is_released_undone_by_a_pause_and_ends_at_its_lease() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "ckpt_target");
    let mut job = TwoRanks::start(&exe);
    job.run(5);
    let v = ok_json(
        &job.ckpt(&["status", &job.pid(), "--job", "--json"]),
        "status",
    );
    let rank = v["members"][0]["pid"].as_u64().unwrap() as u32;
    let dir = job.run_dir.path();
    let state = || raw(dir, rank, "{\"cmd\":\"status\"}\n")["status"]["state"].clone();

    // Held: calls wait, memory stays; a release lets them go.
    let h = raw(dir, rank, "{\"cmd\":\"hold\",\"window_ms\":5000}\n");
    assert_eq!(h["ok"], true, "{h}");
    assert_eq!(h["hold"]["changed"], true, "{h}");
    assert_eq!(h["hold"]["idle"], true, "a lone rank drains: {h}");
    assert_eq!(state(), "held");
    let again = raw(dir, rank, "{\"cmd\":\"hold\",\"window_ms\":100}\n");
    assert_eq!(again["hold"]["changed"], false, "{again}");
    let r = raw(dir, rank, "{\"cmd\":\"release\"}\n");
    assert_eq!(r["release"]["changed"], true, "{r}");
    assert_eq!(state(), "running");
    let r = raw(dir, rank, "{\"cmd\":\"release\"}\n");
    assert_eq!(r["release"]["changed"], false, "nothing to release: {r}");

    // A pause takes a hold over; the resume undoes both.
    raw(dir, rank, "{\"cmd\":\"hold\",\"window_ms\":5000}\n");
    let p = raw(dir, rank, "{\"cmd\":\"pause\"}\n");
    assert_eq!(p["pause"]["changed"], true, "{p}");
    assert_eq!(state(), "paused");
    let h = raw(dir, rank, "{\"cmd\":\"hold\"}\n");
    assert_eq!(h["hold"]["idle"], true, "a paused process is at rest: {h}");
    let r = raw(dir, rank, "{\"cmd\":\"resume\"}\n");
    assert_eq!(r["resume"]["changed"], true, "{r}");
    assert_eq!(state(), "running");

    // A hold nobody follows up ends by itself.
    raw(
        dir,
        rank,
        "{\"cmd\":\"hold\",\"window_ms\":5000,\"lease_ms\":200}\n",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while state() != "running" {
        assert!(
            Instant::now() < deadline,
            "the hold outlived its lease by 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (out0, out1) = job.finish();
    let want = expected("ckpt_target");
    assert_eq!(out0, want);
    assert_eq!(out1, want);
}

#[test]
fn a_rank_that_does_not_answer_fails_the_job_pause_and_the_others_run_on() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "ckpt_target");
    let mut job = TwoRanks::start(&exe);
    let v = ok_json(
        &job.ckpt(&["status", &job.pid(), "--job", "--json"]),
        "status",
    );
    let pids: Vec<i32> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_i64().unwrap() as i32)
        .collect();
    assert_eq!(pids.len(), 2, "{v}");
    // A stopped rank: its control thread cannot answer.
    // SAFETY: kill(2) on a process of the test's own job.
    unsafe { libc::kill(pids[1], libc::SIGSTOP) };
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    let cont = Cont(pids[1]);
    let out = job.ckpt(&["pause", &job.pid(), "--job", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["kind"], "timeout", "{e}");
    let msg = e["error"].as_str().unwrap();
    assert!(
        msg.contains(&pids[1].to_string()),
        "names the silent rank: {msg}"
    );
    assert!(msg.contains("released"), "{msg}");
    // The other rank was let go: it runs, and takes work.
    let s = raw(job.run_dir.path(), pids[0] as u32, "{\"cmd\":\"status\"}\n");
    assert_eq!(s["status"]["state"], "running", "{s}");
    drop(cont);
    // The stopped rank, continued, serves the hold and the release it was sent, in order.
    let deadline = Instant::now() + Duration::from_secs(60);
    while raw(job.run_dir.path(), pids[1] as u32, "{\"cmd\":\"status\"}\n")["status"]["state"]
        != "running"
    {
        assert!(Instant::now() < deadline, "the continued rank stayed held");
        std::thread::sleep(Duration::from_millis(20));
    }
    job.run(10);
    let (out0, out1) = job.finish();
    let want = expected("ckpt_target");
    assert_eq!(out0, want);
    assert_eq!(out1, want);
}

/// The memory two ranks share (ipc_pair: each exports a cuMem buffer through a POSIX
/// descriptor, the other imports it, as NCCL's P2P transport does), evicted with the job by
/// `pause --job` (not with `--keep-shared`) and brought back at the same addresses by
/// `resume --job`.
#[test]
fn a_job_pause_evicts_the_memory_the_ranks_share() {
    job_shares_memory(false);
}

/// As [`a_job_pause_evicts_the_memory_the_ranks_share`], with the host arena on
/// (`CUDAW_HOST_ARENA=pinned`): each rank's export goes into its arena with its job, and
/// comes back from there before the importers map it again.
#[test]
fn a_job_pause_evicts_the_memory_the_ranks_share_into_the_host_arena() {
    job_shares_memory(true);
}

fn job_shares_memory(arena: bool) {
    let Some(nvcc) = nvcc() else { return };
    let exe = cudaw_tests::compile(
        &nvcc,
        "ipc_pair",
        &cudaw_tests::workspace().join("tests/cuda/ipc/ipc_pair.cu"),
    );
    let cmd = |r: usize| format!("'{}' {r} '{{w}}/pair.sock'", exe.display());
    let env: &[(&str, &str)] = if arena {
        &[("CUDAW_HOST_ARENA", "pinned")]
    } else {
        &[]
    };
    let mut job = TwoRanks::start_with_env([cmd(0), cmd(1)], "ready rank=", env);
    let pid = job.pid();
    // Each job pause that evicts the shared memory leaves the rank's export in its arena.
    let in_arena = "of 1 driver handles (";
    let exports_in_arena = |job: &TwoRanks, n: usize| {
        if arena {
            job.wait_for_log(
                |log| {
                    log.lines()
                        .filter(|l| l.contains(in_arena) && l.ends_with("left in the host arena"))
                        .count()
                        >= n
                },
                &format!("{n} pauses leaving the export in the host arena"),
            );
        } else {
            assert!((0..2).all(|r| !job.log(r).contains("left in the host arena")));
        }
    };
    if arena {
        // Made while the ranks run, their memory holding still: before the first pause.
        job.wait_for_log(
            |log| log.contains("page-locked, ready in"),
            "the host arenas",
        );
    }
    let ran = |job: &TwoRanks, n: u32| {
        job.wait_for(
            |out| out.lines().any(|l| l == format!("ran {n}")),
            &format!("ran {n}"),
        )
    };
    job.send("run 5");
    ran(&job, 5);
    let resident = |job: &TwoRanks| -> Vec<u64> {
        let v = ok_json(
            &job.ckpt(&["status", &job.pid(), "--job", "--json"]),
            "status",
        );
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d["resident"].as_u64().unwrap_or(0))
                    .sum()
            })
            .collect()
    };
    assert!(
        resident(&job).iter().all(|&r| r > 0),
        "{:?}",
        resident(&job)
    );

    for round in 0..3u32 {
        if round == 2 {
            // --keep-shared: the shared buffers stay on the devices, the rest is evicted.
            let p = ok_json(
                &job.ckpt(&["pause", &pid, "--job", "--keep-shared", "--json"]),
                "pause --job --keep-shared",
            );
            assert!(p.get("shared").is_none(), "{p}");
            assert!(
                resident(&job).iter().all(|&r| r > 0),
                "{:?}",
                resident(&job)
            );
            // Every rank evicted its own buffer all the same.
            assert!(
                p["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|m| m["bytes"].as_u64().unwrap_or(0) > 0)
                    .count()
                    == 2,
                "{p}"
            );
        } else {
            let p = ok_json(
                &job.ckpt(&["pause", &pid, "--job", "--json"]),
                "pause --job",
            );
            assert_eq!(p["shared"]["exports"], 2, "round {round}: {p}");
            assert_eq!(p["shared"]["imports"], 2, "round {round}: {p}");
            assert_eq!(p["shared"]["unpaired"], 0, "round {round}: {p}");
            // Nothing of the shared buffers stays on a device.
            assert_eq!(resident(&job), [0, 0], "round {round}");
            exports_in_arena(&job, round as usize + 1);
            // One rank alone cannot come back: its import needs the other's export.
            let rank0 = p["members"][0]["pid"].as_u64().unwrap().to_string();
            let lone = job.ckpt(&["resume", &rank0, "--json"]);
            assert_eq!(lone.status.code(), Some(1), "{lone:?}");
            assert!(
                String::from_utf8_lossy(&lone.stdout).contains("resume the whole job"),
                "{lone:?}"
            );
        }
        if round < 2 {
            // A job image leaves the shared memory out: a dump of the paused job brings it
            // back onto the devices for the dump, and evicts it again after (the job stays
            // paused, its GPUs empty).
            let dir = job.work.path().join(format!("img{round}"));
            let d = ok_json(
                &job.ckpt(&["dump", &pid, "--job", "-o", dir.to_str().unwrap(), "--json"]),
                "dump --job of a job paused with its shared memory evicted",
            );
            assert_eq!(d["shared"]["exports"], 2, "round {round}: {d}");
            assert_eq!(d["shared"]["imports"], 2, "round {round}: {d}");
            assert_eq!(job.states(), ["paused", "paused"]);
            assert_eq!(resident(&job), [0, 0], "round {round}");
            if round == 1 {
                // A restore brings the shared memory back before loading the images, and
                // the job runs on from them.
                ok_json(
                    &job.ckpt(&[
                        "restore",
                        &pid,
                        "--job",
                        "-i",
                        dir.to_str().unwrap(),
                        "--json",
                    ]),
                    "restore --job of a job paused with its shared memory evicted",
                );
            }
        }
        if round != 1 {
            ok_json(
                &job.ckpt(&["resume", &pid, "--job", "--json"]),
                "resume --job",
            );
        }
        assert_eq!(job.states(), ["running", "running"]);
        job.send("run 5");
        ran(&job, 10 + 5 * round);
    }
    job.send("digest");
    job.wait_for(
        |out| out.lines().any(|l| l.starts_with("digest ")),
        "the digests",
    );
    for r in 0..2 {
        let out = job.output(r);
        let line = out.lines().find(|l| l.starts_with("digest ")).unwrap();
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap()
                .to_owned()
        };
        assert_eq!(field("got="), field("expected="), "rank {r}: {line}");
    }
    job.send("end");
    job.finish();
}

/// `cudaw-ckpt ARGS` against `job` on two simulated GPUs whose driver checkpoints into
/// `checkpoints` (simgpu's checkpoint API), with `env` beside.
fn migrate_cmd(job: &TwoRanks, checkpoints: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(cudaw_ckpt())
        .args(args)
        .env("CUDAW_RUN_DIR", job.run_dir.path())
        .env("CUDAW_LIBCUDA", simgpu())
        .env("SIMGPU_CHECKPOINT_DIR", checkpoints)
        .env("SIMGPU_DEVICES", "2")
        .env("SIMGPU_MEM", "4G")
        .envs(env.iter().copied())
        .output()
        .expect("running cudaw-ckpt")
}

/// `ckpt_target` built, its expected output, and a folder for simgpu's checkpoints (under
/// /tmp: its socket paths must be short); `None` without nvcc.
fn target_and_checkpoints(prefix: &str) -> Option<(PathBuf, String, tempfile::TempDir)> {
    let nvcc = nvcc()?;
    let exe = compile_program(&nvcc, "ckpt_target");
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    Some((exe, expected("ckpt_target"), dir))
}

#[test]
fn a_job_migrates_its_ranks_onto_each_others_gpus_and_back() {
    let Some((exe, want, sockets)) = target_and_checkpoints("cjm") else {
        return;
    };
    let sd = sockets.path().to_str().unwrap().to_owned();
    let e = format!("'{}'", exe.display());
    let mut job = TwoRanks::start_with_env(
        [e.clone(), e],
        "ckpt_target:",
        &[("SIMGPU_CHECKPOINT_DIR", &sd)],
    );
    let pid = job.pid();
    let migrate = |job: &TwoRanks, to: &str| {
        let out = migrate_cmd(
            job,
            &sd,
            &["migrate", &pid, "--job", "--to", to, "--json"],
            &[],
        );
        ok_json(&out, &format!("migrate --job --to {to}"))
    };
    let gpus = |job: &TwoRanks| -> Vec<String> {
        let v = ok_json(
            &job.ckpt(&["status", &job.pid(), "--job", "--json"]),
            "status --job",
        );
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["devices"][0]["gpu"].as_str().unwrap_or("?").to_owned())
            .collect()
    };
    let uuid = |i| simgpu::config::uuid_text(&simgpu::config::uuid_of(i));
    job.run(7);
    // A driver without the API: nothing moves, the job runs on where it was; a job found
    // paused stays paused.
    let refused = |job: &TwoRanks| {
        let out = migrate_cmd(
            job,
            &sd,
            &["migrate", &pid, "--job", "--to", "1,0"],
            &[("SIMGPU_CHECKPOINT", "unsupported")],
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("not moved: ") && err.contains("CUDA_ERROR_NOT_SUPPORTED"),
            "{err}"
        );
        err
    };
    let err = refused(&job);
    assert!(err.contains("the job runs where it was"), "{err}");
    assert_eq!(job.states(), ["running", "running"]);
    assert_eq!(gpus(&job), [uuid(0), uuid(1)]);
    ok_json(
        &job.ckpt(&["pause", &pid, "--job", "--json"]),
        "pause --job",
    );
    refused(&job);
    assert_eq!(job.states(), ["paused", "paused"]);
    ok_json(
        &job.ckpt(&["resume", &pid, "--job", "--json"]),
        "resume --job",
    );
    assert_eq!(gpus(&job), [uuid(0), uuid(1)]);
    // The ranks swap GPUs (each GPU's ledger counts what the other rank leaves), run, and
    // swap back by OLD=NEW.
    let m = migrate(&job, "1,0");
    let members = m["members"].as_array().expect("members");
    assert_eq!(members.len(), 2, "{m}");
    assert!(
        members
            .iter()
            .all(|x| x["moved"].as_array().unwrap().len() == 1),
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
    assert_eq!(job.states(), ["running", "running"]);
    assert_eq!(
        gpus(&job),
        [uuid(1), uuid(0)],
        "{m}\n{}\n{}",
        job.log(0),
        job.log(1)
    );
    job.run(9);
    migrate(&job, "0=1,1=0");
    assert_eq!(gpus(&job), [uuid(0), uuid(1)]);
    job.run(5);
    let (a, b) = job.finish();
    assert_eq!(a, want, "rank 0 after two migrations");
    assert_eq!(b, want, "rank 1 after two migrations");
}

#[test]
fn a_member_on_no_gpu_pauses_with_the_job_and_stays_out_of_its_move() {
    // torchrun's launcher loads CUDA's runtime under cudaw, asks it how many GPUs there
    // are, and never uses one: here a Python child of rank 0 that does the same and ends
    // when rank 0 does.
    let Some((exe, want, sockets)) = target_and_checkpoints("cji") else {
        return;
    };
    let sd = sockets.path().to_str().unwrap().to_owned();
    let idle_py = sockets.path().join("idle.py");
    std::fs::write(
        &idle_py,
        "import ctypes, os, sys, time\n\
         rt = ctypes.CDLL(sys.argv[1])\n\
         n = ctypes.c_int()\n\
         rt.cudaGetDeviceCount(ctypes.byref(n))\n\
         parent = os.getppid()\n\
         while os.getppid() == parent:\n    time.sleep(0.05)\n",
    )
    .unwrap();
    let e = format!("'{}'", exe.display());
    let with_idle = format!(
        "sh -c \"python3 '{}' '{}' & exec {e}\"",
        idle_py.display(),
        shims().join("libcudart.so.13").display()
    );
    let mut job = TwoRanks::start_with_env(
        [with_idle, e],
        "ckpt_target:",
        &[("SIMGPU_CHECKPOINT_DIR", &sd)],
    );
    let pid = job.pid();
    job.run(3);
    // The idle member is one of the job's.
    let deadline = Instant::now() + Duration::from_secs(30);
    while job.states().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the idle member never joined: {:?}",
            job.states()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = migrate_cmd(
        &job,
        &sd,
        &["migrate", &pid, "--job", "--to", "1,0", "--json"],
        &[],
    );
    let m = ok_json(&out, "migrate --job with a member on no GPU");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uses no GPU"), "{err}");
    let members = m["members"].as_array().expect("members");
    assert_eq!(
        members.len(),
        2,
        "the ranks moved, the idle member not: {m}"
    );
    assert_eq!(job.states(), ["running", "running", "running"]);
    job.run(4);
    let (a, b) = job.finish();
    assert_eq!(a, want, "rank 0 after the move");
    assert_eq!(b, want, "rank 1 after the move");
}

#[test]
fn status_names_the_job_and_the_threads_waiting_at_a_held_gate() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "ckpt_target");
    let e = format!("'{}'", exe.display());
    let mut job = TwoRanks::start_with_env([e.clone(), e], "ckpt_target:", &[("CUDAW_JOB", "t28")]);
    job.run(3);
    let v = ok_json(
        &job.ckpt(&["status", &job.pid(), "--job", "--json"]),
        "status",
    );
    let members = v["members"].as_array().unwrap();
    assert!(members.iter().all(|m| m["job"] == "t28"), "{v}");
    let rank = members[0]["pid"].as_u64().unwrap() as u32;
    let dir = job.run_dir.path().to_path_buf();
    let status = || raw(&dir, rank, "{\"cmd\":\"status\"}\n")["status"].clone();
    assert!(
        status().get("waiting").is_none(),
        "nobody waits: {}",
        status()
    );
    // Held, the rank's next iterations wait at the gate: status counts the thread.
    let h = raw(&dir, rank, "{\"cmd\":\"hold\",\"window_ms\":5000}\n");
    assert_eq!(h["hold"]["idle"], true, "{h}");
    job.run(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while status()["waiting"].as_u64().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "no thread waiting: {}", status());
        std::thread::sleep(Duration::from_millis(10));
    }
    raw(&dir, rank, "{\"cmd\":\"release\"}\n");
    let (out0, out1) = job.finish();
    let want = expected("ckpt_target");
    assert_eq!(out0, want);
    assert_eq!(out1, want);
}
