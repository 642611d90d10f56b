//! Waiting for room instead of failing at once (the node scheduler's "swap instead of
//! OOM", `cudaw node`): an allocation that does not fit — refused by the device's budget
//! (the node ledger: the other jobs hold the card) or by the device itself — says so in
//! the process's status (`wanted`: the bytes and the device) and tries again every few
//! milliseconds, for up to `CUDAW_ALLOC_WAIT`, while the daemon swaps other jobs out to
//! make room; then it fails with the ordinary out-of-memory error.
//!
//! `CUDAW_ALLOC_WAIT` (`cudaw run --alloc-wait`; its clock stops while the process is
//! held or paused): `auto` (the default) waits up to 30 s
//! when a node daemon's socket is found (`$CUDAW_NODE_SOCKET`, `/run/cudaw/node.sock`, or
//! `node.sock` in the run folder), and not at all without one: a process on a node without
//! the daemon fails at once, as it always did. A time (`10s`, `500ms`) or `off`.
//!
//! The wait happens outside every lock of cudaw's, and out of the calls in flight
//! ([`crate::inflight::step_out`]): the thread waiting holds nothing a pause, a hold, a
//! dump or another allocation needs, and a hold or pause of its process does not wait for
//! it. Each retry waits at the gate while the process is held or paused (the node
//! scheduler holds a process until its turn).

use crate::log;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// An allocation waiting for room now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// The device.
    pub ordinal: i32,
    /// Its bytes.
    pub bytes: u64,
    /// Since when it waits.
    pub since: Instant,
}

/// The allocations waiting for room, one entry per waiting thread.
static WANTED: Mutex<Vec<(u64, Wanted)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Bytes waiting for room on each device, by ordinal (for status).
pub fn wanted() -> Vec<Wanted> {
    WANTED.lock().iter().map(|(_, w)| *w).collect()
}

/// How long an allocation that does not fit may wait for room.
fn limit() -> Duration {
    let cfg = crate::config::get();
    match cfg.alloc_wait {
        Some(d) => d,
        None if daemon_present() => Duration::from_secs(30),
        None => Duration::ZERO,
    }
}

/// Whether a node daemon's socket is there to make room.
fn daemon_present() -> bool {
    let cfg = crate::config::get();
    let mut places = vec![std::path::PathBuf::from("/run/cudaw/node.sock")];
    if let Some(p) = &cfg.node_socket {
        places.insert(0, p.clone());
    }
    let run_dir = cfg
        .run_dir
        .clone()
        .unwrap_or_else(|| cudaw_control::run_dir_from_env(rustix::process::getuid().as_raw()));
    places.push(run_dir.join("node.sock"));
    // A socket a killed daemon left behind answers nobody: connect, not just look.
    places
        .iter()
        .any(|p| p.exists() && std::os::unix::net::UnixStream::connect(p).is_ok())
}

thread_local! {
    /// Set while this thread retries an allocation: the budget's refusals go unlogged.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is retrying an allocation that waits for room.
pub fn quiet() -> bool {
    QUIET.with(|q| q.get())
}

/// Removes its entry when the wait ends, however it ends.
struct Entry(u64);

impl Drop for Entry {
    fn drop(&mut self) {
        WANTED.lock().retain(|(id, _)| *id != self.0);
    }
}

/// `attempt` again, every 5 ms, while it fails with `is_oom` and the wait allows, with
/// `bytes` on device `ordinal` in the status meanwhile. The first failure is `first`.
pub fn retry<T, E>(
    ordinal: i32,
    bytes: u64,
    first: E,
    is_oom: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    if !is_oom(&first) {
        return Err(first);
    }
    let limit = limit();
    if limit.is_zero() {
        return Err(first);
    }
    let since = Instant::now();
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    WANTED.lock().push((
        id,
        Wanted {
            ordinal,
            bytes,
            since,
        },
    ));
    let _entry = Entry(id);
    log::info(format_args!(
        "device {ordinal}: {bytes} bytes do not fit now: waiting up to {:.1} s for the node scheduler to make room",
        limit.as_secs_f64()
    ));
    let mut last = first;
    // The wait's clock stops while the process is held or paused: a job waiting for its
    // turn is not out of time for it.
    let mut gated = Duration::ZERO;
    while since.elapsed().saturating_sub(gated) < limit {
        // Out of the calls in flight while it sleeps: the daemon's hold of this process
        // (before it swaps others out for it) must not wait for this very allocation.
        // Back in, it waits at the gate while the process is held or paused.
        let ((), at_gate) =
            crate::inflight::step_out(|| std::thread::sleep(Duration::from_millis(5)));
        gated += at_gate;
        QUIET.with(|q| q.set(true));
        let tried = attempt();
        QUIET.with(|q| q.set(false));
        match tried {
            Ok(v) => {
                log::info(format_args!(
                    "device {ordinal}: {bytes} bytes allocated after waiting {:.1} ms for room",
                    since.elapsed().as_secs_f64() * 1e3
                ));
                return Ok(v);
            }
            Err(e) if is_oom(&e) => last = e,
            Err(e) => return Err(e),
        }
    }
    log::info(format_args!(
        "device {ordinal}: {bytes} bytes found no room within {:.1} s: out of memory",
        limit.as_secs_f64()
    ));
    Err(last)
}
