//! The driver layer (cudaw's `libcuda.so.1`) on simgpu: `tests/cuda/driver/driver_launch.cu`
//! never calls the runtime and fetches every driver function through `cuGetProcAddress`,
//! as cuBLAS, NCCL and Triton do. Under `cudaw run` its launches are counted per kernel
//! name, and while the process is paused (`SIGUSR1`) a launch does not return until resume
//! (`SIGUSR2`).

use cudaw_tests::{
    command_under_cudaw, compile, compile_fatbin, cudaw_ckpt, nvcc, shims, workspace, Addressing,
};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

const LAUNCHES: usize = 12;

/// The program and its module, compiled.
fn program() -> Option<(PathBuf, PathBuf)> {
    let nvcc = nvcc()?;
    let dir = workspace().join("tests/cuda/driver");
    let exe = compile(&nvcc, "driver_launch", &dir.join("driver_launch.cu"));
    let module = compile_fatbin(&nvcc, "scale_module", &dir.join("scale_module.cu"));
    Some((exe, module))
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line containing `what`, keeping every line read in `seen`.
fn wait_for(rx: &Receiver<String>, what: &str, seen: &mut Vec<String>) -> String {
    loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                seen.push(line.clone());
                if line.contains(what) {
                    return line;
                }
            }
            Err(_) => panic!("no line with {what:?}; so far:\n{}", seen.join("\n")),
        }
    }
}

/// As [`wait_for`], but `false` when the stream ends first (the program exited).
fn wait_for_or_exit(rx: &Receiver<String>, what: &str, seen: &mut Vec<String>) -> bool {
    loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                seen.push(line.clone());
                if line.contains(what) {
                    return true;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return false,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no line with {what:?}; so far:\n{}", seen.join("\n"))
            }
        }
    }
}

#[test]
fn launches_fetched_through_cu_get_proc_address_are_counted_by_name() {
    let Some((exe, module)) = program() else {
        return;
    };
    let counts = std::env::temp_dir().join(format!("cudaw-driver-counts-{}", std::process::id()));
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
    cmd.arg(&module)
        .env("CUDAW_KERNEL_COUNTS", &counts)
        .env("CUDAW_LOG", "info");
    let out = cmd.output().expect("running driver_launch");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "driver_launch failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("fetched 12 functions through cuGetProcAddress"));
    assert!(stdout.contains(&format!("{LAUNCHES} launches, results correct")));
    assert!(
        stderr.contains("driver info: forwarding"),
        "the driver layer did not load:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "driver info: {LAUNCHES} kernel launches of 1 kernels"
        )),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&counts).expect("the kernel counts file");
    let _ = std::fs::remove_file(&counts);
    assert_eq!(
        text,
        format!("{LAUNCHES}\t_Z5scalePfif\n# graph launches 0\n# modules loaded 1\n")
    );
}

#[test]
fn a_driver_launch_waits_while_paused() {
    let Some((exe, module)) = program() else {
        return;
    };
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
    cmd.arg(&module)
        .arg("30") // ms between launches
        .env("CUDAW_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting driver_launch"));
    let out = lines_of(child.stdout.take().expect("stdout"));
    let log = lines_of(child.stderr.take().expect("stderr"));
    let pid = i32::try_from(child.id()).expect("pid");
    let (mut seen_out, mut seen_log) = (Vec::new(), Vec::new());
    wait_for(&log, "pause on signal", &mut seen_log);
    wait_for(&out, "launched 2", &mut seen_out);

    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    wait_for(&log, "paused: ", &mut seen_log);
    // Lines the program wrote before the pause may still be on their way to this test (the
    // signal can land several launches after "launched 2" on a loaded machine, and stdout
    // and the log are read by different threads): take what arrives within 300 ms as
    // written before the pause. A launch that was already past the gate may still report;
    // after it, nothing may.
    loop {
        match out.recv_timeout(Duration::from_millis(300)) {
            Ok(line) => seen_out.push(line),
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => panic!("driver_launch exited while paused"),
        }
    }
    let mut after_pause = Vec::new();
    loop {
        match out.recv_timeout(Duration::from_millis(600)) {
            Ok(line) => after_pause.push(line),
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => panic!("driver_launch exited while paused"),
        }
    }
    assert!(
        after_pause.len() <= 1,
        "launches went on while paused: {after_pause:?}"
    );
    let launched_before_resume = seen_out.len() + after_pause.len();

    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
    wait_for(&log, "resumed", &mut seen_log);
    let last = wait_for(&out, "results correct", &mut seen_out);
    assert!(last.contains(&format!("{LAUNCHES} launches")));
    assert!(
        launched_before_resume < LAUNCHES + 2,
        "every launch ran before the resume: the gate did not hold"
    );
    let status = child.wait().expect("waiting for driver_launch");
    assert!(status.success(), "driver_launch failed: {seen_log:?}");
}

/// `expandable.cu` under cudaw, driver layer or not, with `env` too, its stdin piped.
fn expandable_with(
    mode: &str,
    driver_layer: bool,
    env: &[(&str, &str)],
) -> Option<cudaw_tests::KillOnDrop> {
    let nvcc = nvcc()?;
    let dir = workspace().join("tests/cuda/driver");
    let exe = compile(&nvcc, "expandable", &dir.join("expandable.cu"));
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, env);
    if !driver_layer {
        // `cudaw run --no-driver-layer --lib-dir ... -- PROGRAM`: the flag before `--`.
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        let mut c = std::process::Command::new(cmd.get_program());
        c.arg(&args[0]).arg("--no-driver-layer").args(&args[1..]);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        cmd = c;
    }
    cmd.arg(mode)
        .env("CUDAW_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Some(cudaw_tests::KillOnDrop(
        cmd.spawn().expect("starting expandable"),
    ))
}

/// The numbers of a `paused:` line: (allocations, bytes evicted, bytes still mapped,
/// driver handles evicted).
fn paused_numbers(line: &str) -> (u64, u64, u64, u64) {
    let n = |after: &str| -> u64 {
        let rest = line.split_once(after).expect(after).1.trim_start();
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
            .expect(after)
    };
    (
        n("paused: "),
        n("allocations, "),
        n("; "),
        n("driver handles: "),
    )
}

/// The line a pause logs when it leaves all 8 of `expandable`'s handles in the host arena.
const HANDLES_IN_ARENA: &str =
    "pause: device 0: 8 of 8 driver handles (16777216 bytes) left in the host arena";

/// With `CUDAW_HOST_ARENA=pinned`: waits (after the program's `cudaMalloc`, which follows
/// "ready") until the control thread has made a host arena large enough for the program's
/// allocation and its 8 handles (an arena made before the `cudaMalloc` is replaced by a
/// larger one once the memory holds still again).
fn wait_for_arena(log: &Receiver<String>, seen: &mut Vec<String>) {
    loop {
        let line = wait_for(log, "page-locked, ready in", seen);
        let bytes: u64 = line
            .split_once("host arena for device 0: ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no size in {line:?}"));
        if bytes > 8 * (2 << 20) {
            return;
        }
    }
}

/// Pauses and resumes `expandable` `cycles` times, checking the pattern after each resume.
fn expandable_cycles(mode: &str, driver_layer: bool, cycles: usize) {
    expandable_cycles_with(mode, driver_layer, cycles, false);
}

/// As [`expandable_cycles`], with the host arena on when `arena`: every pause leaves the
/// handles' bytes in it (and says so), every resume loads them from there.
fn expandable_cycles_with(mode: &str, driver_layer: bool, cycles: usize, arena: bool) {
    use std::io::Write;
    let env: &[(&str, &str)] = if arena {
        &[("CUDAW_HOST_ARENA", "pinned")]
    } else {
        &[]
    };
    let Some(mut child) = expandable_with(mode, driver_layer, env) else {
        return;
    };
    let mut stdin = child.stdin.take().expect("stdin");
    let out = lines_of(child.stdout.take().expect("stdout"));
    let log = lines_of(child.stderr.take().expect("stderr"));
    let pid = i32::try_from(child.id()).expect("pid");
    let (mut seen_out, mut seen_log) = (Vec::new(), Vec::new());
    wait_for(&out, "ready: 8 chunks", &mut seen_out);
    wait_for(&log, "pause on signal", &mut seen_log);
    let mut checks = 0;
    if arena {
        // The program's cudaMalloc is done once a check has run.
        writeln!(stdin, "check").expect("writing to expandable");
        let line = wait_for(&out, "check 0 ", &mut seen_out);
        assert!(line.ends_with(" ok"), "{line}");
        checks += 1;
        wait_for_arena(&log, &mut seen_log);
    }
    for cycle in 0..cycles {
        let before = seen_log.len();
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
        let line = wait_for(&log, "paused: ", &mut seen_log);
        let (allocations, bytes, mapped, handles) = paused_numbers(&line);
        assert_eq!(handles, 8, "{line}");
        assert!(allocations >= 8, "{line}");
        assert!(bytes >= 8 * (2 << 20), "{line}");
        assert_eq!(mapped, 0, "memory still mapped while paused: {line}");
        // The pause logs where the handles went before its summary.
        let in_arena = seen_log[before..]
            .iter()
            .any(|l| l.contains(HANDLES_IN_ARENA));
        assert_eq!(
            in_arena,
            arena,
            "cycle {cycle}: the handles in the host arena: {}",
            seen_log[before..].join("\n")
        );
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
        wait_for(&log, "resumed: ", &mut seen_log);
        writeln!(stdin, "check").expect("writing to expandable");
        let line = wait_for(&out, &format!("check {} ", cycle + checks), &mut seen_out);
        assert!(
            line.ends_with(" ok"),
            "cycle {cycle}: {line}\n{}",
            seen_log.join("\n")
        );
    }
    drop(stdin);
    wait_for(&out, "done", &mut seen_out);
    let status = child.wait().expect("waiting for expandable");
    assert!(
        status.success(),
        "expandable failed: {}",
        seen_log.join("\n")
    );
}

#[test]
fn expandable_segments_through_the_entry_points_are_evicted_with_the_driver_layer() {
    expandable_cycles("entry", true, 5);
}

#[test]
fn expandable_segments_through_the_entry_points_are_evicted_without_the_driver_layer() {
    expandable_cycles("entry", false, 5);
}

#[test]
fn expandable_segments_through_cu_get_proc_address_are_evicted() {
    expandable_cycles("proc", true, 5);
}

/// With `CUDAW_HOST_ARENA=pinned`, driver handles' bytes go into the page-locked host
/// arena as the program's `cudaMalloc` memory does, and come back from there intact,
/// pause after pause, through the driver layer and without it.
#[test]
fn expandable_segments_are_evicted_into_the_host_arena() {
    expandable_cycles_with("entry", true, 4, true);
}

#[test]
fn expandable_segments_are_evicted_into_the_host_arena_without_the_driver_layer() {
    expandable_cycles_with("entry", false, 3, true);
}

/// `cudaw-ckpt ARGS --json`: exit status and the reply.
fn ckpt_json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let r = std::process::Command::new(cudaw_ckpt())
        .args(args)
        .arg("--json")
        .output()
        .expect("running cudaw-ckpt");
    let text = String::from_utf8_lossy(&r.stdout);
    let last = text.lines().last().unwrap_or_default();
    let v = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text}"));
    (r.status.code(), v)
}

/// A dump of `expandable` (8 handles of 2 MiB, mapped one after another) holds the handles'
/// ranges: `inspect` lists them; a resume from the image, a restore of it and a dump
/// `--leave-running` each leave the patterns intact; an image whose handle table no longer
/// matches the process (it mapped one more chunk) is refused, the process running on.
#[test]
fn a_dump_of_a_process_with_driver_handles_holds_them_and_restores_them() {
    dump_and_restore_handles(false);
}

/// As [`a_dump_of_a_process_with_driver_handles_holds_them_and_restores_them`], with the
/// host arena on (`CUDAW_HOST_ARENA=pinned`): the pauses leave the handles' bytes in the
/// arena, the dumps write them from there, a dump that leaves the process paused moves
/// them to the image (resume reads them from it), restores load the image's.
#[test]
fn a_dump_of_driver_handles_in_the_host_arena_holds_them_and_restores_them() {
    dump_and_restore_handles(true);
}

fn dump_and_restore_handles(arena: bool) {
    use std::io::Write;
    let env: &[(&str, &str)] = if arena {
        &[("CUDAW_HOST_ARENA", "pinned")]
    } else {
        &[]
    };
    let Some(mut child) = expandable_with("entry", true, env) else {
        return;
    };
    let mut stdin = child.stdin.take().expect("stdin");
    let out = lines_of(child.stdout.take().expect("stdout"));
    let log = lines_of(child.stderr.take().expect("stderr"));
    let (mut seen_out, mut seen_log) = (Vec::new(), Vec::new());
    let ready = wait_for(&out, "ready: 8 chunks", &mut seen_out);
    let base =
        u64::from_str_radix(ready.rsplit_once("0x").expect("base").1.trim(), 16).expect("base");
    wait_for(&log, "pause on signal", &mut seen_log);
    let mut checks = 0;
    let mut check = |stdin: &mut std::process::ChildStdin, seen_out: &mut Vec<String>| {
        writeln!(stdin, "check").expect("writing to expandable");
        let line = wait_for(&out, &format!("check {checks} "), seen_out);
        assert!(line.ends_with(" ok"), "{line}");
        checks += 1;
    };
    // Every allocation made (the program's cudaMalloc follows "ready").
    check(&mut stdin, &mut seen_out);
    if arena {
        wait_for_arena(&log, &mut seen_log);
    }
    // Each pause leaves the handles in the arena, when it is on (the log is read on
    // another thread: waited for, bounded).
    let paused_into_arena = |seen_log: &mut Vec<String>| {
        if arena {
            wait_for(&log, HANDLES_IN_ARENA, seen_log);
        } else {
            assert!(!seen_log
                .iter()
                .any(|l| l.contains("left in the host arena")));
        }
    };
    let pid = child.id().to_string();
    let dir = tempfile::tempdir().expect("a folder for the images");
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    const HANDLE_BYTES: u64 = 8 * (2 << 20);

    // Dump: paused, the handles' bytes only in the image.
    let (code, d) = ckpt_json(&["dump", &pid, "-o", a_s]);
    assert_eq!(code, Some(0), "{d}");
    assert_eq!(d["state"], "paused", "{d}");
    paused_into_arena(&mut seen_log);
    assert!(d["bytes"].as_u64() > Some(HANDLE_BYTES), "{d}");
    let (code, v) = ckpt_json(&["inspect", a_s, "--verify"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["format_version"], "1.3", "{v}");
    assert_eq!(v["flags"], 1, "{v}");
    assert_eq!(v["handle_ranges"], 8, "{v}");
    assert_eq!(v["handle_bytes"].as_u64(), Some(HANDLE_BYTES), "{v}");
    let ranges: Vec<&serde_json::Value> = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a.get("handle").is_some())
        .collect();
    for (c, r) in ranges.iter().enumerate() {
        assert_eq!(r["base"].as_u64(), Some(base + c as u64 * (2 << 20)), "{r}");
        assert_eq!(r["size"].as_u64(), Some(2 << 20), "{r}");
        assert_eq!(r["handle"]["offset"], 0, "{r}");
        assert_eq!(r["handle"]["handle_size"].as_u64(), Some(2 << 20), "{r}");
        assert_eq!(r["handle"]["handle"], r["id"], "{r}");
    }
    // The text listing shows them too.
    let text = std::process::Command::new(cudaw_ckpt())
        .args(["inspect", a_s])
        .output()
        .expect("inspect");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "of which 8 driver-handle ranges, {HANDLE_BYTES} bytes"
        )),
        "{text}"
    );
    // Resume loads the handles from the image.
    let (code, r) = ckpt_json(&["resume", &pid]);
    assert_eq!(code, Some(0), "{r}");
    wait_for(&log, &format!("(from {a_s})"), &mut seen_log);
    check(&mut stdin, &mut seen_out);

    // --leave-running, then a restore of that image.
    let (code, d) = ckpt_json(&["dump", &pid, "-o", b_s, "--leave-running"]);
    assert_eq!(code, Some(0), "{d}");
    assert_eq!(d["state"], "running", "{d}");
    paused_into_arena(&mut seen_log);
    check(&mut stdin, &mut seen_out);
    let (code, r) = ckpt_json(&["restore", &pid, "-i", b_s]);
    assert_eq!(code, Some(0), "{r}");
    assert!(r["bytes"].as_u64() > Some(HANDLE_BYTES), "{r}");
    paused_into_arena(&mut seen_log);
    check(&mut stdin, &mut seen_out);
    // A restore of the first image, paused after a dump: loads it.
    let (code, d) = ckpt_json(&["dump", &pid, "-o", b_s]);
    assert_eq!(code, Some(0), "{d}");
    paused_into_arena(&mut seen_log);
    let (code, r) = ckpt_json(&["restore", &pid, "-i", a_s]);
    assert_eq!(code, Some(0), "{r}");
    check(&mut stdin, &mut seen_out);

    // One more handle mapped: the images no longer match, and are refused.
    writeln!(stdin, "grow").expect("writing to expandable");
    wait_for(&out, "grown 9", &mut seen_out);
    let (code, r) = ckpt_json(&["restore", &pid, "-i", a_s]);
    assert_eq!(code, Some(3), "{r}");
    assert_eq!(r["kind"], "mismatch", "{r}");
    assert!(
        r.to_string()
            .contains("in the process but not in the image"),
        "{r}"
    );
    check(&mut stdin, &mut seen_out);
    // And a dump now holds 9.
    let (code, d) = ckpt_json(&["dump", &pid, "-o", a_s, "--leave-running"]);
    assert_eq!(code, Some(0), "{d}");
    let (_, v) = ckpt_json(&["inspect", a_s]);
    assert_eq!(v["handle_ranges"], 9, "{v}");
    check(&mut stdin, &mut seen_out);

    drop(stdin);
    wait_for(&out, "done", &mut seen_out);
    assert!(
        child.wait().expect("waiting").success(),
        "{}",
        seen_log.join("\n")
    );
}

/// Launches per thread of `inflight_launch.cu`.
const INFLIGHT_LAUNCHES: usize = 120;

/// A pause waits for every launch in flight, whichever layer it comes through: the program's
/// threads launch kernels in a tight loop through the runtime (`cudaLaunchKernel`) and
/// through the driver (`cuLaunchKernel` from `cuGetProcAddress`), into memory a pause
/// evicts, while simgpu holds every launch inside the call for 3 ms before it queues the
/// kernel (`SIMGPU_LAUNCH_DELAY_US`). The test pauses and resumes it continually: a pause
/// that did not wait for a launch already past the gate would evict memory its kernel then
/// uses (a fault, or a stale copy restored at resume). Every result must equal the CPU's
/// and the uninterrupted run's. simgpu's runtime launches through the driver layer, as the
/// real runtime does, so the runtime's `cudaLaunchKernel` goes straight to it and only the
/// driver layer marks the launch in flight (`launch_bypass`).
#[test]
fn a_pause_waits_for_launches_in_flight_in_both_layers() {
    pause_during_launches(true);
}

/// As above with `CUDAW_DIRECT_LAUNCHES=off`: the runtime's launches are marked in flight
/// by the runtime layer's thin wrapper too.
#[test]
fn a_pause_waits_for_launches_in_flight_in_both_layers_marked_by_the_runtime_too() {
    pause_during_launches(false);
}

fn pause_during_launches(direct: bool) {
    let Some((_, module)) = program() else {
        return;
    };
    let direct_env = ("CUDAW_DIRECT_LAUNCHES", if direct { "on" } else { "off" });
    let nvcc = nvcc().expect("nvcc");
    let exe = compile(
        &nvcc,
        "inflight_launch",
        &workspace().join("tests/cuda/driver/inflight_launch.cu"),
    );
    let launches = INFLIGHT_LAUNCHES.to_string();

    let mut cmd = command_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[("CUDAW_LOG", "info"), direct_env],
    );
    let reference = cmd
        .arg(&module)
        .arg(&launches)
        .output()
        .expect("inflight_launch");
    let ref_out = String::from_utf8_lossy(&reference.stdout).into_owned();
    assert!(
        reference.status.success(),
        "the uninterrupted run failed:\n{ref_out}\n{}",
        String::from_utf8_lossy(&reference.stderr)
    );
    assert!(ref_out.contains("results correct"), "{ref_out}");
    let ref_log = String::from_utf8_lossy(&reference.stderr);
    let straight = "cudaLaunchKernel: the real runtime's launches reach cudaw's driver layer";
    assert_eq!(ref_log.contains(straight), direct, "{ref_log}");

    let mut cmd = command_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[
            ("CUDAW_LOG", "info"),
            ("SIMGPU_LAUNCH_DELAY_US", "3000"),
            direct_env,
        ],
    );
    cmd.arg(&module)
        .arg(&launches)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting inflight_launch"));
    let out = lines_of(child.stdout.take().expect("stdout"));
    let log = lines_of(child.stderr.take().expect("stderr"));
    let pid = i32::try_from(child.id()).expect("pid");
    let (mut seen_out, mut seen_log) = (Vec::new(), Vec::new());
    wait_for(&log, "pause on signal", &mut seen_log);
    wait_for(&out, "launching", &mut seen_out);
    let mut pauses = 0;
    let mut gap_us = 500u64;
    loop {
        // Whatever the program printed so far (its last lines mean it is finishing).
        while let Ok(line) = out.try_recv() {
            seen_out.push(line);
        }
        if seen_out.iter().any(|l| l.starts_with("thread ")) {
            break;
        }
        // SAFETY: kill(2) on our own child.
        if unsafe { libc::kill(pid, libc::SIGUSR1) } != 0 {
            break;
        }
        // The program may have finished between the look at its output and the signal.
        if !wait_for_or_exit(&log, "] info: paused: ", &mut seen_log) {
            break;
        }
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
        wait_for(&log, "] info: resumed: ", &mut seen_log);
        pauses += 1;
        // Vary where in a launch the next pause falls (0.5 to 3.4 ms later).
        gap_us = 500 + (gap_us * 7 + 1300) % 2900;
        std::thread::sleep(Duration::from_micros(gap_us));
    }
    let status = child.wait().expect("waiting for inflight_launch");
    for line in out.iter() {
        seen_out.push(line);
    }
    let faults: Vec<_> = log
        .try_iter()
        .chain(seen_log.iter().cloned())
        .filter(|l| l.contains("simgpu") || l.contains("inflight_launch:"))
        .collect();
    assert!(
        status.success(),
        "inflight_launch failed after {pauses} pauses: {faults:?}\n{}",
        seen_out.join("\n")
    );
    assert!(
        pauses >= 10,
        "only {pauses} pauses fell during the launches"
    );
    let paused_out = seen_out.join("\n") + "\n";
    assert_eq!(
        paused_out, ref_out,
        "the paused run's results differ from the uninterrupted run's"
    );
    eprintln!("{pauses} pauses during {INFLIGHT_LAUNCHES} launches on each of 3 threads");
}

/// `driver_alloc.cu` and its module.
fn driver_alloc() -> Option<(PathBuf, PathBuf)> {
    let nvcc = nvcc()?;
    let dir = workspace().join("tests/cuda/driver");
    let exe = compile(&nvcc, "driver_alloc", &dir.join("driver_alloc.cu"));
    let module = compile_fatbin(&nvcc, "scale_module", &dir.join("scale_module.cu"));
    Some((exe, module))
}

/// `cuMemAlloc` and `cuMemAllocAsync` fetched through `cuGetProcAddress` come from cudaw's
/// VMM (mapped addressing): a pause leaves nothing mapped, resume brings the contents back,
/// the pointer queries name the allocation; the module's kernel layout is the one
/// `cudaw fatbin` reads from the same file.
#[test]
fn driver_allocations_are_evicted_by_a_pause_and_their_kernel_layouts_recorded() {
    use std::io::Write;
    let Some((exe, module)) = driver_alloc() else {
        return;
    };
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[("CUDAW_LOG", "info")]);
    cmd.arg(&module)
        .arg("run")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting driver_alloc"));
    let mut stdin = child.stdin.take().expect("stdin");
    let out = lines_of(child.stdout.take().expect("stdout"));
    let log = lines_of(child.stderr.take().expect("stderr"));
    let pid = i32::try_from(child.id()).expect("pid");
    let (mut seen_out, mut seen_log) = (Vec::new(), Vec::new());
    let layout = wait_for(&out, "layout: ", &mut seen_out);
    let range = wait_for(&out, "range ", &mut seen_out);
    let bytes = 4 << 16;
    assert_eq!(range, format!("range rc=0 base_ok=1 size={bytes}"));
    let attr = wait_for(&out, "attribute ", &mut seen_out);
    assert_eq!(attr, format!("attribute rc=0,0 start_ok=1 size={bytes}"));
    wait_for(&out, "ready", &mut seen_out);
    wait_for(&log, "pause on signal", &mut seen_log);
    for cycle in 0..3 {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
        let line = wait_for(&log, "paused: ", &mut seen_log);
        let (allocations, evicted, mapped, _) = paused_numbers(&line);
        assert_eq!(allocations, 2, "{line}");
        assert_eq!(evicted, 2 * bytes, "{line}");
        assert_eq!(mapped, 0, "memory still mapped while paused: {line}");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
        wait_for(&log, "resumed: ", &mut seen_log);
        writeln!(stdin, "check").expect("writing to driver_alloc");
        let line = wait_for(&out, &format!("check {cycle} "), &mut seen_out);
        assert!(line.ends_with(" ok"), "{line}\n{}", seen_log.join("\n"));
    }
    drop(stdin);
    wait_for(&out, "done", &mut seen_out);
    let status = child.wait().expect("waiting for driver_alloc");
    let rest: Vec<String> = log.iter().collect();
    assert!(
        status.success(),
        "driver_alloc failed: {seen_log:?} {rest:?}"
    );
    assert!(
        rest.iter()
            .any(|l| l.contains("modules loaded through the driver, 1 kernel layouts recorded")),
        "{rest:?}"
    );

    // The layout recorded for the CUfunction equals `cudaw fatbin`'s for the same file.
    let got: serde_json::Value =
        serde_json::from_str(layout.trim_start_matches("layout: ")).expect(&layout);
    let cli = std::process::Command::new(cudaw_tests::cudaw())
        .arg("fatbin")
        .arg(&module)
        .args(["--sm", "90", "--json"])
        .output()
        .expect("cudaw fatbin");
    assert!(cli.status.success());
    let want: serde_json::Value = serde_json::from_slice(&cli.stdout).expect("cudaw fatbin --json");
    let want = want["kernels"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["name"] == "_Z5scalePfif"))
        .expect("scale in cudaw fatbin's answer");
    assert_eq!(got["name"], want["name"]);
    assert_eq!(got["param_bytes"], want["param_bytes"]);
    assert_eq!(got["params"], want["params"]);
    assert_eq!(got["params"].as_array().map(Vec::len), Some(3), "{got}");
}

/// The driver's allocations count against `CUDAW_MEM_LIMIT` (each rounded to the 2 MiB
/// granule by the VMM), and the program recovers after freeing.
#[test]
fn driver_allocations_count_against_the_limit() {
    let Some((exe, module)) = driver_alloc() else {
        return;
    };
    for (addressing, each) in [(Addressing::Mapped, 4u64), (Addressing::Translated, 3)] {
        let mut cmd = command_under_cudaw(&exe, addressing, &[("CUDAW_MEM_LIMIT", "64M")]);
        let out = cmd
            .arg(&module)
            .arg("fill")
            .output()
            .expect("driver_alloc fill");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("fill count={} err=2\n", 64 / each)),
            "{addressing:?}: {stdout}"
        );
        assert!(stdout.contains("again rc=0"), "{stdout}");
    }
}

/// A driver-API program with a context of its own (`cuCtxCreate`) keeps it current across
/// the allocations cudaw's VMM serves: the VMM works in the primary context, and its first
/// use initialises the runtime there, but neither may stay current in the program's place.
#[test]
fn a_programs_own_context_stays_current_across_vmm_allocations() {
    let Some((exe, module)) = driver_alloc() else {
        return;
    };
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[("CUDAW_LOG", "info")]);
    let out = cmd
        .arg(&module)
        .arg("own")
        .output()
        .expect("driver_alloc own");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The allocation really came from cudaw's VMM (the case at stake), in a context that
    // really is another one.
    assert!(stderr.contains("cudaw manages its memory"), "{stderr}");
    assert!(
        stdout.contains("own context is not the primary one"),
        "{stdout}"
    );
    assert!(
        stdout.contains("own context current after alloc: yes")
            && stdout.contains("own context current after free: yes"),
        "{stdout}\n{stderr}"
    );
}

/// In translated addressing the driver's allocations are forwarded to the real driver (the
/// program must get real device addresses): the program runs as without cudaw.
#[test]
fn driver_allocations_are_forwarded_in_translated_addressing() {
    let Some((exe, module)) = driver_alloc() else {
        return;
    };
    let mut cmd = command_under_cudaw(&exe, Addressing::Translated, &[]);
    let mut child = cmd
        .arg(&module)
        .arg("run")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("driver_alloc");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "check").expect("writing");
    }
    let out = child.wait_with_output().expect("driver_alloc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("check 0 ok\ndone\n"), "{stdout}");
}

/// The demangled name of `driver_launch`'s kernel (`_Z5scalePfif`).
const SCALE: &str = "scale(float*, int, float)";

/// `driver_launch` run under `CUDAW_TRACE` (and `env`), waiting after its launches
/// (argument `wait`) so that its tracing store can be read live.
struct TracedRun {
    child: cudaw_tests::KillOnDrop,
    stdin: std::process::ChildStdin,
    err: Receiver<String>,
    dir: PathBuf,
    /// Where the timeline goes at exit.
    file: PathBuf,
}

impl TracedRun {
    /// Starts it (`None` without the CUDA tools) and waits until its launches are done.
    fn start(label: &str, env: &[(&str, &str)]) -> Option<TracedRun> {
        let (exe, module) = program()?;
        let dir = std::env::temp_dir().join(format!("cudaw-driver-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("timeline.json");
        let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
        cmd.arg(&module)
            .args(["0", "wait"])
            .envs(env.iter().copied())
            .env("CUDAW_TRACE_FILE", &file)
            .env("CUDAW_RUN_DIR", &dir)
            .env("CUDAW_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting driver_launch"));
        let stdin = child.stdin.take().unwrap();
        let rx = lines_of(child.stdout.take().unwrap());
        let err = lines_of(child.stderr.take().unwrap());
        wait_for(&rx, "driver_launch: waiting", &mut Vec::new());
        Some(TracedRun {
            child,
            stdin,
            err,
            dir,
            file,
        })
    }

    /// `cudaw-ckpt stats PID --json --top 5`.
    fn stats(&self) -> serde_json::Value {
        let out = std::process::Command::new(cudaw_ckpt())
            .args([
                "stats",
                &self.child.id().to_string(),
                "--json",
                "--top",
                "5",
            ])
            .env("CUDAW_RUN_DIR", &self.dir)
            .output()
            .expect("running cudaw-ckpt");
        assert!(
            out.status.success(),
            "cudaw-ckpt stats failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("stats --json is JSON")
    }

    /// Lets it finish; asserts it succeeded; its log.
    fn finish(mut self) -> String {
        self.stdin.write_all(b"\n").unwrap();
        let Self {
            mut child,
            stdin,
            err,
            ..
        } = self;
        drop(stdin);
        let status = child.wait().expect("waiting for driver_launch");
        let log = err.iter().collect::<Vec<String>>().join("\n");
        assert!(status.success(), "driver_launch failed:\n{log}");
        log
    }
}

/// `driver_launch` under `CUDAW_TRACE=mode`, stopped after its launches (argument `wait`):
/// the tracing store of the runtime shim holds what the program sent to the driver only.
/// `cudaw-ckpt stats --json` lists `scale` by its demangled name with its 12 launches, its
/// buffer (made by `cuMemAlloc`, given to every launch — 64 launches in the history, whose
/// default looks up one launch's buffers in 64 —, one copy in and one out) and the copies
/// per direction; with the timeline, the file written at exit holds each launch with its
/// grid, block and the buffer its first argument points into (every launch: the timeline
/// keeps each launch's words, whatever the history's sampling).
fn traced_driver_launches(mode: &str) {
    let Some(run) = TracedRun::start(&format!("trace-{mode}"), &[("CUDAW_TRACE", mode)]) else {
        return;
    };
    let stats = run.stats();
    assert_eq!(stats["mode"], mode);
    let kernels = stats["kernels"].as_array().expect("kernels");
    assert_eq!(
        kernels.as_slice(),
        [serde_json::json!({"name": SCALE, "mangled": "_Z5scalePfif", "launches": LAUNCHES})],
        "{stats}"
    );
    let copies: Vec<(String, u64, u64)> = stats["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["direction"].as_str().unwrap().to_owned(),
                c["count"].as_u64().unwrap(),
                c["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        copies,
        [("HtoD".to_owned(), 1, 4096), ("DtoH".to_owned(), 1, 4096)],
        "{stats}"
    );
    let hottest = &stats["memory"]["hottest"][0];
    // The history looks up the buffers of one launch in 64 (the first), counted 64 times.
    let history_launches = 64;
    assert_eq!(
        (
            hottest["size"].as_u64(),
            hottest["launches"].as_u64(),
            hottest["copies_in"].as_u64(),
            hottest["copies_out"].as_u64()
        ),
        (Some(4096), Some(history_launches as u64), Some(1), Some(1)),
        "{stats}"
    );
    assert_eq!(hottest["kernels"], serde_json::json!([SCALE]), "{stats}");
    let base = hottest["base"].as_str().unwrap().to_owned();

    let (dir, file) = (run.dir.clone(), run.file.clone());
    let log = run.finish();
    assert!(log.contains("trace: "), "no summary at exit:\n{log}");
    if mode != "timeline" {
        assert!(!file.exists());
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let text = std::fs::read_to_string(&file).expect("the timeline written at exit");
    let tl: serde_json::Value = serde_json::from_str(&text).expect("the timeline is JSON");
    let events = tl["traceEvents"].as_array().expect("traceEvents");
    let launches: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["cat"] == "kernel" && e["name"] == SCALE)
        .collect();
    assert_eq!(launches.len(), LAUNCHES, "{text}");
    for l in &launches {
        assert_eq!(l["args"]["kernel"], "_Z5scalePfif", "{l}");
        assert_eq!(l["args"]["grid"], serde_json::json!([4, 1, 1]), "{l}");
        assert_eq!(l["args"]["block"], serde_json::json!([256, 1, 1]), "{l}");
        let buffers = l["args"]["buffers"].as_array().expect("buffers");
        assert_eq!(buffers.len(), 1, "{l}");
        assert_eq!(buffers[0]["param"], 0, "{l}");
        assert_eq!(buffers[0]["base"], base.as_str(), "{l}");
    }
    let copies = events.iter().filter(|e| e["cat"] == "copy").count();
    assert_eq!(copies, 2, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn driver_launches_and_copies_are_traced_in_the_metrics() {
    traced_driver_launches("metrics");
}

#[test]
fn driver_launches_and_copies_are_traced_in_the_timeline() {
    traced_driver_launches("timeline");
}

/// `CUDAW_TRACE_SELF=1`: at exit the driver layer reports the phases of its traced
/// launches, and how often its per-thread caches were found stale: one module, one kernel,
/// one thread — no handle renamed, one layout lookup past the thread's cache (its first
/// launch), and the launches after the first read at the sites its scan learned.
#[test]
fn the_driver_layers_self_cost_is_reported_at_exit() {
    let env = [
        ("CUDAW_TRACE", "timeline"),
        ("CUDAW_TRACE_SELF", "1"),
        ("CUDAW_TRACE_SELF_WARMUP", "2"),
    ];
    let Some(run) = TracedRun::start("self", &env) else {
        return;
    };
    let dir = run.dir.clone();
    let log = run.finish();
    let line = log
        .lines()
        .find(|l| l.contains("self cost of a traced launch (driver layer, mean of 10 after 2)"))
        .unwrap_or_else(|| panic!("no driver layer self cost:\n{log}"));
    // Of the 10 launches timed (the 3rd to the 12th), none sampled for the history: each
    // read its argument words at the sites the first launch's scan learned.
    assert!(
        line.ends_with(
            "; handle generation 0, 1 layout lookups past the threads' caches; \
             10 read at their kernels' learned pointer sites"
        ),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `CUDAW_TRACE_DRIVER=off`: the driver layer records nothing, so a program that reaches
/// the GPU through the driver API only (as cuBLAS, cuDNN and Triton do) has no launch, copy
/// or memory history in the store, and its timeline no kernel; it runs as before.
#[test]
fn driver_launches_are_left_out_with_trace_driver_off() {
    let env = [("CUDAW_TRACE", "timeline"), ("CUDAW_TRACE_DRIVER", "off")];
    let Some(run) = TracedRun::start("untraced", &env) else {
        return;
    };
    let stats = run.stats();
    assert_eq!(stats["mode"], "timeline", "{stats}");
    assert_eq!(stats["kernels"], serde_json::json!([]), "{stats}");
    assert_eq!(stats["copies"], serde_json::json!([]), "{stats}");
    let (dir, file) = (run.dir.clone(), run.file.clone());
    let log = run.finish();
    assert!(log.contains("CUDAW_TRACE_DRIVER=off"), "{log}");
    let text = std::fs::read_to_string(&file).expect("the timeline written at exit");
    let tl: serde_json::Value = serde_json::from_str(&text).expect("the timeline is JSON");
    let recorded = tl["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["cat"] == "kernel" || e["cat"] == "copy")
        .count();
    assert_eq!(recorded, 0, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both drop-in libraries can be loaded by `dlopen` after the program started: a real
/// runtime that finds cudaw's `libcuda.so.1` on `LD_LIBRARY_PATH`, and PyTorch loading the
/// runtime with its extension, do that. Each uses initial-exec TLS (the trampolines'
/// per-thread words), so its whole TLS block must fit in glibc's small static-TLS surplus;
/// a 4 KiB per-thread table once made the driver layer fail there ("cannot allocate
/// memory in static TLS block", and the runtime then reported error 35).
#[test]
fn the_shims_load_with_dlopen_after_startup() {
    for name in ["libcuda.so.1", "libcudart.so.13"] {
        let lib = shims().join(name);
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded')",
            ])
            .arg(&lib)
            .output()
            .expect("python3 runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("loaded"),
            "dlopen of {} failed:\n{text}",
            lib.display()
        );
    }
}
