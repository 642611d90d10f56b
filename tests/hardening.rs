//! Attacks on the files cudaw writes and reads and on its control socket (issue 24): a
//! link, a FIFO or a device node at every path a process under cudaw writes or reads,
//! silent clients, restore errors that would quote a file, and run folders that are not
//! private. Real nvcc-built programs under the shim on simgpu (skipped without nvcc).

mod ckpt_common;

use ckpt_common::{raw, text, Target};
use cudaw_tests::{command_under_cudaw, compile_program, cudaw_ckpt, nvcc, Addressing};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long any one step may take before the test calls it hung (the old code hung for
/// ever on a FIFO, or took 2 s per silent client).
const HUNG: Duration = Duration::from_secs(60);

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that lives across the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {p:?}");
}

fn is_fifo(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_fifo())
}

/// Kills the child when dropped (a failed test leaves nothing running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end, or panics (after killing it) if it has not ended within
/// [`HUNG`].
fn output_within(mut cmd: Command, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let mut k = Killed(child);
    let (mut out, mut err) = (k.0.stdout.take().unwrap(), k.0.stderr.take().unwrap());
    let o = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let e = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + HUNG;
    let status = loop {
        if let Some(s) = k.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{what} hung (killed after {HUNG:?})"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

/// cudaw-ckpt against the target, which must end within [`HUNG`].
fn ckpt(t: &Target, args: &[&str]) -> Output {
    let mut cmd = Command::new(cudaw_ckpt());
    cmd.args(args)
        .env("CUDAW_RUN_DIR", &t.run_dir)
        .current_dir(&t.work);
    output_within(cmd, &format!("cudaw-ckpt {args:?}"))
}

/// cudaw-ckpt fails with status 1 and a message containing every one of `what`.
fn refused(t: &Target, args: &[&str], what: &[&str]) -> String {
    let out = ckpt(t, args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}\n{}", t.log());
    for w in what {
        assert!(err.contains(w), "{args:?}: {err:?} lacks {w:?}");
    }
    err
}

/// One raw request line with a reply expected within [`HUNG`].
fn raw_within(socket: &Path, line: &str) -> Value {
    let mut s = UnixStream::connect(socket).expect("connecting");
    s.set_read_timeout(Some(HUNG)).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(s)
        .read_line(&mut reply)
        .expect("a reply within the deadline");
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply:?}: {e}"))
}

fn request(cmd: &str, path: &Path) -> String {
    format!(
        "{{\"cmd\":{cmd:?},\"path\":{:?}}}\n",
        path.to_str().expect("UTF-8 path")
    )
}

/// The temporaries left in `dir` (none may be).
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

fn assert_answers(t: &Target) {
    let st = raw_within(&t.socket(), "{\"cmd\":\"status\"}\n");
    assert_eq!(st["ok"], true, "{st}");
}

#[test]
fn dump_and_trace_outputs_refuse_links_and_fifos() {
    let Some(t) = Target::start_with(Addressing::Mapped, "hl", &[("CUDAW_TRACE", "timeline")])
    else {
        return;
    };
    let pid = t.pid.clone();
    let secret = t.path("secret");
    std::fs::write(&secret, "root only\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link_img = t.path("link.img");
    let link_json = t.path("link.json");
    std::os::unix::fs::symlink(&secret, &link_img).unwrap();
    std::os::unix::fs::symlink(&secret, &link_json).unwrap();
    let fifo_img = t.path("fifo.img");
    let fifo_json = t.path("fifo.json");
    mkfifo(&fifo_img);
    mkfifo(&fifo_json);

    // Through cudaw-ckpt (which creates the file as the user and passes it).
    refused(
        &t,
        &["dump", &pid, "-o", "link.img"],
        &["symbolic link", "link.img"],
    );
    refused(&t, &["dump", &pid, "-o", "fifo.img"], &["FIFO", "fifo.img"]);
    refused(&t, &["trace", &pid, "-o", "link.json"], &["symbolic link"]);
    refused(&t, &["trace", &pid, "-o", "fifo.json"], &["FIFO"]);
    // Straight to the socket, by path: the process refuses by itself.
    let socket = t.socket();
    for (cmd, p, what) in [
        ("dump", &link_img, "symbolic link"),
        ("dump", &fifo_img, "FIFO"),
        ("trace", &link_json, "symbolic link"),
        ("trace", &fifo_json, "FIFO"),
    ] {
        let r = raw_within(&socket, &request(cmd, p));
        assert_eq!(r["ok"], false, "{r}");
        let e = r["error"].as_str().unwrap();
        assert!(e.contains(what) && e.contains(p.to_str().unwrap()), "{e}");
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only\n");
    assert!(is_fifo(&fifo_img) && is_fifo(&fifo_json));
    assert!(std::fs::symlink_metadata(&link_img)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(
        temporaries(&t.work).is_empty(),
        "{:?}",
        temporaries(&t.work)
    );
    t.assert_running();

    // What is allowed is written private, and leaves no temporary behind.
    let out = ckpt(&t, &["trace", &pid, "-o", "t.json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = raw_within(&socket, &request("trace", &t.path("u.json")));
    assert_eq!(r["ok"], true, "{r}");
    let out = ckpt(&t, &["dump", &pid, "-o", "good.img", "--leave-running"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in ["t.json", "u.json", "good.img"] {
        let m = std::fs::metadata(t.path(f)).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600, "{f}");
    }
    let v: Value = serde_json::from_slice(&std::fs::read(t.path("t.json")).unwrap())
        .expect("the timeline is JSON");
    assert!(v.is_object() || v.is_array(), "{v}");
    assert!(
        temporaries(&t.work).is_empty(),
        "{:?}",
        temporaries(&t.work)
    );
    t.assert_running();
    t.finish();
}

#[test]
fn dump_onto_a_device_node_is_refused_and_the_node_stays() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: making a device node (mknod) needs root");
        return;
    }
    let Some(t) = Target::start(Addressing::Mapped, "hn") else {
        return;
    };
    let pid = t.pid.clone();
    // A node like /dev/null (1, 3), in the test's own folder.
    let node = t.path("null");
    let c = std::ffi::CString::new(node.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that lives across the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    if rc != 0 {
        println!(
            "skipped: mknod failed ({}): no device nodes in this container",
            std::io::Error::last_os_error()
        );
        return;
    }
    refused(
        &t,
        &["dump", &pid, "-o", "null"],
        &["character device", "null"],
    );
    let r = raw_within(&t.socket(), &request("dump", &node));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["kind"], "io", "{r}");
    assert!(
        r["error"].as_str().unwrap().contains(&format!(
            "refusing to replace {}: it is a character device, not a regular file",
            node.display()
        )),
        "{r}"
    );
    let m = std::fs::symlink_metadata(&node).unwrap();
    assert!(m.file_type().is_char_device(), "the node was replaced");
    assert_eq!(m.rdev(), libc::makedev(1, 3));
    assert!(temporaries(&t.work).is_empty());
    t.assert_running();
    t.finish();
}

#[test]
fn restore_naming_a_fifo_is_refused_at_once_and_the_socket_still_answers() {
    let Some(t) = Target::start(Addressing::Mapped, "hf") else {
        return;
    };
    let pid = t.pid.clone();
    let fifo = t.path("fifo.img");
    mkfifo(&fifo);
    // The old code hung in open() here, signals and socket dead until someone wrote it.
    let r = raw_within(&t.socket(), &request("restore", &fifo));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["kind"], "io", "{r}");
    assert_eq!(
        r["error"].as_str().unwrap(),
        format!(
            "cannot open the image: refusing to read {}: it is a FIFO (named pipe), not a regular file",
            fifo.display()
        )
    );
    assert_answers(&t);
    refused(
        &t,
        &["restore", &pid, "-i", "fifo.img"],
        &["FIFO", "left unchanged"],
    );
    assert_answers(&t);
    // A link: followed by cudaw-ckpt (which opens the file as the user and passes it),
    // refused by the process asked by path (it acts for someone else).
    let out = ckpt(&t, &["dump", &pid, "-o", "good.img", "--leave-running"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let link = t.path("link.img");
    std::os::unix::fs::symlink(t.path("good.img"), &link).unwrap();
    let r = raw_within(&t.socket(), &request("restore", &link));
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("symbolic link"),
        "{r}"
    );
    let out = ckpt(&t, &["restore", &pid, "-i", "link.img"]);
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), t.log());
    t.assert_running();
    assert!(is_fifo(&fifo));
    t.finish();
}

#[test]
fn restore_errors_quote_no_byte_of_the_file() {
    let Some(t) = Target::start(Addressing::Mapped, "hq") else {
        return;
    };
    let shadow = t.path("shadow");
    std::fs::write(
        &shadow,
        "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n",
    )
    .unwrap();
    std::fs::set_permissions(&shadow, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = raw_within(&t.socket(), &request("restore", &shadow));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["kind"], "bad_image", "{r}");
    let e = r["error"].as_str().unwrap();
    assert_eq!(
        e,
        format!("{}: not a cudaw image (bad magic)", shadow.display())
    );
    for leak in ["root", "72 6f 6f 74", "hash", "$6$"] {
        assert!(!e.contains(leak), "{e:?} quotes the file ({leak:?})");
    }
    assert!(!t.log().contains("saltsalt"), "the log quotes the file");
    t.assert_running();
    t.finish();
}

#[test]
fn a_request_saying_a_file_comes_with_it_needs_one() {
    let Some(t) = Target::start(Addressing::Mapped, "hd") else {
        return;
    };
    let r = raw(
        &t.socket(),
        &format!(
            "{{\"cmd\":\"restore\",\"path\":{:?},\"fd\":true}}\n",
            t.path("x.img").to_str().unwrap()
        ),
    );
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(
        r["error"],
        "the restore request says a file comes with it (\"fd\":true), but no descriptor came"
    );
    t.assert_running();
    t.finish();
}

#[test]
fn silent_clients_delay_no_request() {
    let Some(t) = Target::start(Addressing::Mapped, "hs") else {
        return;
    };
    let pid = t.pid.clone();
    // 200 clients that connect and say nothing. Served one at a time, 2 s each, they held
    // a real request back for 400 s; now it is answered while they wait.
    let silent: Vec<UnixStream> = (0..200)
        .map(|_| UnixStream::connect(t.socket()).expect("connecting"))
        .collect();
    let out = ckpt(&t, &["pause", &pid]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let st = raw_within(&t.socket(), "{\"cmd\":\"status\"}\n");
    assert_eq!(st["status"]["state"], "paused", "{st}");
    let out = ckpt(&t, &["resume", &pid]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Each silent client is told why it was let go (dropped for newer ones, or out of
    // time), and the connection closed.
    for mut s in silent.into_iter().rev().take(3) {
        s.set_read_timeout(Some(HUNG)).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply)
            .expect("closed within the deadline");
        let r: Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply:?}: {e}"));
        assert_eq!(r["ok"], false, "{r}");
        let e = r["error"].as_str().unwrap();
        assert!(
            e.starts_with("no request line within 2 s") || e.starts_with("dropped:"),
            "{e}"
        );
    }
    t.assert_running();
    t.finish();
}

#[test]
fn status_answers_during_dumps() {
    let Some(t) = Target::start(Addressing::Mapped, "hb") else {
        return;
    };
    // Status requests from another thread while dumps run: each is answered, whole
    // (while a dump runs, without waiting for it: `busy` says which).
    let pid = t.pid.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let socket = t.socket();
    let asker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut n, mut busy) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let st = raw_within(&socket, "{\"cmd\":\"status\"}\n");
                assert_eq!(st["ok"], true, "{st}");
                if let Some(b) = st["status"].get("busy") {
                    assert!(b.as_str().unwrap().starts_with("dump, for "), "{st}");
                    busy += 1;
                }
                n += 1;
            }
            (n, busy)
        })
    };
    for i in 0..5 {
        let img = format!("d{i}.img");
        let out = ckpt(&t, &["dump", &pid, "-o", &img, "--leave-running"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (n, busy) = asker.join().expect("the status thread");
    println!("{n} status answers during 5 dumps, {busy} of them while a dump ran");
    assert!(n > 0);
    t.assert_running();
    t.finish();
}

/// A short program under cudaw, run to its end within [`HUNG`]; its stderr.
fn short_run(env: &[(&str, &str)], cwd: &Path) -> (Output, PathBuf) {
    let nvcc = nvcc().expect("nvcc");
    let exe = compile_program(&nvcc, "vector_add");
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, env);
    cmd.current_dir(cwd);
    (output_within(cmd, "vector_add under cudaw"), exe)
}

#[test]
fn the_timeline_written_at_exit_refuses_a_fifo_and_a_link() {
    if nvcc().is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let secret = d.path().join("secret");
    std::fs::write(&secret, "root only\n").unwrap();
    let fifo = d.path().join("fifo.json");
    mkfifo(&fifo);
    let link = d.path().join("link.json");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    for (target, what) in [(&fifo, "FIFO"), (&link, "symbolic link")] {
        let (out, _) = short_run(
            &[
                ("CUDAW_TRACE", "timeline"),
                ("CUDAW_TRACE_FILE", target.to_str().unwrap()),
                ("CUDAW_RUN_DIR", run.to_str().unwrap()),
            ],
            d.path(),
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains(&format!("refusing to replace {}", target.display()))
                && err.contains(what),
            "{err}"
        );
    }
    assert!(is_fifo(&fifo));
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only\n");
    // A plain name: written 0600, no temporary left.
    let t = d.path().join("t.json");
    let (out, _) = short_run(
        &[
            ("CUDAW_TRACE", "timeline"),
            ("CUDAW_TRACE_FILE", t.to_str().unwrap()),
            ("CUDAW_RUN_DIR", run.to_str().unwrap()),
        ],
        d.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::metadata(&t).unwrap().mode() & 0o777, 0o600);
    assert!(
        temporaries(d.path()).is_empty(),
        "{:?}",
        temporaries(d.path())
    );
}

#[test]
fn a_run_folder_that_is_not_absolute_and_private_is_refused() {
    if nvcc().is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    // Relative: refused, nothing made in the working folder.
    let (out, _) = short_run(&[("CUDAW_RUN_DIR", "run")], d.path());
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("CUDAW_RUN_DIR=run: run is not an absolute path"),
        "{err}"
    );
    assert!(!d.path().join("run").exists());
    // Writable by others: refused, nothing left there.
    let open = d.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (out, _) = short_run(&[("CUDAW_RUN_DIR", open.to_str().unwrap())], d.path());
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("writable by its group or others (mode 0777"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
    // Readable by others and holding other files (as /etc): refused, nothing left there.
    let shared = d.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(shared.join("passwd"), "x").unwrap();
    let (out, _) = short_run(&[("CUDAW_RUN_DIR", shared.to_str().unwrap())], d.path());
    let err = text(&out.stderr);
    assert!(
        err.contains("holds files that are not cudaw's (such as passwd); refusing to use it"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 1);
    // A link to a private folder: refused.
    let private = d.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    let (out, _) = short_run(&[("CUDAW_RUN_DIR", link.to_str().unwrap())], d.path());
    let err = text(&out.stderr);
    assert!(err.contains("is a symbolic link, not a folder"), "{err}");
    // cudaw-ckpt says so too.
    let mut cmd = Command::new(cudaw_ckpt());
    cmd.args(["status"]).env("CUDAW_RUN_DIR", "run");
    let out = output_within(cmd, "cudaw-ckpt status");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("CUDAW_RUN_DIR=run: run is not an absolute path"),
        "{}",
        text(&out.stderr)
    );
}
