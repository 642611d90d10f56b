//! The driver's process checkpoint API (`cuCheckpointProcess*`, CUDA 12.8+ drivers), with
//! the real one's contract: called in one process about another, by PID.
//!
//! # Across processes
//!
//! Every process that initialises simgpu (`cuInit`, or the runtime's first call) listens
//! on a Unix stream socket `PID.sock` in the checkpoint folder: `$SIMGPU_CHECKPOINT_DIR`,
//! else `simgpu-checkpoint-UID` in the system's temporary folder (made 0700; the socket
//! is 0600 and removed at exit). The API's entry points in the calling process connect to
//! the target's socket, send one request line and read one answer line; a thread of the
//! target's carries the request out ([`Process`]). The target refuses a peer of another
//! user unless it is root (`CUDA_ERROR_NOT_PERMITTED`, as the real driver refuses a caller
//! without the rights).
//!
//! # The contract
//!
//! - States as the driver's `CUprocessState`: running → (lock) locked → (checkpoint)
//!   checkpointed → (restore) locked → (unlock) running. A call in the wrong state fails
//!   with `CUDA_ERROR_ILLEGAL_STATE` and changes nothing.
//! - Lock closes the target's gate: every simgpu call of the target made from then on waits
//!   until unlock; the lock waits for the calls inside simgpu to return and for the
//!   devices' queued work, up to `timeoutMs` (0: for ever). At the timeout the process is
//!   left running and the lock fails with `CUDA_ERROR_NOT_READY`.
//! - Checkpoint copies every device allocation's bytes into the target's host memory and
//!   frees the device memory: the devices' use by the process drops to 0, its contexts
//!   count as released, and its device addresses fault when touched
//!   ([`crate::memory::Memory::checkpoint`]). Memory shared with other processes
//!   (exported or imported POSIX descriptors) cannot be checkpointed:
//!   `CUDA_ERROR_NOT_SUPPORTED`.
//! - Restore brings every allocation back at the same addresses. Its GPU pairs
//!   (`CUcheckpointGpuPair`: old UUID → new UUID) move devices onto other simulated GPUs
//!   of the machine (`SIMGPU_DEVICES`): the pairs must name every checkpointed device
//!   once, and the new GPUs must exist, be distinct and have room
//!   (`CUDA_ERROR_INVALID_VALUE`, `CUDA_ERROR_OUT_OF_MEMORY`; nothing changed).
//! - No such process: `CUDA_ERROR_INVALID_VALUE`; a live process without simgpu
//!   initialised (no socket): `CUDA_ERROR_NOT_INITIALIZED`; the caller itself has not
//!   called `cuInit`: `CUDA_ERROR_NOT_INITIALIZED`; non-zero reserved fields:
//!   `CUDA_ERROR_INVALID_VALUE`.
//!
//! # A driver without the API
//!
//! `SIMGPU_CHECKPOINT=unsupported` in the calling process makes every entry point return
//! `CUDA_ERROR_NOT_SUPPORTED`. The entry points stay exported: a cdylib's exports cannot
//! be taken away at run time, and a second build of simgpu without them would double what
//! the tests build. A driver older than the API (before 550) lacks the symbols; callers
//! must treat both alike (cudaw-ckpt does, and tests the missing symbols on its own).

use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::config;
use crate::device::Machine;
use crate::error::{CuError, CuResult};

/// Names the folder of the checkpoint sockets.
pub const DIR_ENV: &str = "SIMGPU_CHECKPOINT_DIR";
/// `unsupported`: the calling process's entry points return `CUDA_ERROR_NOT_SUPPORTED`.
pub const API_ENV: &str = "SIMGPU_CHECKPOINT";

/// `CU_PROCESS_STATE_RUNNING`.
pub const RUNNING: u32 = 0;
/// `CU_PROCESS_STATE_LOCKED`.
pub const LOCKED: u32 = 1;
/// `CU_PROCESS_STATE_CHECKPOINTED`.
pub const CHECKPOINTED: u32 = 2;

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The gate every simgpu call of a process passes: closed by a lock, calls wait at it.
pub struct Gate {
    closed: AtomicBool,
    in_flight: AtomicUsize,
    wake: Mutex<()>,
    opened: Condvar,
}

thread_local! {
    /// How deep this thread is in simgpu calls (a call may make another).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// A call inside simgpu; leaves when dropped.
pub struct Inside<'a> {
    gate: Option<&'a Gate>,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        if let Some(g) = self.gate {
            g.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Gate {
    /// An open gate.
    pub const fn new() -> Gate {
        Gate {
            closed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            wake: Mutex::new(()),
            opened: Condvar::new(),
        }
    }

    /// Enters a call: waits while the gate is closed (the outermost call of a thread only).
    pub fn enter(&self) -> Inside<'_> {
        let outer = DEPTH.with(|d| {
            let v = d.get();
            d.set(v + 1);
            v == 0
        });
        if !outer {
            return Inside { gate: None };
        }
        loop {
            // SeqCst on both sides: either the lock sees this call, or this call sees the
            // gate closed.
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            if !self.closed.load(Ordering::SeqCst) {
                return Inside { gate: Some(self) };
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let mut w = lock_ignoring_poison(&self.wake);
            while self.closed.load(Ordering::SeqCst) {
                w = self.opened.wait(w).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// Closes the gate and waits until no call is inside, up to `deadline`; at the
    /// deadline opens it again and returns false.
    pub fn close(&self, deadline: Option<Instant>) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.open();
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    }

    /// Opens the gate: the waiting calls go on.
    pub fn open(&self) {
        let _w = lock_ignoring_poison(&self.wake);
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_all();
    }

    /// Calls inside now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

/// A process's side of the API: its gate and state.
pub struct Process {
    /// The gate its calls pass.
    pub gate: Gate,
    state: AtomicU32,
    /// One operation at a time.
    op: Mutex<Vec<usize>>,
}

/// What the target answers to a `usage` request (simgpu's own, for tests): what the
/// process holds on each of its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Its `CUprocessState`.
    pub state: u32,
    /// Device memory it holds, by ordinal.
    pub used: Vec<u64>,
    /// Contexts it holds (0 or 1), by ordinal: 0 once checkpointed.
    pub contexts: Vec<u32>,
    /// The physical device each ordinal is.
    pub physical: Vec<usize>,
}

impl Process {
    /// A running process's side.
    pub const fn new() -> Process {
        Process {
            gate: Gate::new(),
            state: AtomicU32::new(RUNNING),
            op: Mutex::new(Vec::new()),
        }
    }

    /// Its `CUprocessState`.
    pub fn state(&self) -> u32 {
        self.state.load(Ordering::SeqCst)
    }

    fn expect(&self, state: u32) -> CuResult<()> {
        if self.state() == state {
            Ok(())
        } else {
            Err(CuError::CUDA_ERROR_ILLEGAL_STATE)
        }
    }

    /// `cuCheckpointProcessLock`: see the module's contract. `timeout` `None`: for ever.
    pub fn lock(&self, machine: &Machine, timeout: Option<Duration>) -> CuResult<()> {
        let _op = lock_ignoring_poison(&self.op);
        self.expect(RUNNING)?;
        let deadline = timeout.map(|t| Instant::now() + t);
        if !self.gate.close(deadline) {
            return Err(CuError::CUDA_ERROR_NOT_READY);
        }
        // The calls are out; now the work they queued.
        machine.synchronize_all();
        self.state.store(LOCKED, Ordering::SeqCst);
        Ok(())
    }

    /// `cuCheckpointProcessCheckpoint`.
    pub fn checkpoint(&self, machine: &Machine) -> CuResult<()> {
        let mut op = lock_ignoring_poison(&self.op);
        self.expect(LOCKED)?;
        // SAFETY: locked: no call of the process is inside simgpu, none can enter, and the
        // devices' work is done, so nothing references device memory.
        let done = unsafe { machine.memory().checkpoint() }?;
        let mut devices = done.devices;
        for d in machine.devices() {
            if d.primary_state().1 {
                devices.push(d.ordinal());
            }
        }
        devices.sort_unstable();
        devices.dedup();
        *op = devices;
        self.state.store(CHECKPOINTED, Ordering::SeqCst);
        Ok(())
    }

    /// `cuCheckpointProcessRestore`, with the restore arguments' GPU pairs (old UUID, new
    /// UUID); none: every device back where it was.
    pub fn restore(&self, machine: &Machine, pairs: &[([u8; 16], [u8; 16])]) -> CuResult<()> {
        let mut op = lock_ignoring_poison(&self.op);
        self.expect(CHECKPOINTED)?;
        let remap = remap_of(machine, &op, pairs)?;
        // SAFETY: as for the checkpoint: the process is held.
        unsafe { machine.memory().restore(&remap) }?;
        for &(ordinal, physical, bytes) in &remap {
            machine.devices()[ordinal].become_physical(physical, bytes);
        }
        op.clear();
        self.state.store(LOCKED, Ordering::SeqCst);
        Ok(())
    }

    /// `cuCheckpointProcessUnlock`.
    pub fn unlock(&self) -> CuResult<()> {
        let _op = lock_ignoring_poison(&self.op);
        self.expect(LOCKED)?;
        self.state.store(RUNNING, Ordering::SeqCst);
        self.gate.open();
        Ok(())
    }

    /// What the process holds on each device.
    pub fn usage(&self, machine: &Machine) -> Usage {
        let memory = machine.memory();
        let released = memory.is_checkpointed();
        let n = machine.count();
        Usage {
            state: self.state(),
            used: (0..n).map(|d| memory.used(d)).collect(),
            contexts: machine
                .devices()
                .iter()
                .map(|d| u32::from(!released && d.primary_state().1))
                .collect(),
            physical: (0..n)
                .map(|d| memory.physical_id(d).unwrap_or(usize::MAX))
                .collect(),
        }
    }
}

impl Default for Process {
    fn default() -> Self {
        Process::new()
    }
}

/// The restore's moves, `(ordinal, new physical, its memory)`, from the GPU pairs. As the
/// real driver (580, two H100s): the pairs name every GPU of the machine once, those the
/// process does not see (`CUDA_VISIBLE_DEVICES`) too, each onto a distinct GPU of the
/// machine (a permutation). A process seeing one GPU of two, restored with the single
/// pair 0 → 1, gets `CUDA_ERROR_INVALID_VALUE`; with 0 → 1 and 1 → 0 it moves.
fn remap_of(
    machine: &Machine,
    checkpointed: &[usize],
    pairs: &[([u8; 16], [u8; 16])],
) -> CuResult<Vec<(usize, usize, u64)>> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let refuse = |why: String| {
        say!("simgpu: cuCheckpointProcessRestore: {why}; returning CUDA_ERROR_INVALID_VALUE");
        CuError::CUDA_ERROR_INVALID_VALUE
    };
    let gpus = machine.config.devices;
    let physical = |u: &[u8; 16]| (0..gpus).find(|&p| &config::uuid_of(p) == u);
    // Physical GPU -> physical GPU.
    let mut onto: Vec<Option<usize>> = vec![None; gpus];
    for (old, new) in pairs {
        let (Some(o), Some(n)) = (physical(old), physical(new)) else {
            return Err(refuse(format!(
                "no GPU of the machine is {} or {}",
                config::uuid_text(old),
                config::uuid_text(new)
            )));
        };
        if onto[o].is_some() || onto.contains(&Some(n)) {
            return Err(refuse(format!(
                "the pairs name {} or {} twice",
                config::uuid_text(old),
                config::uuid_text(new)
            )));
        }
        onto[o] = Some(n);
    }
    if let Some(left) = onto.iter().position(Option::is_none) {
        let of_process = checkpointed
            .iter()
            .any(|&c| machine.devices()[c].physical() == left);
        return Err(refuse(format!(
            "the pairs leave out {} ({}); they must name every GPU of the machine",
            config::uuid_text(&config::uuid_of(left)),
            if of_process {
                "a checkpointed device of the process"
            } else {
                "a GPU the process does not use"
            }
        )));
    }
    Ok(machine
        .devices()
        .iter()
        .filter_map(|d| {
            let to = onto[d.physical()].expect("every GPU named");
            (to != d.physical()).then(|| (d.ordinal(), to, machine.config.mem_bytes[to]))
        })
        .collect())
}

/// This process's side.
pub static PROCESS: Process = Process::new();

/// Enters one of this process's simgpu calls (every export but the checkpoint API's).
pub fn enter() -> Inside<'static> {
    PROCESS.gate.enter()
}

// ---- the socket ----

/// The folder of the checkpoint sockets: `$SIMGPU_CHECKPOINT_DIR`, else
/// `simgpu-checkpoint-UID` in the temporary folder.
pub fn socket_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            std::env::temp_dir().join(format!("simgpu-checkpoint-{uid}"))
        }
    }
}

/// Process `pid`'s socket.
pub fn socket_path(pid: i32) -> PathBuf {
    socket_dir().join(format!("{pid}.sock"))
}

static SERVING: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Starts this process's listener, once (at `cuInit`). Failures are said on standard error;
/// the process runs on without the API's target side.
pub fn serve_once() {
    SERVING.get_or_init(|| match serve() {
        Ok(path) => Some(path),
        Err(e) => {
            say!("simgpu: the checkpoint API's socket is not served: {e}");
            None
        }
    });
}

extern "C" fn remove_socket() {
    if let Some(Some(path)) = SERVING.get() {
        // A fork child inherits the handler: only the process the socket is named for
        // removes it.
        if path.file_stem().and_then(|s| s.to_str()) == Some(&std::process::id().to_string()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn serve() -> std::io::Result<PathBuf> {
    let dir = socket_dir();
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let path = dir.join(format!("{}.sock", std::process::id()));
    // One left by a dead process of the same PID.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    // SAFETY: registers a plain function with no captured state.
    unsafe { libc::atexit(remove_socket) };
    std::thread::Builder::new()
        .name("simgpu-checkpoint".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // One thread per request: a lock waiting for ever must not stop a state query.
                let _ = std::thread::Builder::new()
                    .name("simgpu-ckpt-req".into())
                    .spawn(move || answer(stream));
            }
        })?;
    Ok(path)
}

/// Whether `peer` may act on this process: its owner, or root.
fn permitted(stream: &UnixStream) -> bool {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    use std::os::fd::AsRawFd;
    // SAFETY: `cred` and `len` are live and sized for SO_PEERCRED.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    rc == 0 && (cred.uid == me || cred.uid == 0)
}

fn answer(stream: UnixStream) {
    let mut line = String::new();
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if BufReader::new(&stream).read_line(&mut line).is_err() {
        return;
    }
    let reply = if permitted(&stream) {
        carry_out(line.trim())
    } else {
        Err(CuError::CUDA_ERROR_NOT_PERMITTED)
    };
    let text = match reply {
        Ok(payload) => format!("0 {payload}\n"),
        Err(e) => format!("{}\n", e.code()),
    };
    let mut s = &stream;
    let _ = s.write_all(text.as_bytes());
}

fn carry_out(line: &str) -> CuResult<String> {
    let machine = Machine::get()?;
    let (cmd, arg) = line.split_once(' ').unwrap_or((line, ""));
    match cmd {
        "lock" => {
            let ms: u64 = arg.parse().map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
            let timeout = (ms > 0).then(|| Duration::from_millis(ms));
            PROCESS.lock(machine, timeout).map(|()| String::new())
        }
        "checkpoint" => PROCESS.checkpoint(machine).map(|()| String::new()),
        "restore" => {
            let pairs = parse_pairs(arg).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
            PROCESS.restore(machine, &pairs).map(|()| String::new())
        }
        "unlock" => PROCESS.unlock().map(|()| String::new()),
        "state" => Ok(PROCESS.state().to_string()),
        // SAFETY: gettid has no preconditions.
        "tid" => Ok(unsafe { libc::gettid() }.to_string()),
        "usage" => {
            let u = PROCESS.usage(machine);
            let list = |v: Vec<String>| v.join(",");
            Ok(format!(
                "{} {} {} {}",
                u.state,
                list(u.used.iter().map(u64::to_string).collect()),
                list(u.contexts.iter().map(u32::to_string).collect()),
                list(u.physical.iter().map(usize::to_string).collect()),
            ))
        }
        _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
    }
}

fn hex(bytes: &[u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn parse_pairs(arg: &str) -> Option<Vec<([u8; 16], [u8; 16])>> {
    arg.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (a, b) = p.split_once(':')?;
            Some((unhex(a)?, unhex(b)?))
        })
        .collect()
}

// ---- the calling side ----

/// Sends `line` to process `pid`'s simgpu and returns its answer's payload.
pub fn request(pid: i32, line: &str) -> CuResult<String> {
    request_in(&socket_dir(), pid, line)
}

/// [`request`], to a process whose checkpoint folder is `dir`.
pub fn request_in(dir: &std::path::Path, pid: i32, line: &str) -> CuResult<String> {
    if pid <= 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: kill with signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !alive {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let mut stream = match UnixStream::connect(dir.join(format!("{pid}.sock"))) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(CuError::CUDA_ERROR_NOT_PERMITTED)
        }
        Err(_) => return Err(CuError::CUDA_ERROR_NOT_INITIALIZED),
    };
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    if answer.is_empty() {
        // The target went away during the request.
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let answer = answer.trim_end_matches('\n');
    let (code, payload) = answer.split_once(' ').unwrap_or((answer, ""));
    match code.parse::<u32>() {
        Ok(0) => Ok(payload.to_owned()),
        Ok(c) => Err(CuError::from_code(c).unwrap_or(CuError::CUDA_ERROR_UNKNOWN)),
        Err(_) => Err(CuError::CUDA_ERROR_UNKNOWN),
    }
}

/// Whether the calling process's API answers at all (`SIMGPU_CHECKPOINT=unsupported`
/// makes it return `CUDA_ERROR_NOT_SUPPORTED`), and `cuInit` has run in it.
pub fn caller_ready() -> CuResult<()> {
    if std::env::var(API_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("unsupported")) {
        return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
    }
    Machine::get().map(drop)
}

/// The restore request's line for these GPU pairs.
pub fn restore_line(pairs: &[([u8; 16], [u8; 16])]) -> String {
    let list: Vec<String> = pairs
        .iter()
        .map(|(a, b)| format!("{}:{}", hex(a), hex(b)))
        .collect();
    format!("restore {}", list.join(","))
}

/// What process `pid` holds on each of its devices (simgpu's own request, for tests: what
/// `nvidia-smi` shows of a process on a GPU).
pub fn usage(pid: i32) -> CuResult<Usage> {
    usage_in(&socket_dir(), pid)
}

/// [`usage`] of a process whose checkpoint folder is `dir`.
pub fn usage_in(dir: &std::path::Path, pid: i32) -> CuResult<Usage> {
    let payload = request_in(dir, pid, "usage")?;
    let parts: Vec<&str> = payload.split(' ').collect();
    let bad = || CuError::CUDA_ERROR_UNKNOWN;
    if parts.len() != 4 {
        return Err(bad());
    }
    fn list<T: std::str::FromStr>(s: &str) -> Option<Vec<T>> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().ok())
            .collect()
    }
    Ok(Usage {
        state: parts[0].parse().map_err(|_| bad())?,
        used: list(parts[1]).ok_or_else(bad)?,
        contexts: list(parts[2]).ok_or_else(bad)?,
        physical: list(parts[3]).ok_or_else(bad)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::memory::Access;
    use std::sync::mpsc::channel;

    fn machine(devices: &str) -> Machine {
        let (config, _) = Config::from_vars(Some(devices), Some("1G"), None).unwrap();
        Machine::new(config).unwrap()
    }

    fn write(addr: u64, bytes: &[u8]) {
        // SAFETY: tests write only ranges they mapped read/write.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    }

    fn read(addr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        // SAFETY: tests read only ranges they mapped with access.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), len) };
        out
    }

    /// Whether reading `addr` faults, asked of a child process (a fault there kills only it).
    fn faults(addr: u64) -> bool {
        // SAFETY: the child only reads one byte and exits; it touches no lock.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child: a volatile read, then _exit.
            unsafe {
                std::ptr::read_volatile(addr as *const u8);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        libc::WIFSIGNALED(status)
    }

    #[test]
    fn states_follow_the_drivers_and_wrong_states_are_refused() {
        let m = machine("1");
        let p = Process::new();
        assert_eq!(p.state(), RUNNING);
        let illegal = Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
        assert_eq!(p.checkpoint(&m), illegal);
        assert_eq!(p.restore(&m, &[]), illegal);
        assert_eq!(p.unlock(), illegal);
        p.lock(&m, None).unwrap();
        assert_eq!(p.state(), LOCKED);
        assert_eq!(p.lock(&m, None), illegal);
        assert_eq!(p.restore(&m, &[]), illegal);
        p.checkpoint(&m).unwrap();
        assert_eq!(p.state(), CHECKPOINTED);
        assert_eq!(p.unlock(), illegal);
        assert_eq!(p.checkpoint(&m), illegal);
        assert_eq!(p.lock(&m, None), illegal);
        p.restore(&m, &[]).unwrap();
        assert_eq!(p.state(), LOCKED);
        p.unlock().unwrap();
        assert_eq!(p.state(), RUNNING);
    }

    #[test]
    fn lock_waits_for_calls_inside_and_holds_new_ones_until_unlock() {
        let m = machine("1");
        let p: &'static Process = Box::leak(Box::new(Process::new()));
        let (inside_tx, inside_rx) = channel();
        let (leave_tx, leave_rx) = channel::<()>();
        let caller = std::thread::spawn(move || {
            let _in = p.gate.enter();
            inside_tx.send(()).unwrap();
            leave_rx.recv().unwrap();
        });
        inside_rx.recv().unwrap();
        // A call inside past the timeout: NOT_READY, and the process runs on.
        assert_eq!(
            p.lock(&m, Some(Duration::from_millis(20))),
            Err(CuError::CUDA_ERROR_NOT_READY)
        );
        assert_eq!(p.state(), RUNNING);
        drop(p.gate.enter());
        leave_tx.send(()).unwrap();
        caller.join().unwrap();
        p.lock(&m, Some(Duration::from_secs(30))).unwrap();
        let (entered_tx, entered_rx) = channel();
        let late = std::thread::spawn(move || {
            let _in = p.gate.enter();
            entered_tx.send(()).unwrap();
        });
        assert!(
            entered_rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "a call entered a locked process"
        );
        p.unlock().unwrap();
        entered_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the held call goes on after unlock");
        late.join().unwrap();
        // Nested calls of one thread count once and never wait on themselves.
        let outer = p.gate.enter();
        let inner = p.gate.enter();
        assert_eq!(p.gate.in_flight(), 1);
        drop((inner, outer));
        assert_eq!(p.gate.in_flight(), 0);
    }

    #[test]
    fn checkpoint_frees_device_memory_and_restore_brings_it_back_at_its_addresses() {
        let m = machine("1");
        let p = Process::new();
        let linear = m.memory().alloc(0, 1 << 20).unwrap();
        write(linear, b"linear bytes");
        let (base, handle) = {
            let mut mem = m.memory();
            let base = mem.reserve(4 << 20, 0, 0).unwrap();
            let h = mem.create(0, 2 << 20).unwrap();
            mem.map(base, 2 << 20, 0, h).unwrap();
            // SAFETY: freshly mapped; nothing references it.
            unsafe { mem.set_access(base, 2 << 20, &[(0, Access::ReadWrite)]) }.unwrap();
            (base, h)
        };
        write(base + 4096, b"vmm bytes");
        let before = m.memory().used(0);
        assert!(before >= 3 << 20);
        p.lock(&m, None).unwrap();
        p.checkpoint(&m).unwrap();
        assert_eq!(m.memory().used(0), 0);
        assert_eq!(m.memory().info(0).unwrap().0, 1 << 30);
        assert!(
            faults(linear),
            "released cuMemAlloc memory is still readable"
        );
        assert!(
            faults(base + 4096),
            "released mapped memory is still readable"
        );
        let u = p.usage(&m);
        assert_eq!(
            (u.state, u.used, u.contexts),
            (CHECKPOINTED, vec![0], vec![0])
        );
        p.restore(&m, &[]).unwrap();
        p.unlock().unwrap();
        assert_eq!(m.memory().used(0), before);
        assert_eq!(read(linear, 12), b"linear bytes");
        assert_eq!(read(base + 4096, 9), b"vmm bytes");
        // The handle is still the program's.
        assert_eq!(m.memory().physical_size(handle), Ok(2 << 20));
    }

    #[test]
    fn restore_onto_another_gpu_by_pairs_and_refuses_bad_pairs() {
        let m = machine("3");
        let p = Process::new();
        let a = m.memory().alloc(0, 1 << 20).unwrap();
        write(a, b"moved");
        let (u0, u1, u2) = (config::uuid_of(0), config::uuid_of(1), config::uuid_of(2));
        p.lock(&m, None).unwrap();
        p.checkpoint(&m).unwrap();
        let invalid = Err(CuError::CUDA_ERROR_INVALID_VALUE);
        // Onto a GPU the machine lacks, twice the same old GPU, onto a device the process
        // still has as another ordinal, a GPU of the machine left out.
        assert_eq!(p.restore(&m, &[(u0, [7; 16])]), invalid);
        assert_eq!(p.restore(&m, &[(u0, u2), (u0, u2), (u1, u1)]), invalid);
        assert_eq!(p.restore(&m, &[(u0, u1), (u1, u1), (u2, u2)]), invalid);
        assert_eq!(p.restore(&m, &[(u0, u2), (u2, u0)]), invalid);
        assert_eq!(p.state(), CHECKPOINTED);
        // Device 0 onto GPU 2, and GPU 2 (the process's device 2) onto GPU 0: a swap;
        // GPU 1 stays.
        p.restore(&m, &[(u0, u2), (u2, u0), (u1, u1)]).unwrap();
        p.unlock().unwrap();
        assert_eq!(m.devices()[0].uuid(), u2);
        assert_eq!(m.devices()[0].physical(), 2);
        assert_eq!(m.devices()[2].physical(), 0);
        assert_eq!(p.usage(&m).physical, vec![2, 1, 0]);
        assert_eq!(read(a, 5), b"moved");
        assert!(m.memory().used(0) > 0);
    }

    #[test]
    fn restore_pairs_must_name_every_checkpointed_device_and_fit() {
        let (config, _) = Config::from_vars(Some("2"), Some("1G,4M"), None).unwrap();
        let m = Machine::new(config).unwrap();
        let p = Process::new();
        m.memory().alloc(0, 8 << 20).unwrap();
        m.memory().alloc(1, 1 << 20).unwrap();
        let (u0, u1) = (config::uuid_of(0), config::uuid_of(1));
        p.lock(&m, None).unwrap();
        p.checkpoint(&m).unwrap();
        // Device 1 is checkpointed too: the pairs must name it.
        assert_eq!(
            p.restore(&m, &[(u0, u1)]),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );
        // 8 MiB onto the 4 MiB GPU: no room, nothing changed.
        assert_eq!(
            p.restore(&m, &[(u0, u1), (u1, u0)]),
            Err(CuError::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(p.state(), CHECKPOINTED);
        assert_eq!(m.devices()[0].physical(), 0);
        p.restore(&m, &[]).unwrap();
        p.unlock().unwrap();
    }

    #[test]
    fn restore_pairs_name_every_gpu_of_the_machine_even_unseen_ones() {
        // The process sees GPU 0 of two (CUDA_VISIBLE_DEVICES=0), as on the H100 pair.
        let (config, _) = Config::from_vars(Some("2"), Some("1G"), Some("0")).unwrap();
        let m = Machine::new(config).unwrap();
        let p = Process::new();
        let a = m.memory().alloc(0, 1 << 20).unwrap();
        write(a, b"seen");
        let (u0, u1) = (config::uuid_of(0), config::uuid_of(1));
        p.lock(&m, None).unwrap();
        p.checkpoint(&m).unwrap();
        assert_eq!(
            p.restore(&m, &[(u0, u1)]),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );
        p.restore(&m, &[(u0, u1), (u1, u0)]).unwrap();
        p.unlock().unwrap();
        assert_eq!(m.devices()[0].physical(), 1);
        assert_eq!(read(a, 4), b"seen");
    }

    #[test]
    fn wire_pairs_round_trip() {
        let pairs = vec![(config::uuid_of(0), config::uuid_of(5))];
        let line = restore_line(&pairs);
        let arg = line.strip_prefix("restore ").unwrap();
        assert_eq!(parse_pairs(arg), Some(pairs));
        assert_eq!(parse_pairs(""), Some(vec![]));
        assert_eq!(parse_pairs("zz:00"), None);
    }

    #[test]
    fn a_process_that_does_not_exist_or_has_no_simgpu() {
        assert_eq!(request(0, "state"), Err(CuError::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(
            request(i32::MAX, "state"),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );
    }
}
