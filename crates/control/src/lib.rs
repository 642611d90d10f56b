//! The control socket's protocol, one definition for both sides: the drop-in runtime
//! (`cudart-shim`, which serves `$CUDAW_RUN_DIR/PID.sock`) and `cudaw-ckpt` (which connects).
//!
//! # The socket
//!
//! A process under cudaw listens on a Unix stream socket named `PID.sock` ([`socket_path`])
//! in its run folder ([`open_run_dir`]: `$CUDAW_RUN_DIR`, else `$XDG_RUNTIME_DIR/cudaw`,
//! else `/tmp/cudaw-UID`; private, 0700). The socket is mode 0600 and removed at exit; one
//! left by a dead process of the same PID is replaced. The server checks the peer's uid
//! (`SO_PEERCRED`): only the process's owner or root may use it; anyone else gets a
//! `request` error naming both uids. `CUDAW_CONTROL_SOCKET=off` serves no socket.
//! `cudaw-ckpt` finds sockets in every folder a process may have used ([`find_run_dirs`]).
//!
//! # One exchange per connection
//!
//! One request line of JSON → zero or more progress lines (only when the request asks
//! with `"progress":true`) → one reply line of JSON; then the server closes the
//! connection. Lines end in `\n`; a request line may be at most [`MAX_REQUEST`] bytes. The
//! server gives a client 2 s to send its request line and 2 s to take each line it writes;
//! a client that goes away during a long request does not stop it.
//!
//! ```text
//! → {"cmd":"pause"}
//! ← {"ok":true,"pause":{"allocations":5,"bytes":327680,"ms":1.2,"changed":true}}
//! → {"cmd":"status"}
//! ← {"ok":true,"status":{"pid":42,"state":"paused","addressing":"mapped","devices":[...]}}
//! → {"cmd":"dump","path":"/abs/job.img","progress":true}
//! ← {"progress":{"phase":"evict","done":0,"total":327680}}
//! ← {"progress":{"phase":"write","done":327680,"total":327680}}
//! ← {"ok":true,"dump":{"path":"/abs/job.img","image_bytes":...,"state":"paused",...}}
//! → {"cmd":"restore","path":"/abs/job.img"}
//! ← {"ok":false,"kind":"bad_image","error":"checksum mismatch in chunk 0 of ..."}
//! → {"cmd":"stats","top":5}
//! ← {"ok":true,"stats":{"pid":42,"mode":"metrics","calls":[...],"kernels":[...],...}}
//! → {"cmd":"trace","path":"/abs/job.trace.json"}
//! ← {"ok":true,"trace":{"path":"/abs/job.trace.json","events":5120,"bytes":812345,"dropped":0}}
//! → nonsense
//! ← {"ok":false,"kind":"request","error":"malformed request ..."}
//! ```
//!
//! # Requests and replies
//!
//! A request is a [`Request`], tagged by `cmd`; unknown fields are refused. Fields left
//! out take the defaults shown (`false`, or [`DEFAULT_TOP`]). Paths must be absolute: the
//! process's working folder is not the client's. A reply is a [`Reply`]: `ok`, and on
//! success the one field named after the command.
//!
//! | request | reply on success |
//! | --- | --- |
//! | `{"cmd":"pause","progress":false,"release_context":false}` | `"pause"`: [`Moved`] (`allocations`, `bytes`, `ms`, `changed`) |
//! | `{"cmd":"resume","progress":false,"context_restored":false}` | `"resume"`: [`Moved`] |
//! | `{"cmd":"context_kept"}` | `"pause"`: [`Moved`] (`changed`: whether the process was released) |
//! | `{"cmd":"hold","window_ms":250,"lease_ms":30000}` | `"hold"`: [`Held`] (`idle`, `busy_devices`, `calls_in_flight`, `changed`, `ms`) |
//! | `{"cmd":"release"}` | `"release"`: [`Held`] (`changed`) |
//! | `{"cmd":"status"}` | `"status"`: [`Status`] (`pid`, `state`, `addressing`, `image`?, `kept_host`, `arena`, `arena_building`, `devices`: a list of [`DeviceStatus`], `busy`?) |
//! | `{"cmd":"dump","path":P,"leave_running":false,"keep_shared":false,"fd":false,"progress":false}` | `"dump"`: [`Dumped`] |
//! | `{"cmd":"restore","path":P,"force":false,"fd":false,"progress":false}` | `"restore"`: [`Restored`] |
//! | `{"cmd":"stats","top":10}` | `"stats"`: [`Stats`] (fails with `failed` when tracing is off) |
//! | `{"cmd":"trace","path":P,"fd":false}` | `"trace"`: [`TraceWritten`] (needs `CUDAW_TRACE=timeline`) |
//! | `{"cmd":"tracing","on":B}` | `"tracing"`: [`TracingSwitched`] (needs `CUDAW_TRACE` at start) |
//!
//! `status`, `stats` and `trace` are answered at once, also while a long request runs
//! (`status` then names it in `busy`); `pause`, `resume`, `hold`, `release`, `dump`,
//! `restore` and `tracing` run one at a time on the process's control thread, in the order they came, as the
//! pause and resume signals do. A pause while paused, or a resume while running, succeeds
//! with `changed: false`.
//!
//! # Releasing the context
//!
//! `cudaw-ckpt pause PID --release` sends a `pause` with `"release_context":true`: the
//! process pauses as usual (its memory evicted by cudaw, its gate closed, none of cudaw's
//! threads inside the driver) and is `released` from the reply on. The client then has
//! the driver checkpoint what is left — the context, modules, streams — with
//! `cuCheckpointProcessLock` and `cuCheckpointProcessCheckpoint` (NVIDIA's API is called
//! from another process). When the driver cannot (no such API, no permission), the client
//! sends `context_kept` and the process is plainly paused. A released process refuses a
//! `resume` without `"context_restored":true` (the `SIGUSR2` signal's too: its threads would
//! wait inside the locked driver), `dump`, `restore`, `hold` and the shared-memory
//! requests; `cudaw-ckpt resume` has the driver restore and unlock the context first.
//!
//! # Jobs: hold, then pause
//!
//! The ranks of a job wait for each other inside their collectives: a rank paused after
//! launching an all-reduce that another rank, held back before launching its own, never
//! joins would wait on the device for ever. `cudaw-ckpt pause --job` therefore pauses in
//! two steps: a `hold` to every process at once (each closes its gate and reports whether
//! its devices' work finished within the window); when every process is idle, a `pause`
//! to each (it only evicts); when some are not (the cut fell between two ranks'
//! launches of one collective), a `release` to every process, a short wait, and another
//! try. A hold that no pause, release or resume follows ends by itself at its lease.
//!
//! # Jobs: shared memory
//!
//! Memory one process exports (`cuMemExportToShareableHandle` to a POSIX descriptor) and
//! another imports — NCCL's buffers between the ranks of a node — stays on the device in a
//! plain pause. `cudaw-ckpt pause --job` evicts it too (not with `--keep-shared`), once
//! every process is paused: `shares` to each (its exports' descriptor numbers), `pair` to each with every
//! process's exports (each importer finds its exporter with `kcmp`), all once every
//! process is paused; then `mark` to each (the exports every descriptor of which an import
//! of the job matched, and the imports of those), `evict_shared` with `imports` to each,
//! then `evict_shared` to each (the exports). A failure part-way brings back what was
//! evicted, as a resume does, and the job stays paused without it. `resume --job` first sends `shares` (the imports not back, and their
//! exports), `reexport` to every exporter at once (its reply carries new descriptors,
//! `SCM_RIGHTS`), then `reimport` to every importer at once with them; then the resumes.
//! `dump --job` and `restore --job` bring the shared memory back the same way first; a
//! `dump --job` that leaves the job paused evicts it again after. A `resume` of a process
//! whose imports are not back is refused.
//!
//! | request | reply on success |
//! | --- | --- |
//! | `{"cmd":"shares"}` | `"shares"`: [`Shares`] (`exports`, `awaiting`) |
//! | `{"cmd":"pair","exports":[{"pid","handle","fd"}]}` | `"paired"`: [`Paired`] (`imports`, `matched`, `unpaired`) |
//! | `{"cmd":"mark","exports":[H],"imports":[H]}` | `"marked"`: [`Marked`] |
//! | `{"cmd":"evict_shared","imports":true}` | `"evicted_shared"`: [`Marked`] (what was evicted) |
//! | `{"cmd":"reexport","handles":[H]}` | `"reexported"`: [`Reexported`], one descriptor per handle with the reply |
//! | `{"cmd":"reimport","handles":[H]}` + one descriptor per handle | `"reimported"`: [`Reimported`] |
//!
//! # Progress lines
//!
//! When a `pause`, `resume`, `dump` or `restore` request says `"progress":true`, the server
//! sends [`Progress`] lines before the reply:
//! `{"progress":{"phase":"evict"|"write"|"verify"|"load","done":BYTES,"total":BYTES}}`,
//! at most about ten a second per phase, the first of a phase with `done` 0 and the last
//! with `done` = `total` ([`Phase`]). A client tells a progress line from the reply with
//! [`Line::parse`]: a progress line has a `progress` key and no `ok` key.
//!
//! # Passing files
//!
//! `dump`, `restore` and `trace` requests may carry the file itself (`"fd":true`): the
//! client opens the image to restore, or creates the file to write beside its target
//! ([`cudaw_files::NewFile`]), and passes the open descriptor with the request line's
//! first byte (`SCM_RIGHTS`, [`send_request`]; the server reads it with
//! [`recv_with_fds`]). Paths are then resolved, and permissions checked, by the client as
//! the requesting user in his own mount namespace and working folder; the process only
//! reads or writes the descriptor, and the client renames a written file into place once
//! the reply says it is complete. A request that says `"fd":true` without a descriptor, or
//! that comes with descriptors it does not take, is refused (`request`). Without `fd`, the
//! process opens `path` itself, as its owner: it writes through a temporary file beside
//! it, renamed into place, and reads only a regular file, never following a link.
//!
//! # Errors
//!
//! A failed request gets `{"ok":false,"kind":KIND,"error":MESSAGE}` ([`Reply::error`]);
//! the message says what, where and why. The kinds ([`ErrorKind`]), and the exit status
//! `cudaw-ckpt` gives for them:
//!
//! | `kind` | meaning | exit |
//! | --- | --- | --- |
//! | `request` | malformed request, no request line in time, a descriptor missing or extra, or permission denied (another user) | 1 |
//! | `bad_image` | not a readable cudaw image: not one at all, another format version, truncated, or corrupt | 3 |
//! | `mismatch` | a sound image, but not this process's (allocation table, addressing mode, producer) | 3 |
//! | `io` | the file system refused: the file cannot be created, written or read | 1 |
//! | `failed` | the process cannot do it now (memory on several devices, tracing off) or a device operation failed | 1 |
//! | `unsupported` | a dump of a process holding driver-level handles a pause cannot evict | 1 |
//! | `timeout` | a pause gave up at its deadline (`CUDAW_PAUSE_TIMEOUT`); the process runs on as before | 1 |
//!
//! A refused or failed request leaves the process as it was: a pause it began with is
//! undone, a paused process stays paused with its memory where it was.
//!
//! # Compatibility
//!
//! Requests of the first version (`{"cmd":"pause"}`, `{"cmd":"resume"}`,
//! `{"cmd":"status"}`) stay valid and get exactly one reply line; replies and statuses
//! of earlier servers, without the fields added since, still parse (those fields take
//! their defaults).
//!
//! Its I/O: passing a descriptor over the socket ([`send_request`], [`recv_with_fds`]), and
//! finding or creating the private run folder ([`open_run_dir`], [`find_run_dirs`]).

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The longest request line the server reads, in bytes (a path may be 4096 bytes long).
pub const MAX_REQUEST: usize = 16384;

fn is_false(b: &bool) -> bool {
    !*b
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Pause: evict every allocation to host memory and hold CUDA calls.
    Pause {
        /// Stream [`Progress`] lines before the reply.
        #[serde(default, skip_serializing_if = "is_false")]
        progress: bool,
        /// The client will then have the driver release the process's context
        /// (`cuCheckpointProcessLock` + `cuCheckpointProcessCheckpoint`, "Releasing the
        /// context"): the process is [`State::Released`] from the reply on, and only a
        /// `resume` with `context_restored` (or `context_kept`) ends that.
        #[serde(default, skip_serializing_if = "is_false")]
        release_context: bool,
        /// Who pauses: [`NODE_OWNER`] for the node daemon's swaps (a daemon started later
        /// knows them for its own: `paused_by` in the status); none for an operator.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Resume: restore every allocation at its address (from host memory, or from the
    /// image a dump left it in) and let calls through.
    Resume {
        /// Stream [`Progress`] lines before the reply.
        #[serde(default, skip_serializing_if = "is_false")]
        progress: bool,
        /// The client has had the driver restore the process's context
        /// (`cuCheckpointProcessRestore` + `cuCheckpointProcessUnlock`): a released process
        /// may resume. A released process refuses a resume without it.
        #[serde(default, skip_serializing_if = "is_false")]
        context_restored: bool,
    },
    /// The driver did not release the context after a `pause` with `release_context`
    /// (it lacks the API, or refused): the process is plainly paused again, its context
    /// on the GPU.
    ContextKept {},
    /// Report the process's state and memory.
    Status {},
    /// A job pause's first step ([`Held`]): close the gate (calls entering the library
    /// wait), wait up to `window_ms` for the calls in flight to leave and every device to
    /// finish its work, and say whether it did; the memory stays where it is. The gate
    /// stays closed either way until a `pause` (evicts; the devices' work must be done by
    /// then), a `release` or `resume` (opens it), or the end of `lease_ms` without one of
    /// them (the process opens it itself: a coordinator that died never leaves a job held).
    /// A `hold` while held waits again, for up to `window_ms`, and renews the lease.
    Hold {
        /// How long to wait for the process to be idle, in milliseconds.
        #[serde(default = "default_window_ms")]
        window_ms: u64,
        /// How long the hold lasts without a pause, release or resume, in milliseconds.
        #[serde(default = "default_lease_ms")]
        lease_ms: u64,
    },
    /// Undo a `hold`: open the gate (a paused process is not resumed by it).
    Release {},
    /// The node daemon's memory limit for this process on each of its devices (its job's
    /// `memory`), `null` for none: the stricter of it and the process's own
    /// (`CUDAW_MEM_LIMIT`) holds. Lowered below what the process holds, nothing is taken
    /// back: its allocations are refused until it has freed enough.
    Limit {
        /// Bytes, or none.
        #[serde(default)]
        memory: Option<u64>,
    },
    /// The memory this process shares with others ("Jobs: shared memory"): its exports'
    /// kept descriptors, and its imports evicted and not yet back.
    Shares {},
    /// Pair this process's imports with the exports they came from, among `exports`
    /// (every process's, from `shares`), by comparing descriptors (`kcmp`).
    Pair {
        /// Every export of the job: process, handle, descriptor number there.
        exports: Vec<PeerExport>,
    },
    /// While paused: what `evict_shared` evicts of the shared memory, these exports (each
    /// paired with an import of the job) and these imports (each of a marked export).
    /// Replaces earlier marks; cleared by `evict_shared` with `exports`, and by a pause or
    /// resume.
    Mark {
        /// Export handles of this process.
        #[serde(default)]
        exports: Vec<u64>,
        /// Import handles of this process.
        #[serde(default)]
        imports: Vec<u64>,
    },
    /// While paused: evict the marked imports (`imports`), or the marked exports. A job
    /// evicts every process's imports first, then the exports: no import then maps memory
    /// its exporter has replaced.
    EvictShared {
        /// The imports (else the exports).
        #[serde(default, skip_serializing_if = "is_false")]
        imports: bool,
    },
    /// While paused: bring these evicted exports back (re-created at their addresses, with
    /// their bytes) and export each again; the reply carries one new descriptor for each,
    /// in order (`SCM_RIGHTS`).
    Reexport {
        /// Export handles of this process.
        handles: Vec<u64>,
    },
    /// While paused: import these evicted imports from the descriptors passed with the
    /// request (one each, in order) and map them where they were.
    Reimport {
        /// Import handles of this process.
        handles: Vec<u64>,
    },
    /// Pause (if running), write every allocation to the image at `path` (written by the
    /// process itself, as its owner, through a temporary file renamed into place), then
    /// stay paused with the allocations' bytes only in the image (a later resume reads
    /// them from it), or resume when `leave_running`.
    Dump {
        /// The image's absolute path.
        path: String,
        /// Resume once the image is written (the host copies are loaded back).
        #[serde(default, skip_serializing_if = "is_false")]
        leave_running: bool,
        /// Leave on the device, outside the image, the driver-level memory the process
        /// shares with other processes (exported or imported `cuMem` handles: NCCL's
        /// buffers between ranks) instead of refusing the dump; for a job dump, every
        /// process of which is paused (they stay as they are while it is), restored into
        /// the same job.
        #[serde(default, skip_serializing_if = "is_false")]
        keep_shared: bool,
        /// The client passed the file to write (created beside `path`, open for reading
        /// and writing) with the request; it renames it to `path` after the reply.
        #[serde(default, skip_serializing_if = "is_false")]
        fd: bool,
        /// Stream [`Progress`] lines before the reply.
        #[serde(default, skip_serializing_if = "is_false")]
        progress: bool,
    },
    /// Check the image at `path` against the process (format, allocation table, every
    /// chunk checksum) before touching anything, then load it into device memory and
    /// resume. Pauses a running process first. A refused or failed restore leaves the
    /// process as it was (a paused process paused, its memory intact).
    Restore {
        /// The image's absolute path.
        path: String,
        /// Accept an image another process made when its allocation table matches.
        #[serde(default, skip_serializing_if = "is_false")]
        force: bool,
        /// The client passed the image, open for reading, with the request.
        #[serde(default, skip_serializing_if = "is_false")]
        fd: bool,
        /// Stream [`Progress`] lines before the reply.
        #[serde(default, skip_serializing_if = "is_false")]
        progress: bool,
    },
    /// Report the metrics (`CUDAW_TRACE`): calls, kernels, copies, and the `top` hottest
    /// and coldest allocations of the memory history.
    Stats {
        /// How many hottest and coldest allocations (default [`DEFAULT_TOP`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        top: Option<u32>,
    },
    /// Write the timeline so far (`CUDAW_TRACE=timeline`) as Chrome trace-event JSON to
    /// `path` (written by the process, as its owner, through a temporary file renamed into
    /// place).
    Trace {
        /// The file's absolute path.
        path: String,
        /// The client passed the file to write (created beside `path`) with the request;
        /// it renames it to `path` after the reply.
        #[serde(default, skip_serializing_if = "is_false")]
        fd: bool,
    },
    /// Switch tracing on or off in the running process (which started with
    /// `CUDAW_TRACE=metrics` or `timeline`): off, calls take the untraced paths and nothing
    /// new is recorded; what was recorded stays readable.
    Tracing {
        /// `true`: on; `false`: off.
        on: bool,
    },
}

/// The hottest and coldest allocations a `stats` request reports by default.
pub const DEFAULT_TOP: u32 = 10;

/// How long a `hold` waits for the process to be idle by default, in milliseconds.
pub const DEFAULT_HOLD_WINDOW_MS: u64 = 250;
/// How long a `hold` lasts without a pause, release or resume by default, in milliseconds.
pub const DEFAULT_HOLD_LEASE_MS: u64 = 30_000;

fn default_window_ms() -> u64 {
    DEFAULT_HOLD_WINDOW_MS
}

fn default_lease_ms() -> u64 {
    DEFAULT_HOLD_LEASE_MS
}

impl Request {
    /// `{"cmd":"pause"}`.
    pub const PAUSE: Request = Request::Pause {
        progress: false,
        release_context: false,
        by: None,
    };
    /// `{"cmd":"resume"}`.
    pub const RESUME: Request = Request::Resume {
        progress: false,
        context_restored: false,
    };

    /// Parses one request line.
    pub fn parse(line: &str) -> Result<Request, String> {
        serde_json::from_str(line.trim()).map_err(|e| {
            format!(
                "malformed request {:?}: {e} (expected one JSON line such as {{\"cmd\":\"pause\"}}, {{\"cmd\":\"resume\"}}, {{\"cmd\":\"status\"}}, {{\"cmd\":\"hold\"}}, {{\"cmd\":\"release\"}}, {{\"cmd\":\"stats\"}}, {{\"cmd\":\"dump\",\"path\":\"/abs/file\"}}, {{\"cmd\":\"restore\",\"path\":\"/abs/file\"}}, {{\"cmd\":\"trace\",\"path\":\"/abs/file\"}} or {{\"cmd\":\"tracing\",\"on\":false}})",
                truncate(line.trim(), 80)
            )
        })
    }

    /// The request as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The command's name (`pause`, `dump`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Pause { .. } => "pause",
            Request::Resume { .. } => "resume",
            Request::ContextKept {} => "context_kept",
            Request::Status {} => "status",
            Request::Hold { .. } => "hold",
            Request::Release {} => "release",
            Request::Limit { .. } => "limit",
            Request::Shares {} => "shares",
            Request::Pair { .. } => "pair",
            Request::Mark { .. } => "mark",
            Request::EvictShared { .. } => "evict_shared",
            Request::Reexport { .. } => "reexport",
            Request::Reimport { .. } => "reimport",
            Request::Dump { .. } => "dump",
            Request::Restore { .. } => "restore",
            Request::Stats { .. } => "stats",
            Request::Trace { .. } => "trace",
            Request::Tracing { .. } => "tracing",
        }
    }

    /// Whether the request says a descriptor comes with it.
    pub fn passes_fd(&self) -> bool {
        match self {
            Request::Dump { fd, .. } | Request::Restore { fd, .. } | Request::Trace { fd, .. } => {
                *fd
            }
            _ => false,
        }
    }

    /// Whether the client asked for progress lines.
    pub fn wants_progress(&self) -> bool {
        match self {
            Request::Pause { progress, .. }
            | Request::Resume { progress, .. }
            | Request::Dump { progress, .. }
            | Request::Restore { progress, .. } => *progress,
            Request::ContextKept {}
            | Request::Status {}
            | Request::Hold { .. }
            | Request::Release {}
            | Request::Limit { .. }
            | Request::Shares {}
            | Request::Pair { .. }
            | Request::Mark { .. }
            | Request::EvictShared { .. }
            | Request::Reexport { .. }
            | Request::Reimport { .. }
            | Request::Stats { .. }
            | Request::Trace { .. }
            | Request::Tracing { .. } => false,
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Whether the process runs or is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// CUDA calls go through.
    Running,
    /// Memory evicted, CUDA calls held.
    Paused,
    /// CUDA calls held, memory on the device: a job pause's first step (`hold`).
    Held,
    /// Paused, and the driver holds the rest (`cudaw-ckpt pause --release`): the context is
    /// checkpointed to host memory, the GPU holds nothing of the process. Only
    /// `cudaw-ckpt resume` (the driver's restore, then a `resume` with
    /// `context_restored`) brings it back.
    Released,
}

impl State {
    /// `running` or `paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Paused => "paused",
            State::Held => "held",
            State::Released => "released",
        }
    }
}

/// What a pause or resume moved.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Moved {
    /// Allocations evicted (pause) or restored (resume).
    pub allocations: u64,
    /// Bytes evicted or restored.
    pub bytes: u64,
    /// Milliseconds the request took.
    pub ms: f64,
    /// False when the request changed nothing (a pause while paused, a resume while
    /// running).
    pub changed: bool,
}

/// What a dump did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dumped {
    /// The image's path.
    pub path: String,
    /// The image's length in bytes.
    pub image_bytes: u64,
    /// Allocations written.
    pub allocations: u64,
    /// Allocation bytes written.
    pub bytes: u64,
    /// The image's digest (its trailer's xxh3-64), as `inspect` shows it.
    pub digest: u64,
    /// The pause the dump began with (`changed` false: the process was already paused).
    pub pause: Moved,
    /// Milliseconds spent writing the image (after the pause).
    pub write_ms: f64,
    /// The resume `--leave-running` ended with (`None` without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Moved>,
    /// The process's state now: `paused` (its allocations' bytes only in the image) or
    /// `running`.
    pub state: State,
    /// Milliseconds the whole request took.
    pub ms: f64,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    /// The image's path.
    pub path: String,
    /// Allocations loaded.
    pub allocations: u64,
    /// Bytes loaded.
    pub bytes: u64,
    /// The pause the restore began with (`changed` false: the process was already
    /// paused).
    pub pause: Moved,
    /// Milliseconds spent on the checks after the load: synchronising the devices and the
    /// image digest (over the chunk checksums the load saw; the chunks themselves are
    /// checked as they are loaded, within `load_ms`).
    pub verify_ms: f64,
    /// Milliseconds spent loading it into device memory: the one read of the image, every
    /// chunk's checksum checked.
    pub load_ms: f64,
    /// The process's state now (`running`).
    pub state: State,
    /// Milliseconds the whole request took.
    pub ms: f64,
}

/// Which part of a long request a [`Progress`] line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Copying device memory to host memory (pause, and the pause a dump or restore
    /// begins with).
    Evict,
    /// Writing the image (dump).
    Write,
    /// Checking chunks of an image without loading them: a restore's chunks the load did
    /// not read (none, as a rule: a restore checks each chunk as it loads it).
    Verify,
    /// Copying into device memory (resume, restore, `dump --leave-running`).
    Load,
}

impl Phase {
    /// A short verb for progress bars.
    pub fn verb(self) -> &'static str {
        match self {
            Phase::Evict => "evicting",
            Phase::Write => "writing",
            Phase::Verify => "verifying",
            Phase::Load => "loading",
        }
    }
}

/// Where a long request stands: `done` of `total` bytes of one phase. Sent as
/// `{"progress":{"phase":"write","done":1048576,"total":8589934592}}`, at most about ten
/// a second per phase, the first with `done` 0 and the last with `done` = `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The phase.
    pub phase: Phase,
    /// Bytes done.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
}

impl Progress {
    /// The progress line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(&ProgressLine { progress: *self }).unwrap_or_default();
        s.push('\n');
        s
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressLine {
    progress: Progress,
}

/// Why a request failed, for scripts (`cudaw-ckpt` exits 3 for `bad_image` and
/// `mismatch`, 1 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request line is malformed, or not allowed (permission).
    Request,
    /// The file is not a readable cudaw image: not one at all, another format version,
    /// truncated, or corrupt (a checksum does not match).
    BadImage,
    /// The image is sound but not this process's: its allocation table (addresses,
    /// sizes, creation order), addressing mode or producer differ.
    Mismatch,
    /// The file system refused: the image cannot be created, written or read.
    Io,
    /// The process cannot do it now (memory on several devices; an allocation's bytes
    /// are nowhere), or a device operation failed.
    Failed,
    /// The process holds memory the request cannot cover: a dump of a process with
    /// driver-level handles (`cuMemCreate`) that a pause cannot evict (exported, imported,
    /// bound to a multicast object, or not mapped over their whole size).
    Unsupported,
    /// A pause gave up at its deadline (`CUDAW_PAUSE_TIMEOUT`): calls in flight or the
    /// device's work did not finish; the process runs on as before.
    Timeout,
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure, when not ok (absent from servers before dump and restore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    /// A pause's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Moved>,
    /// A resume's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Moved>,
    /// A status request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// A hold's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Held>,
    /// A release's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Held>,
    /// A limit request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limited>,
    /// A shares request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<Shares>,
    /// A pair request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired: Option<Paired>,
    /// A mark request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marked: Option<Marked>,
    /// An evict_shared request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted_shared: Option<Marked>,
    /// A reexport's result (the descriptors come with the reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reexported: Option<Reexported>,
    /// A reimport's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reimported: Option<Reimported>,
    /// A dump's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<Dumped>,
    /// A restore's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<Restored>,
    /// A stats request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Box<Stats>>,
    /// A trace request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceWritten>,
    /// A tracing switch's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingSwitched>,
}

/// What a `hold` or `release` found and did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Held {
    /// Calls held at the gate, none in flight, and every device's work finished: a `pause`
    /// now only evicts.
    pub idle: bool,
    /// The devices whose work had not finished when the window closed (ordinals).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busy_devices: Vec<i32>,
    /// Calls that can put work on a device still in flight when the window closed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calls_in_flight: u64,
    /// Whether the gate changed (closed by this hold, opened by this release).
    pub changed: bool,
    /// Milliseconds the request took.
    pub ms: f64,
}

/// What a `limit` request set.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Limited {
    /// The node daemon's limit now, in bytes (none: `null`).
    pub memory: Option<u64>,
    /// Per device the process has memory on: (ordinal, the limit in force, bytes held).
    /// Held above the limit: its allocations are refused until it has freed enough.
    #[serde(default)]
    pub devices: Vec<(i32, Option<u64>, u64)>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One export of a process of the job, as `shares` reports it and `pair` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerExport {
    /// The exporting process (0 in a `shares` reply: the process itself).
    #[serde(default)]
    pub pid: u32,
    /// The export's handle there.
    pub handle: u64,
    /// A descriptor number there of the export (kept by cudaw).
    pub fd: i32,
}

/// An import and the export it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairedImport {
    /// The import's handle in this process.
    pub handle: u64,
    /// The exporting process.
    pub pid: u32,
    /// The export's handle there.
    pub export: u64,
}

/// What a process shares with others.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Shares {
    /// Its exports' kept descriptors.
    pub exports: Vec<PeerExport>,
    /// Its imports evicted and not yet back, with the exports they came from.
    pub awaiting: Vec<PairedImport>,
}

/// What a `pair` found.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Paired {
    /// Each import paired, with its export (and the export descriptor it matched).
    pub imports: Vec<PairedImport>,
    /// The export descriptors matched: (process, descriptor number).
    pub matched: Vec<(u32, i32)>,
    /// Imports whose export is not in the job (they stay on the device).
    pub unpaired: u64,
    /// Why descriptors could not be compared (`kcmp` refused: a seccomp profile, a kernel
    /// without it), when so: nothing was paired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a `mark` set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Marked {
    /// Exports marked.
    pub exports: u64,
    /// Imports marked.
    pub imports: u64,
}

/// What a `reexport` brought back.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reexported {
    /// The handles, in the order of the descriptors that come with the reply.
    pub handles: Vec<u64>,
}

/// What a `reimport` mapped back.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reimported {
    /// Imports mapped again.
    pub imports: u64,
}

/// The metrics, as `cudaw-ckpt stats --json` prints them (defined by `cudaw-trace`).
pub use cudaw_trace::Stats;

/// What a tracing switch did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracingSwitched {
    /// `CUDAW_TRACE`'s mode (`metrics` or `timeline`).
    pub mode: String,
    /// Whether tracing is on now.
    pub on: bool,
    /// Whether it was on before the request.
    pub was_on: bool,
}

/// What a trace request wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceWritten {
    /// The file.
    pub path: String,
    /// Events written.
    pub events: u64,
    /// The file's length in bytes.
    pub bytes: u64,
    /// Events the ring had dropped (the oldest) before.
    pub dropped: u64,
}

impl Reply {
    /// A failure reply.
    pub fn error(kind: ErrorKind, msg: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(msg.into()),
            kind: Some(kind),
            ..Reply::default()
        }
    }

    /// Parses one reply line.
    pub fn parse(line: &str) -> Result<Reply, String> {
        serde_json::from_str(line.trim()).map_err(|e| format!("malformed reply {line:?}: {e}"))
    }

    /// The reply as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self)
            .unwrap_or_else(|_| r#"{"ok":false,"error":"reply not encodable"}"#.to_owned());
        s.push('\n');
        s
    }
}

/// One line from the server: a progress line or the final reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// Where the request stands; more lines follow.
    Progress(Progress),
    /// The reply; the last line.
    Reply(Box<Reply>),
}

impl Line {
    /// Parses one line the server sent.
    pub fn parse(line: &str) -> Result<Line, String> {
        if let Ok(p) = serde_json::from_str::<ProgressLine>(line.trim()) {
            return Ok(Line::Progress(p.progress));
        }
        Reply::parse(line).map(|r| Line::Reply(Box::new(r)))
    }
}

/// One managed device's memory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// The CUDA device ordinal.
    pub ordinal: i32,
    /// The GPU behind the ordinal now (`GPU-…`, as `nvidia-smi -L` writes it; empty when
    /// the driver gives no UUID). A migration changes it, never the ordinal.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu: String,
    /// Live allocations.
    pub allocations: u64,
    /// Requested bytes of resident allocations.
    pub resident: u64,
    /// Requested bytes of evicted allocations (in host memory or in an image).
    pub evicted: u64,
    /// Of `evicted`, the bytes held only in an image file (after a dump), not in host
    /// memory.
    #[serde(default)]
    pub in_file: u64,
    /// Physical bytes mapped on the device now.
    pub mapped: u64,
    /// The memory limit, if any (`CUDAW_MEM_LIMIT`).
    pub limit: Option<u64>,
    /// Device bytes the process holds against its limit: cudaw's allocations with their
    /// granule rounding, the driver's `cuMemCreate` handles and managed memory.
    #[serde(default)]
    pub used: u64,
    /// The most it held at once.
    #[serde(default)]
    pub peak: u64,
    /// Allocations refused (over the limit, or the card shared through the node ledger).
    #[serde(default)]
    pub refused: u64,
    /// The node ledger (the processes under cudaw on this GPU), if the process is in one:
    /// bytes they hold together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_used: Option<u64>,
    /// The node ledger's capacity: the card's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_capacity: Option<u64>,
    /// Live driver-level handles (`cuMemCreate`, through `cudaGetDriverEntryPoint` or the
    /// driver layer): counted in `allocations`, their bytes in `resident`, `evicted` and
    /// `mapped` too.
    #[serde(default)]
    pub handles: u64,
    /// Of `resident`, bytes of driver-level handles a pause leaves on the device
    /// (exported or imported shareable handles, bound to multicast, not fully mapped).
    #[serde(default)]
    pub held: u64,
    /// Bytes of allocations waiting for room on this device now (they did not fit, and a
    /// node daemon may make room: `CUDAW_ALLOC_WAIT`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wanted: u64,
}

/// A process's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The process.
    pub pid: u32,
    /// Running or paused.
    pub state: State,
    /// `mapped` or `translated`.
    pub addressing: String,
    /// The image holding the paused process's memory (after a dump without
    /// `--leave-running`); a resume loads it from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Host memory kept from the last resume for the next pause's bytes
    /// (`CUDAW_HOST_REUSE`), given back to the kernel lazily (it counts in the process's
    /// RSS until the kernel takes it).
    #[serde(default)]
    pub kept_host: u64,
    /// Page-locked host arena made for pauses (`CUDAW_HOST_ARENA=pinned`), in bytes: host
    /// RAM the process holds locked, paused or not.
    #[serde(default)]
    pub arena: u64,
    /// Page-locked host arena being made, in bytes.
    #[serde(default)]
    pub arena_building: u64,
    /// Every device cudaw manages memory on.
    pub devices: Vec<DeviceStatus>,
    /// The node ledger's folder (`CUDAW_NODE_DIR`), when the process keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_dir: Option<String>,
    /// The job the process belongs to for the node scheduler (`cudaw run --job ID`,
    /// `CUDAW_JOB`); none: a job of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Threads waiting at the closed gate now (held or paused): the process wants its GPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting: u64,
    /// Kernel launches so far, every kernel's (counted in cudaw's driver layer; 0 where
    /// the process does not load it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub launches: u64,
    /// Who paused it, while it is paused (`by` in the pause): [`NODE_OWNER`] for a swap of
    /// the node daemon's, empty for an operator or a signal (no owner). Absent while it
    /// runs, and from processes of a cudaw before owners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
    /// `cudaw run --release-on-pause` (`CUDAW_RELEASE_ON_PAUSE=1`): `cudaw-ckpt pause`
    /// releases the context too unless told `--no-release`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub release_on_pause: bool,
    /// The request the process is carrying out now, when the status was taken while it
    /// ran (`dump, for 3.2 s`): `state` is then the pause gate's (paused while the
    /// request holds calls), and `image` is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy: Option<String>,
}

/// The forms [`parse_timeout`] takes, for messages.
pub const TIMEOUT_SYNTAX: &str = "60, 2.5s, 500ms, 2m, or off";

/// How long a pause waits for the calls in flight and the device by default.
pub const DEFAULT_PAUSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Parses `CUDAW_PAUSE_TIMEOUT` (and `cudaw run --pause-timeout`): seconds (`60`, `2.5`,
/// `60s`), `500ms`, `2m`; `off`, `none` or `0` wait for ever (`Some(None)`). `None`: not a
/// time.
pub fn parse_timeout(v: &str) -> Option<Option<std::time::Duration>> {
    let v = v.trim().to_ascii_lowercase();
    if matches!(v.as_str(), "off" | "none" | "0") {
        return Some(None);
    }
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v.as_str(), 1.0)
    };
    let secs = num.trim().parse::<f64>().ok()? * scale;
    (secs.is_finite() && secs > 0.0 && secs <= 86_400.0 * 365.0)
        .then(|| Some(std::time::Duration::from_secs_f64(secs)))
}

mod fd_pass;
mod run_dir;
pub use fd_pass::{recv_line_with_fds, recv_with_fds, send_line_with_fds, send_request, MAX_FDS};
pub use run_dir::{find_run_dirs, open_run_dir, run_dir, run_dir_from_env, OpenedRunDir, TMP};

/// Process `pid`'s socket in `dir`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// The PID a socket's file name names (`PID.sock`), if it is one.
pub fn pid_of_socket(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".sock")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `id` can name a job (`CUDAW_JOB`, `cudaw run --job`): 1 to 64 of letters,
/// digits, `-`, `_`, `.` and `:`.
pub fn job_id_ok(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// A GPU's UUID as `nvidia-smi -L` writes it (and [`DeviceStatus::gpu`] carries it): `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The owner the node daemon (`cudaw node`) gives its swaps' pauses.
pub const NODE_OWNER: &str = "cudaw-node";

/// The 16 bytes of a UUID written as [`uuid_text`] writes it (the `GPU-` prefix optional,
/// any case).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let t = text.strip_prefix("GPU-").unwrap_or(text);
    let groups: Vec<&str> = t.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lens != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::PAUSE,
            Request::RESUME,
            Request::Status {},
            Request::Pause {
                progress: true,
                release_context: false,
                by: None,
            },
            Request::Pause {
                progress: false,
                release_context: true,
                by: None,
            },
            Request::Resume {
                progress: false,
                context_restored: true,
            },
            Request::ContextKept {},
            Request::Dump {
                path: "/a b/c.img".into(),
                leave_running: true,
                keep_shared: false,
                fd: true,
                progress: true,
            },
            Request::Restore {
                path: "/x.img".into(),
                force: true,
                fd: false,
                progress: false,
            },
            Request::Stats { top: None },
            Request::Stats { top: Some(3) },
            Request::Trace {
                path: "/t.json".into(),
                fd: false,
            },
            Request::Tracing { on: false },
            Request::Tracing { on: true },
        ] {
            assert_eq!(Request::parse(&r.to_line()), Ok(r.clone()), "{r:?}");
        }
        assert_eq!(Request::PAUSE.to_line(), "{\"cmd\":\"pause\"}\n");
        assert_eq!(
            Request::parse("{\"cmd\":\"stats\"}"),
            Ok(Request::Stats { top: None })
        );
        assert_eq!(
            Request::parse("{\"cmd\":\"tracing\",\"on\":false}"),
            Ok(Request::Tracing { on: false })
        );
        assert!(Request::parse("{\"cmd\":\"tracing\"}").is_err());
        assert_eq!(
            Request::Dump {
                path: "/j.img".into(),
                leave_running: false,
                keep_shared: false,
                fd: false,
                progress: false
            }
            .to_line(),
            "{\"cmd\":\"dump\",\"path\":\"/j.img\"}\n"
        );
    }

    #[test]
    fn first_version_requests_stay_valid() {
        assert_eq!(Request::parse("{\"cmd\":\"pause\"}"), Ok(Request::PAUSE));
        assert_eq!(
            Request::parse("{\"cmd\":\"resume\"}\n"),
            Ok(Request::RESUME)
        );
        assert_eq!(
            Request::parse(" {\"cmd\":\"status\"} "),
            Ok(Request::Status {})
        );
        assert_eq!(
            Request::parse("{\"cmd\":\"dump\",\"path\":\"/p\",\"progress\":true}"),
            Ok(Request::Dump {
                path: "/p".into(),
                leave_running: false,
                keep_shared: false,
                fd: false,
                progress: true
            })
        );
    }

    #[test]
    fn release_fields_on_the_wire() {
        assert_eq!(
            Request::parse("{\"cmd\":\"pause\",\"release_context\":true}"),
            Ok(Request::Pause {
                progress: false,
                release_context: true,
                by: None,
            })
        );
        assert_eq!(
            Request::Resume {
                progress: false,
                context_restored: true
            }
            .to_line(),
            "{\"cmd\":\"resume\",\"context_restored\":true}\n"
        );
        assert_eq!(
            Request::parse("{\"cmd\":\"context_kept\"}"),
            Ok(Request::ContextKept {})
        );
        assert_eq!(Request::PAUSE.to_line(), "{\"cmd\":\"pause\"}\n");
        assert_eq!(State::Released.as_str(), "released");
    }

    #[test]
    fn progress_lines_and_replies_are_told_apart() {
        let p = Progress {
            phase: Phase::Write,
            done: 5,
            total: 10,
        };
        assert_eq!(
            p.to_line(),
            "{\"progress\":{\"phase\":\"write\",\"done\":5,\"total\":10}}\n"
        );
        assert_eq!(Line::parse(&p.to_line()), Ok(Line::Progress(p)));
        let r = Reply::error(ErrorKind::BadImage, "bad");
        assert_eq!(Line::parse(&r.to_line()), Ok(Line::Reply(Box::new(r))));
        assert!(Line::parse("{\"progress\":1}").is_err());
        assert!(Line::parse("nonsense").is_err());
    }

    #[test]
    fn malformed_requests_are_errors() {
        for bad in [
            "",
            "pause",
            "{}",
            "{\"cmd\":\"explode\"}",
            "{\"cmd\":1}",
            "[1]",
            "{\"cmd\":\"dump\"}",
            "{\"cmd\":\"dump\",\"path\":\"/p\",\"frobnicate\":1}",
            "{\"cmd\":\"status\",\"progress\":true}",
        ] {
            let e = Request::parse(bad).unwrap_err();
            assert!(e.contains("malformed request"), "{bad}: {e}");
        }
    }

    #[test]
    fn replies_round_trip() {
        let r = Reply {
            ok: true,
            status: Some(Status {
                pid: 7,
                state: State::Paused,
                addressing: "mapped".into(),
                image: Some("/j.img".into()),
                kept_host: 14 << 20,
                arena: 8 << 30,
                arena_building: 0,
                release_on_pause: true,
                devices: vec![DeviceStatus {
                    ordinal: 0,
                    gpu: "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9".into(),
                    allocations: 5,
                    resident: 0,
                    evicted: 327680,
                    in_file: 327680,
                    mapped: 0,
                    limit: None,
                    used: 0,
                    peak: 4 << 20,
                    refused: 1,
                    node_used: Some(2 << 20),
                    node_capacity: Some(80 << 30),
                    handles: 2,
                    held: 0,
                    wanted: 1 << 30,
                }],
                node_dir: Some("/dev/shm".into()),
                job: Some("train-a".into()),
                waiting: 2,
                launches: 5,
                paused_by: Some(NODE_OWNER.into()),
                busy: None,
            }),
            ..Reply::default()
        };
        assert_eq!(Reply::parse(&r.to_line()), Ok(r));
        let e = Reply::error(ErrorKind::Io, "no");
        assert_eq!(
            e.to_line(),
            "{\"ok\":false,\"error\":\"no\",\"kind\":\"io\"}\n"
        );
        // A first-version status (no in_file, no image) still parses.
        let old = r#"{"ok":true,"status":{"pid":1,"state":"running","addressing":"mapped","devices":[{"ordinal":0,"allocations":1,"resident":4,"evicted":0,"mapped":4,"limit":null}]}}"#;
        let r = Reply::parse(old).unwrap();
        assert_eq!(r.status.unwrap().devices[0].in_file, 0);
    }

    #[test]
    fn a_status_without_the_budget_fields_parses() {
        let old = r#"{"ordinal":0,"allocations":1,"resident":2,"evicted":0,"mapped":2097152,"limit":null}"#;
        let d: DeviceStatus = serde_json::from_str(old).unwrap();
        assert_eq!((d.used, d.peak, d.node_used), (0, 0, None));
    }

    #[test]
    fn run_dir_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            run_dir(
                env(&[("CUDAW_RUN_DIR", "/r"), ("XDG_RUNTIME_DIR", "/x")]),
                5
            ),
            PathBuf::from("/r")
        );
        assert_eq!(
            run_dir(env(&[("XDG_RUNTIME_DIR", "/x")]), 5),
            PathBuf::from("/x/cudaw")
        );
        assert_eq!(run_dir(env(&[]), 5), PathBuf::from("/tmp/cudaw-5"));
    }

    #[test]
    fn socket_names() {
        assert_eq!(pid_of_socket("123.sock"), Some(123));
        assert_eq!(pid_of_socket(".sock"), None);
        assert_eq!(pid_of_socket("12a.sock"), None);
        assert_eq!(pid_of_socket("123"), None);
    }

    #[test]
    fn uuids_round_trip_and_bad_ones_are_refused() {
        let u = [
            0x5a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x60, 0x71, 0x82, 0x93, 0xa4, 0xb5, 0xc6, 0xd7,
            0xe8, 0xf9,
        ];
        let t = uuid_text(&u);
        assert_eq!(t, "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9");
        assert_eq!(parse_uuid(&t), Some(u));
        assert_eq!(parse_uuid(&t[4..].to_uppercase()), Some(u));
        for bad in [
            "",
            "GPU-",
            "GPU-5a1b2c3d",
            "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8fz",
            "GPU-5a1b2c3d4e5f-6071-8293-a4b5c6d7e8f9-",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad}");
        }
    }
}
