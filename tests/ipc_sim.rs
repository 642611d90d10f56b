//! Memory shared between the processes of a job on simgpu, as NCCL shares it between the
//! ranks on one node: `tests/cuda/ipc/ipc_pair.cu`, a real nvcc-built program, run twice
//! (rank 0 and rank 1) directly on simgpu (no cudaw), simgpu playing both the program's
//! `libcudart.so.13` and `libcuda.so.1`. Each rank exports a `cuMemCreate` buffer as a
//! POSIX file descriptor, passes it to the other over a Unix socket (`SCM_RIGHTS`), imports
//! and maps the peer's, and then, step by step as this test tells both ranks on their
//! standard input, writes its own buffer with a kernel and mixes the peer's into an
//! accumulator with another. The digests each rank prints are checked against the CPU's
//! (computed by the program) and against this test's own computation.
//!
//! The program is driven by commands ("run K", "digest", "end"), never by timing: the same
//! harness can pause and dump it between steps.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use cudaw_tests::{compile, nvcc, simgpu, workspace};

/// How long any one expected line may take (a bounded wait for an event, not a timing).
const LINE_WAIT: Duration = Duration::from_secs(120);
/// The descriptor a rank finds its end of the socket pair at (`fd:3`).
const SOCKET_FD: i32 = 3;

/// A private folder where `libcudart.so.13` and `libcuda.so.1` are simgpu.
fn simgpu_as_cuda() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a private folder");
    for name in ["libcudart.so.13", "libcuda.so.1"] {
        std::os::unix::fs::symlink(simgpu(), dir.path().join(name)).expect("linking simgpu");
    }
    dir
}

fn ipc_pair() -> Option<PathBuf> {
    let nvcc = nvcc()?;
    Some(compile(
        &nvcc,
        "ipc_pair",
        &workspace().join("tests/cuda/ipc/ipc_pair.cu"),
    ))
}

/// One running rank: its standard input, and its standard output line by line.
struct Rank {
    rank: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Receiver<String>,
}

/// How a rank reaches the other.
enum Socket {
    /// Its end of a socket pair, inherited as descriptor [`SOCKET_FD`].
    Inherited(OwnedFd),
    /// A path rank 0 listens at and rank 1 connects to.
    Path(PathBuf),
}

impl Rank {
    /// Starts rank `rank` of `exe` on simgpu (`libs`), with `env` on a clean machine.
    fn start(exe: &Path, libs: &Path, rank: usize, socket: Socket, env: &[(&str, &str)]) -> Rank {
        let mut cmd = Command::new(exe);
        cmd.env("LD_LIBRARY_PATH", libs)
            .env_remove("LD_PRELOAD")
            .env_remove("SIMGPU_DEVICES")
            .env_remove("SIMGPU_MEM")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .envs(env.iter().copied())
            .arg(rank.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let inherited = match socket {
            Socket::Inherited(fd) => {
                cmd.arg(format!("fd:{SOCKET_FD}"));
                let raw = fd.as_raw_fd();
                // SAFETY: the closure runs in the child between fork and exec and calls only
                // dup2 and fcntl, which are async-signal-safe; `raw` stays open in the parent
                // until spawn returns (`fd` lives until then).
                unsafe {
                    cmd.pre_exec(move || {
                        let r = if raw == SOCKET_FD {
                            libc::fcntl(raw, libc::F_SETFD, 0)
                        } else {
                            libc::dup2(raw, SOCKET_FD)
                        };
                        if r < 0 {
                            Err(std::io::Error::last_os_error())
                        } else {
                            Ok(())
                        }
                    });
                }
                Some(fd)
            }
            Socket::Path(p) => {
                cmd.arg(p);
                None
            }
        };
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
        drop(inherited);
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (etx, stderr) = channel();
        let err = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if etx.send(line).is_err() {
                    break;
                }
            }
        });
        Rank {
            rank,
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    fn stderr_so_far(&self) -> String {
        self.stderr.try_iter().collect::<Vec<_>>().join("\n")
    }

    /// Everything it wrote to standard error, once it has exited (bounded wait for the
    /// end of the pipe).
    fn stderr_to_end(&self) -> String {
        let mut lines = Vec::new();
        while let Ok(line) = self.stderr.recv_timeout(LINE_WAIT) {
            lines.push(line);
        }
        lines.join("\n")
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{command}")
            .unwrap_or_else(|e| panic!("rank {}: writing {command:?}: {e}", self.rank));
        stdin.flush().unwrap();
    }

    /// The next line of standard output, which must start with `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        match self.lines.recv_timeout(LINE_WAIT) {
            Ok(line) if line.starts_with(prefix) => line,
            Ok(line) => panic!(
                "rank {}: expected a line starting {prefix:?}, got {line:?}\n--- stderr\n{}",
                self.rank,
                self.stderr_so_far()
            ),
            Err(e) => panic!(
                "rank {}: no line starting {prefix:?} ({e}); status {:?}\n--- stderr\n{}",
                self.rank,
                self.child.try_wait(),
                self.stderr_so_far()
            ),
        }
    }

    /// Waits (bounded) for the rank to exit; its status.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.stdin.take();
        for _ in 0..1200 {
            if let Some(status) = self.child.try_wait().expect("waiting for a rank") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("rank {} did not exit within two minutes", self.rank);
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `key=` in `line`.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// What rank `rank`'s accumulator holds after `steps` steps of `n` words, as FNV-1a 64 of
/// its bytes: computed here, independently of the program, from the program's documented
/// rules (rank r's buffer holds `(r + 1) * 1000003 + s * 7919 + i` at step s; the mix is
/// `acc = acc * 1664525 + peer + s`).
fn expected_digest(rank: usize, steps: u32, n: usize) -> String {
    let peer = (1 - rank) as u32;
    let mut acc = vec![0u32; n];
    for s in 0..steps {
        let base = (peer + 1)
            .wrapping_mul(1_000_003)
            .wrapping_add(s.wrapping_mul(7919));
        for (i, a) in acc.iter_mut().enumerate() {
            *a = a
                .wrapping_mul(1_664_525)
                .wrapping_add(base.wrapping_add(i as u32))
                .wrapping_add(s);
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in acc.iter().flat_map(|a| a.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Both ranks' set-up lines; returns the words per buffer.
fn ready(ranks: &mut [Rank; 2], devices: [&str; 2]) -> usize {
    let mut n = 0;
    for (r, rank) in ranks.iter_mut().enumerate() {
        let memory = rank.expect("memory ");
        // The own buffer counts on its own device; the imported one does not count again.
        assert_eq!(memory, "memory own=2097152 import=0", "rank {r}");
        let line = rank.expect("ready ");
        assert_eq!(field(&line, "rank"), r.to_string());
        assert_eq!(field(&line, "device"), devices[r], "rank {r}'s device");
        n = field(&line, "n").parse().expect("n is a number");
    }
    assert_eq!(n, (2 << 20) / 4);
    n
}

/// Runs `k` more steps on both ranks (ending at `done`), then checks both digests.
fn run_and_check(ranks: &mut [Rank; 2], k: u32, done: u32, n: usize) {
    for rank in ranks.iter_mut() {
        rank.send(&format!("run {k}"));
    }
    for rank in ranks.iter_mut() {
        assert_eq!(rank.expect("ran "), format!("ran {done}"));
        rank.send("digest");
    }
    for (r, rank) in ranks.iter_mut().enumerate() {
        let line = rank.expect("digest ");
        assert_eq!(field(&line, "steps"), done.to_string());
        assert_eq!(
            field(&line, "got"),
            field(&line, "expected"),
            "rank {r}: the device's accumulator differs from the CPU's: {line}"
        );
        assert_eq!(field(&line, "got"), expected_digest(r, done, n), "rank {r}");
    }
}

fn end(ranks: &mut [Rank; 2]) {
    for rank in ranks.iter_mut() {
        rank.send("end");
    }
    for (r, rank) in ranks.iter_mut().enumerate() {
        assert_eq!(rank.expect("done "), format!("done rank={r}"));
        let status = rank.wait_exit();
        assert!(
            status.success(),
            "rank {r} exited {status}\n{}",
            rank.stderr_so_far()
        );
    }
}

#[test]
fn two_ranks_on_two_simulated_devices_share_memory_step_by_step() {
    let Some(exe) = ipc_pair() else { return };
    let libs = simgpu_as_cuda();
    let (a, b) = UnixStream::pair().expect("a socket pair");
    let env = |visible| {
        [
            ("SIMGPU_DEVICES", "2"),
            ("SIMGPU_MEM", "1G"),
            ("CUDA_VISIBLE_DEVICES", visible),
        ]
    };
    let mut ranks = [
        Rank::start(&exe, libs.path(), 0, Socket::Inherited(a.into()), &env("0")),
        Rank::start(&exe, libs.path(), 1, Socket::Inherited(b.into()), &env("1")),
    ];
    // Each rank sees one device, its ordinal 0: physical device 0 and 1.
    let n = ready(&mut ranks, ["0", "0"]);
    run_and_check(&mut ranks, 3, 3, n);
    run_and_check(&mut ranks, 4, 7, n);
    end(&mut ranks);
}

#[test]
fn ranks_that_see_both_devices_meet_at_a_socket_path() {
    let Some(exe) = ipc_pair() else { return };
    let libs = simgpu_as_cuda();
    let dir = tempfile::tempdir().expect("a private folder");
    let path = dir.path().join("pair.sock");
    let env = [("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G")];
    let mut ranks = [
        Rank::start(&exe, libs.path(), 0, Socket::Path(path.clone()), &env),
        Rank::start(&exe, libs.path(), 1, Socket::Path(path), &env),
    ];
    // Rank r on device r; each imports memory of the other device.
    let n = ready(&mut ranks, ["0", "1"]);
    run_and_check(&mut ranks, 2, 2, n);
    end(&mut ranks);
}

#[test]
fn a_rank_whose_peer_died_fails_at_the_next_barrier() {
    let Some(exe) = ipc_pair() else { return };
    let libs = simgpu_as_cuda();
    let (a, b) = UnixStream::pair().expect("a socket pair");
    let env = [("SIMGPU_DEVICES", "2"), ("SIMGPU_MEM", "1G")];
    let mut ranks = [
        Rank::start(&exe, libs.path(), 0, Socket::Inherited(a.into()), &env),
        Rank::start(&exe, libs.path(), 1, Socket::Inherited(b.into()), &env),
    ];
    let n = ready(&mut ranks, ["0", "1"]);
    run_and_check(&mut ranks, 1, 1, n);
    ranks[1].child.kill().expect("killing rank 1");
    let _ = ranks[1].child.wait();
    ranks[0].send("run 1");
    let status = ranks[0].wait_exit();
    assert_eq!(status.code(), Some(1), "rank 0 exited {status}");
    let stderr = ranks[0].stderr_to_end();
    assert!(
        stderr.contains("ipc_pair rank 0: peer closed the socket"),
        "{stderr}"
    );
}
