//! The node ledger: what the processes under cudaw on one GPU hold, shared by every user of
//! the node, so that their limits may add up to more than the card while the card is never
//! promised twice.
//!
//! # Where it lives
//!
//! One folder per node ([`node_dir`]): `$CUDAW_NODE_DIR`, else `/dev/shm`, else `/tmp` —
//! folders that exist on every Linux node, owned by root, world-writable and sticky, so no
//! user can create the folder first or remove another user's files. The folder is used
//! only if it and every folder above it is owned by root or by the calling user, and is
//! sticky wherever others may write ([`trusted_dir`]); otherwise joining fails, with the
//! reason, and the process's allocations are refused.
//!
//! # What it holds
//!
//! One small file per process per GPU, written only by that process:
//! `cudaw-ledger.KEY.PID.START.NONCE` ([`file_name`]), holding one checksummed [`Record`]
//! of [`RECORD`] bytes, mode 0644. `KEY` names the GPU (its UUID, `GPU-…`); the random
//! `NONCE` keeps anyone from taking the name first. Every write goes whole into a new file
//! (`O_EXCL | O_NOFOLLOW`, [`NEW_PREFIX`]) that is then renamed onto the entry (or linked
//! to a new name, replacing nothing): readers never see an entry half-written.
//!
//! The ledger is the saturating sum of the entries that count ([`crate::process::verdict`]):
//! the process is alive, not a zombie, started exactly when the entry says, and owns the
//! file. Of one process's several files (one it could no longer write, say), the valid one
//! it wrote last counts. A file that cannot be read or checked while its name points at a
//! live process of the file's owner is *damaged*: it counts as the whole card until that
//! process writes it again (each process checks and rewrites its own file on every ledger
//! call), so damage never hands out memory; junk that points at no live process is ignored.
//!
//! # Taking memory: claim, then check
//!
//! [`Ledger::acquire`] writes the claim into its own file first (`pending`), then reads
//! everyone's. If everything, claims included, fits the card, the claim becomes held;
//! if what others already hold leaves no room, it is refused; if only others' claims in
//! flight are in the way, the claim is withdrawn and tried again a little later. Of two
//! processes claiming at once, the one that reads last sees the other's claim, so the card
//! is never promised twice — with no shared lock, which a hostile user could hold for ever.
//!
//! # Failing closed
//!
//! A folder that cannot be trusted, a process whose own start time cannot be read, a
//! folder that cannot be read or written (full, read-only, immutable): the call fails with
//! a [`LedgerError`] saying why, and the caller refuses the allocation (it never goes on
//! without the ledger). A file of its own that was removed, replaced, truncated or
//! damaged is written again at the process's next ledger call; one that cannot be
//! replaced (immutable) gets a new name, and the old one loses to the newer.
//!
//! Processes that share a ledger must share a PID namespace (entries of processes that
//! `/proc` does not show, and `kill` does not find, do not count).

use crate::process::{self, ProcessId, Verdict};
use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::OpenOptions;
use std::hash::BuildHasher;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The variable naming the node folder.
pub const NODE_DIR_VAR: &str = "CUDAW_NODE_DIR";
/// The node folder when [`NODE_DIR_VAR`] is unset: the first of these that exists.
pub const DEFAULT_NODE_DIRS: [&str; 2] = ["/dev/shm", "/tmp"];
/// Every entry file's name starts so.
pub const PREFIX: &str = "cudaw-ledger.";
/// A record is written whole into a file named so (`cudaw-ledger-new.PID.START.NONCE`,
/// never read), then renamed or linked to its entry's name: no reader sees it half-written.
pub const NEW_PREFIX: &str = "cudaw-ledger-new.";
/// A record's first bytes.
pub const MAGIC: [u8; 8] = *b"CUDAWNLE";
/// The record layout version this code reads and writes; any other is damaged.
pub const VERSION: u32 = 1;
/// A record's length in bytes.
pub const RECORD: usize = 128;
/// Bytes of the GPU's key kept in a record.
pub const KEY_BYTES: usize = 40;
/// Tries of a claim that only others' claims in flight stand in the way of.
const CLAIM_TRIES: u32 = 2000;

/// The node folder: `$CUDAW_NODE_DIR` (`get` looks variables up), else the first of
/// [`DEFAULT_NODE_DIRS`] that is a folder.
pub fn node_dir(get: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(d) = get(NODE_DIR_VAR).filter(|v| !v.trim().is_empty()) {
        return PathBuf::from(d);
    }
    DEFAULT_NODE_DIRS
        .iter()
        .map(Path::new)
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("/tmp"))
        .to_owned()
}

/// A GPU's key as it appears in file names: ASCII letters, digits, `-` and `_`.
pub fn safe_key(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The name of a process's entry file for GPU `key`.
pub fn file_name(key: &str, id: ProcessId, nonce: u64) -> String {
    format!(
        "{PREFIX}{}.{}.{}.{nonce:016x}",
        safe_key(key),
        id.pid,
        id.start
    )
}

/// The process an entry file's name points at, if it is one of GPU `key`'s.
fn parse_name(name: &str, key: &str) -> Option<ProcessId> {
    let rest = name
        .strip_prefix(PREFIX)?
        .strip_prefix(key)?
        .strip_prefix('.')?;
    let mut parts = rest.split('.');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    let nonce = parts.next()?;
    (nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit()) && parts.next().is_none())
        .then_some(ProcessId { pid, start })
}

/// The process a file being written belongs to.
fn parse_new_name(name: &str) -> Option<ProcessId> {
    let mut parts = name.strip_prefix(NEW_PREFIX)?.split('.');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    (parts.next()?.len() == 16 && parts.next().is_none()).then_some(ProcessId { pid, start })
}

/// What can go wrong with the node ledger.
#[derive(Debug)]
pub enum LedgerError {
    /// Reading or writing the folder or a file failed.
    Io {
        /// The folder or file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// The folder is not one every process of the node can trust.
    Untrusted {
        /// The folder.
        path: PathBuf,
        /// Why, with the value seen and the value expected.
        why: String,
    },
    /// This process cannot tell itself apart from a later process with its PID.
    NoStartTime(String),
    /// The calling process is a fork of the one that joined the ledger.
    Forked,
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::Io { path, what, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
            LedgerError::Untrusted { path, why } => write!(
                f,
                "the node ledger folder {} cannot be trusted: {why} (use a folder owned by root and sticky where others may write, such as /dev/shm, or one of your own, in {NODE_DIR_VAR})",
                path.display()
            ),
            LedgerError::NoStartTime(why) => write!(
                f,
                "this process's start time cannot be read, so its ledger entry could not be told from a later process's: {why}"
            ),
            LedgerError::Forked => {
                f.write_str("the ledger was joined by the parent of this forked process")
            }
        }
    }
}

impl std::error::Error for LedgerError {}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> LedgerError + 'a {
    move |source| LedgerError::Io {
        path: path.to_owned(),
        what,
        source,
    }
}

/// The calling process's effective uid.
fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Checks that `dir` can hold the node ledger for this user, creating it (mode 1777) if
/// it is missing and its parent exists: it and every folder above it must be a folder
/// owned by root or by this user, sticky where group or others may write. Returns it with
/// symbolic links resolved.
pub fn trusted_dir(dir: &Path) -> Result<PathBuf, LedgerError> {
    let untrusted = |why: String| LedgerError::Untrusted {
        path: dir.to_owned(),
        why,
    };
    if !dir.is_absolute() {
        return Err(untrusted(
            "the path is relative; it must be absolute".into(),
        ));
    }
    if std::fs::symlink_metadata(dir).is_err() {
        match std::fs::create_dir(dir) {
            Ok(()) => {
                // Through a descriptor of the folder itself, never a link put in its place.
                let fd = rustix::fs::open(
                    dir,
                    rustix::fs::OFlags::DIRECTORY
                        | rustix::fs::OFlags::NOFOLLOW
                        | rustix::fs::OFlags::RDONLY
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_err(|e| io_err(dir, "opening the new folder")(e.into()))?;
                rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o1777))
                    .map_err(|e| io_err(dir, "setting mode 1777 on")(e.into()))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(dir, "creating")(e)),
        }
    }
    let real = std::fs::canonicalize(dir).map_err(io_err(dir, "resolving"))?;
    let me = euid();
    for d in real.ancestors() {
        let m = std::fs::symlink_metadata(d).map_err(io_err(d, "reading the metadata of"))?;
        if !m.is_dir() {
            return Err(untrusted(format!("{} is not a folder", d.display())));
        }
        if m.uid() != 0 && m.uid() != me {
            return Err(untrusted(format!(
                "{} is owned by uid {}; expected root (0) or this user ({me}), as another user could remove or replace the entries in it",
                d.display(),
                m.uid()
            )));
        }
        let mode = m.mode();
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(untrusted(format!(
                "{} has mode {:o}: group or others may write it but it is not sticky (chmod +t), so they could remove others' entries",
                d.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(real)
}

/// One process's entry as written in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The process.
    pub process: ProcessId,
    /// Rises with every write: of one process's files, the highest counts.
    pub seq: u64,
    /// Device bytes it holds.
    pub used: u64,
    /// Device bytes it is claiming, not yet held (counted as held by others).
    pub pending: u64,
    /// The most it held.
    pub peak: u64,
    /// Its own limit, if any.
    pub limit: Option<u64>,
    /// The card's total memory as this process sees it.
    pub capacity: u64,
    /// The GPU's key (its first [`KEY_BYTES`] bytes).
    pub key: [u8; KEY_BYTES],
}

/// FNV-1a, 64 bits: tells a torn or damaged record (not a forged one: file ownership
/// does that).
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn key_bytes(key: &str) -> [u8; KEY_BYTES] {
    let mut k = [0u8; KEY_BYTES];
    let b = key.as_bytes();
    let n = b.len().min(KEY_BYTES);
    k[..n].copy_from_slice(&b[..n]);
    k
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Record {
    /// The record's bytes (little-endian): magic (0), version (8, u32), length (12, u32),
    /// PID (16, u32), start time (24), seq (32), used (40), pending (48), peak (56), limit
    /// (64, `u64::MAX` = none), capacity (72), key (80, [`KEY_BYTES`], zero-padded),
    /// checksum of the bytes before it (120).
    pub fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(RECORD as u32).to_le_bytes());
        b[16..20].copy_from_slice(&self.process.pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.process.start.to_le_bytes());
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.used.to_le_bytes());
        b[48..56].copy_from_slice(&self.pending.to_le_bytes());
        b[56..64].copy_from_slice(&self.peak.to_le_bytes());
        b[64..72].copy_from_slice(&self.limit.unwrap_or(u64::MAX).to_le_bytes());
        b[72..80].copy_from_slice(&self.capacity.to_le_bytes());
        b[80..80 + KEY_BYTES].copy_from_slice(&self.key);
        let sum = checksum(&b[..RECORD - 8]);
        b[RECORD - 8..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Reads a record, or says what is wrong with it.
    pub fn decode(b: &[u8]) -> Result<Record, String> {
        if b.len() != RECORD {
            return Err(format!("{} bytes long, expected {RECORD}", b.len()));
        }
        if b[0..8] != MAGIC {
            return Err(format!("starts {:02x?}, expected {MAGIC:02x?}", &b[0..8]));
        }
        let (version, len) = (u32_at(b, 8), u32_at(b, 12));
        if version != VERSION || len as usize != RECORD {
            return Err(format!(
                "version {version} of {len} bytes, expected version {VERSION} of {RECORD}"
            ));
        }
        let (want, seen) = (checksum(&b[..RECORD - 8]), u64_at(b, RECORD - 8));
        if want != seen {
            return Err(format!(
                "checksum {seen:#018x}, expected {want:#018x} (torn or damaged)"
            ));
        }
        Ok(Record {
            process: ProcessId {
                pid: u32_at(b, 16),
                start: u64_at(b, 24),
            },
            seq: u64_at(b, 32),
            used: u64_at(b, 40),
            pending: u64_at(b, 48),
            peak: u64_at(b, 56),
            limit: Some(u64_at(b, 64)).filter(|&l| l != u64::MAX),
            capacity: u64_at(b, 72),
            key: b[80..80 + KEY_BYTES].try_into().expect("key bytes"),
        })
    }
}

/// One process's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The process.
    pub process: ProcessId,
    /// Device bytes it holds (with those it is claiming, for other processes).
    pub used: u64,
    /// The most it held.
    pub peak: u64,
    /// Its own limit, if any.
    pub limit: Option<u64>,
}

/// The ledger at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The card's total memory.
    pub capacity: u64,
    /// The entries that count (this process's first, when it is in the ledger).
    pub entries: Vec<Entry>,
    /// Live processes whose entry cannot be read: each counts as the whole card.
    pub damaged: Vec<(ProcessId, String)>,
}

impl View {
    /// Bytes held by the processes with entries, together (saturating).
    pub fn used(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |s, e| s.saturating_add(e.used))
    }

    /// Bytes no process holds: none while an entry is damaged.
    pub fn available(&self) -> u64 {
        if self.damaged.is_empty() {
            self.capacity.saturating_sub(self.used())
        } else {
            0
        }
    }
}

/// The answer to [`Ledger::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// Recorded as this process's.
    Granted,
    /// It would not fit beside what the other processes hold.
    Refused {
        /// The card's total memory.
        capacity: u64,
        /// Bytes the other processes hold (and claim).
        others: u64,
        /// Bytes this process holds.
        mine: u64,
    },
    /// The ledger cannot tell what the others hold (a live process's entry is damaged).
    Unknown {
        /// Whose entry, and what is wrong.
        why: String,
    },
}

/// What the other processes' entries add up to.
#[derive(Debug, Default)]
struct Others {
    /// Entries that count, one per process (the last written).
    entries: Vec<Record>,
    /// Live processes with no readable entry, and why.
    damaged: Vec<(ProcessId, String)>,
}

impl Others {
    fn held(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |s, r| s.saturating_add(r.used))
    }

    fn claimed(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |s, r| s.saturating_add(r.pending))
    }
}

/// Reads an entry file without following links or blocking: its owner and bytes (up to
/// one more than a record), or `None` when it is not a regular file.
fn read_entry(path: &Path) -> io::Result<Option<(u32, Vec<u8>)>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    let mut buf = Vec::with_capacity(RECORD + 1);
    file.take(RECORD as u64 + 1).read_to_end(&mut buf)?;
    Ok(Some((meta.uid(), buf)))
}

/// Reads every entry of GPU `key` in `dir` but those of `skip`, judging each process with
/// `judge`.
fn scan(
    dir: &Path,
    key: &str,
    skip: Option<ProcessId>,
    judge: Judge,
) -> Result<Others, LedgerError> {
    // Per process: the best valid record, or why none is.
    let mut best: BTreeMap<ProcessId, Result<Record, String>> = BTreeMap::new();
    let rd = std::fs::read_dir(dir).map_err(io_err(dir, "reading the folder"))?;
    for item in rd {
        let item = item.map_err(io_err(dir, "reading the folder"))?;
        let name = item.file_name();
        let Some(id) = name.to_str().and_then(|n| parse_name(n, key)) else {
            continue;
        };
        if Some(id) == skip {
            continue;
        }
        let path = item.path();
        // A write in progress may tear a read: a few tries before calling it damaged.
        let mut got = Err(String::new());
        let mut owner = None;
        for _ in 0..3 {
            got = match read_entry(&path) {
                Ok(None) => Err("not a regular file".into()),
                Ok(Some((uid, bytes))) => {
                    owner = Some(uid);
                    Record::decode(&bytes).and_then(|r| {
                        if r.process != id {
                            Err(format!(
                                "it holds process {}'s entry, its name says {}",
                                r.process.pid, id.pid
                            ))
                        } else if r.key != key_bytes(key) {
                            Err("it holds another GPU's entry".into())
                        } else {
                            Ok(r)
                        }
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => Err(format!("cannot be read: {e}")),
            };
            if got.is_ok() {
                break;
            }
        }
        let owner = match owner {
            Some(uid) => uid,
            // Not opened: its owner from the folder entry.
            None => match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => m.uid(),
                _ => continue,
            },
        };
        if !judge(id, owner).counts() {
            continue;
        }
        let got = got.map_err(|why| format!("{}: {why}", path.display()));
        let slot = best.entry(id).or_insert_with(|| got.clone());
        match (&*slot, &got) {
            (Err(_), Ok(_)) => *slot = got,
            (Ok(a), Ok(b)) if b.seq > a.seq || (b.seq == a.seq && b.used > a.used) => *slot = got,
            _ => {}
        }
    }
    let mut out = Others::default();
    for (id, r) in best {
        match r {
            Ok(r) => out.entries.push(r),
            Err(why) => out.damaged.push((id, why)),
        }
    }
    Ok(out)
}

/// Tells whether an entry counts: the process it names, and the uid owning its file.
pub type Judge = fn(ProcessId, u32) -> Verdict;

/// Reads GPU `key`'s ledger in `dir` without joining it (for tools): the entries that
/// count, and the damaged ones.
pub fn read(dir: &Path, key: &str, capacity: u64) -> Result<View, LedgerError> {
    let dir = trusted_dir(dir)?;
    let others = scan(&dir, &safe_key(key), None, process::verdict)?;
    Ok(View {
        capacity,
        entries: others.entries.iter().map(entry_of).collect(),
        damaged: others.damaged,
    })
}

fn entry_of(r: &Record) -> Entry {
    Entry {
        process: r.process,
        used: r.used.saturating_add(r.pending),
        peak: r.peak,
        limit: r.limit,
    }
}

/// This process's own entry file, as it left it.
struct Mine {
    path: PathBuf,
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
}

impl Mine {
    fn new(path: PathBuf, m: &std::fs::Metadata) -> Mine {
        Mine {
            path,
            dev: m.dev(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }

    /// How the file at its path differs from the one this process left there, if it does.
    fn tampered(&self) -> Option<String> {
        let p = self.path.display();
        match std::fs::symlink_metadata(&self.path) {
            Err(e) => Some(format!("{p} was removed ({e})")),
            Ok(m) if !m.is_file() || m.dev() != self.dev || m.ino() != self.ino => {
                Some(format!("{p} was replaced"))
            }
            Ok(m) if (m.mtime(), m.mtime_nsec()) != self.mtime || m.len() != RECORD as u64 => {
                Some(format!("{p} was written by another process"))
            }
            Ok(_) => None,
        }
    }
}

/// This process's membership of one GPU's ledger.
pub struct Ledger {
    dir: PathBuf,
    key: String,
    me: ProcessId,
    capacity: u64,
    used: u64,
    peak: u64,
    limit: Option<u64>,
    seq: u64,
    mine: Option<Mine>,
    judge: Judge,
    /// Whether `me` is the calling process (so a fork of it must not write as it).
    is_caller: bool,
    /// What was repaired since last asked (to be logged).
    notes: Vec<String>,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("dir", &self.dir)
            .field("key", &self.key)
            .field("me", &self.me)
            .field("used", &self.used)
            .field("file", &self.mine.as_ref().map(|m| &m.path))
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Joins GPU `key`'s ledger in the node folder `dir` as the calling process, on a card
    /// of `capacity` bytes, with its own limit `limit`.
    pub fn join(
        dir: &Path,
        key: &str,
        capacity: u64,
        limit: Option<u64>,
    ) -> Result<Ledger, LedgerError> {
        let me = ProcessId::current_checked().map_err(LedgerError::NoStartTime)?;
        let mut l = Self::join_as(dir, key, capacity, limit, me, process::verdict)?;
        l.is_caller = true;
        Ok(l)
    }

    /// As [`Ledger::join`], as process `me`, judging entries with `judge` (tests play
    /// several processes in one).
    pub fn join_as(
        dir: &Path,
        key: &str,
        capacity: u64,
        limit: Option<u64>,
        me: ProcessId,
        judge: Judge,
    ) -> Result<Ledger, LedgerError> {
        let dir = trusted_dir(dir)?;
        let mut l = Ledger {
            dir,
            key: safe_key(key),
            me,
            capacity,
            used: 0,
            peak: 0,
            limit,
            seq: 0,
            mine: None,
            judge,
            is_caller: false,
            notes: Vec::new(),
        };
        l.sweep();
        l.write(0)?;
        Ok(l)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This process's entry file, while it has one.
    pub fn path(&self) -> Option<&Path> {
        self.mine.as_ref().map(|m| m.path.as_path())
    }

    /// This process's entry, as it knows it.
    pub fn entry(&self) -> Entry {
        Entry {
            process: self.me,
            used: self.used,
            peak: self.peak,
            limit: self.limit,
        }
    }

    /// What was repaired since the last call (a file of its own written again), to log.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    fn check_fork(&self) -> Result<(), LedgerError> {
        if self.is_caller && std::process::id() != self.me.pid {
            return Err(LedgerError::Forked);
        }
        Ok(())
    }

    /// Removes the entry files of this GPU, and the files being written, whose process is
    /// gone, where this user may (its own; any, as root). Best effort: what stays does not
    /// count anyway.
    fn sweep(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for item in rd.flatten() {
            let name = item.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| parse_name(n, &self.key).or_else(|| parse_new_name(n)))
            else {
                continue;
            };
            let Ok(m) = item.metadata() else { continue };
            if id != self.me && (self.judge)(id, m.uid()) == Verdict::Gone {
                let _ = std::fs::remove_file(item.path());
            }
        }
    }

    fn record(&self, pending: u64) -> Record {
        Record {
            process: self.me,
            seq: self.seq,
            used: self.used,
            pending,
            peak: self.peak,
            limit: self.limit,
            capacity: self.capacity,
            key: key_bytes(&self.key),
        }
    }

    /// Writes `bytes` whole into a new file of ours that readers do not read
    /// ([`NEW_PREFIX`]): its path and metadata.
    fn stage(&self, bytes: &[u8; RECORD]) -> Result<(PathBuf, std::fs::Metadata), LedgerError> {
        let state = RandomState::new();
        let mut taken = None;
        for n in 0..8u64 {
            let nonce = state.hash_one((self.seq, n));
            let path = self.dir.join(format!(
                "{NEW_PREFIX}{}.{}.{nonce:016x}",
                self.me.pid, self.me.start
            ));
            let file = match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    taken = Some(io_err(&path, "creating")(e));
                    continue;
                }
                Err(e) => return Err(io_err(&path, "creating")(e)),
            };
            let written = (|| {
                // Readable by every user whatever the umask: others must read it to count it.
                file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
                file.write_all_at(bytes, 0)?;
                file.metadata()
            })();
            return match written {
                Ok(m) => Ok((path, m)),
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    Err(io_err(&path, "writing")(e))
                }
            };
        }
        Err(taken.expect("eight names taken"))
    }

    /// Gives the staged file `staged` an entry name of its own, replacing nothing.
    fn link_new(&self, staged: &Path) -> Result<PathBuf, LedgerError> {
        let state = RandomState::new();
        let mut taken = None;
        for n in 0..8u64 {
            let nonce = state.hash_one((self.seq, n));
            let path = self.dir.join(file_name(&self.key, self.me, nonce));
            match std::fs::hard_link(staged, &path) {
                Ok(()) => return Ok(path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    taken = Some(io_err(&path, "creating")(e));
                }
                Err(e) => return Err(io_err(&path, "creating")(e)),
            }
        }
        Err(taken.expect("eight names taken"))
    }

    /// Writes our record (with `pending` bytes claimed): whole into a new file, then
    /// renamed onto our entry, so that no reader sees it half-written. An entry that was
    /// removed, replaced or damaged is so written again; one that cannot be replaced
    /// (immutable, say) gets a new name, and the newer counts.
    fn write(&mut self, pending: u64) -> Result<(), LedgerError> {
        self.seq += 1;
        let bytes = self.record(pending).encode();
        let (staged, meta) = self.stage(&bytes)?;
        let mut why = None;
        if let Some(m) = &self.mine {
            let tampered = m.tampered();
            match std::fs::rename(&staged, &m.path) {
                Ok(()) => {
                    if let Some(t) = tampered {
                        self.notes.push(format!("{t}; written again"));
                    }
                    self.mine = Some(Mine::new(m.path.clone(), &meta));
                    return Ok(());
                }
                Err(e) => why = Some(format!("replacing {} failed: {e}", m.path.display())),
            }
        }
        let linked = self.link_new(&staged);
        let _ = std::fs::remove_file(&staged);
        let path = linked?;
        if let Some(old) = self.mine.take() {
            let gone = std::fs::remove_file(&old.path);
            self.notes.push(format!(
                "{}; this process's entry is now {}{}",
                why.unwrap_or_default(),
                path.display(),
                match gone {
                    Ok(()) => String::new(),
                    Err(e) => format!(
                        " (the old file could not be removed: {e}; the newer entry counts)"
                    ),
                }
            ));
        }
        self.mine = Some(Mine::new(path, &meta));
        Ok(())
    }

    /// Records `bytes` more as this process's if, beside what the other processes hold
    /// and claim, they fit the card.
    pub fn acquire(&mut self, bytes: u64) -> Result<Grant, LedgerError> {
        self.check_fork()?;
        let want = self.used.saturating_add(bytes);
        let mut others = Others::default();
        for attempt in 0..CLAIM_TRIES {
            // Claim first, then look: of two claims at once, the later look sees both.
            self.write(bytes)?;
            let seen = scan(&self.dir, &self.key, Some(self.me), self.judge);
            others = match seen {
                Ok(o) => o,
                Err(e) => {
                    let _ = self.write(0);
                    return Err(e);
                }
            };
            if let Some((id, why)) = others.damaged.first() {
                let why = format!(
                    "the entry of live process {} cannot be read ({why}), so what it holds is unknown; it is written again at that process's next allocation",
                    id.pid
                );
                self.write(0)?;
                return Ok(Grant::Unknown { why });
            }
            let held = others.held();
            let all = want.saturating_add(held);
            if all.saturating_add(others.claimed()) <= self.capacity {
                let before = (self.used, self.peak);
                self.used = want;
                self.peak = self.peak.max(want);
                if let Err(e) = self.write(0) {
                    // Not granted: what this process holds is what it held.
                    (self.used, self.peak) = before;
                    return Err(e);
                }
                return Ok(Grant::Granted);
            }
            self.write(0)?;
            if all > self.capacity {
                break;
            }
            // Only claims in flight stand in the way: try again shortly, at a time of our
            // own, so that racing claimants part.
            let jitter = RandomState::new().hash_one(attempt) % 64;
            std::thread::sleep(std::time::Duration::from_micros(
                (10 << attempt.min(5)) + jitter,
            ));
        }
        Ok(Grant::Refused {
            capacity: self.capacity,
            others: others.held().saturating_add(others.claimed()),
            mine: self.used,
        })
    }

    /// Records that this process gave `bytes` back.
    pub fn release(&mut self, bytes: u64) -> Result<(), LedgerError> {
        self.check_fork()?;
        self.used = self.used.saturating_sub(bytes);
        self.write(0)
    }

    /// The ledger now: this process's entry first, then the others' that count.
    pub fn view(&mut self) -> Result<View, LedgerError> {
        self.check_fork()?;
        // Our own file checked (and written again if it was damaged) on every look.
        self.write(0)?;
        let others = scan(&self.dir, &self.key, Some(self.me), self.judge)?;
        let mut entries = vec![self.entry()];
        entries.extend(others.entries.iter().map(entry_of));
        Ok(View {
            capacity: self.capacity,
            entries,
            damaged: others.damaged,
        })
    }

    /// Removes this process's entry (at exit).
    pub fn leave(&mut self) -> Result<(), LedgerError> {
        self.check_fork()?;
        self.used = 0;
        if let Some(m) = self.mine.take() {
            if let Err(e) = std::fs::remove_file(&m.path) {
                // Cannot be removed: at least say it holds nothing (it stops counting when
                // this process is gone anyway).
                let path = m.path.clone();
                self.mine = Some(m);
                let _ = self.write(0);
                return Err(io_err(&path, "removing")(e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const G: u64 = 1 << 30;
    const M2: u64 = 2 << 20;
    const KEY: &str = "GPU-1234";

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// A process that cannot exist here (above the kernel's largest PID, 2^22).
    fn fake(n: u32) -> ProcessId {
        ProcessId {
            pid: (1 << 30) + n,
            start: 7,
        }
    }

    fn everyone_lives(_: ProcessId, _: u32) -> Verdict {
        Verdict::Live
    }

    /// Processes with odd PIDs are dead.
    fn odd_ones_died(p: ProcessId, _: u32) -> Verdict {
        if p.pid % 2 == 0 {
            Verdict::Live
        } else {
            Verdict::Gone
        }
    }

    fn join(dir: &Path, cap: u64, limit: Option<u64>, n: u32, judge: Judge) -> Ledger {
        Ledger::join_as(dir, KEY, cap, limit, fake(n), judge).unwrap()
    }

    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn processes_share_the_card() {
        let d = tmp();
        let mut a = join(d.path(), 4 * G, Some(3 * G), 10, everyone_lives);
        let mut b = join(d.path(), 4 * G, Some(3 * G), 12, everyone_lives);
        assert_eq!(a.acquire(3 * G).unwrap(), Grant::Granted);
        assert_eq!(
            b.acquire(2 * G).unwrap(),
            Grant::Refused {
                capacity: 4 * G,
                others: 3 * G,
                mine: 0
            }
        );
        assert_eq!(b.acquire(G).unwrap(), Grant::Granted);
        assert!(matches!(b.acquire(1).unwrap(), Grant::Refused { .. }));
        a.release(G).unwrap();
        assert_eq!(b.acquire(G).unwrap(), Grant::Granted);
        let v = a.view().unwrap();
        assert_eq!((v.capacity, v.used(), v.available()), (4 * G, 4 * G, 0));
        assert_eq!(v.entries.len(), 2);
        assert_eq!(b.entry().peak, 2 * G);
        assert_eq!(b.entry().limit, Some(3 * G));
        a.leave().unwrap();
        assert_eq!(files(d.path()).len(), 1, "a left: its file is gone");
        assert_eq!(
            read(d.path(), KEY, 4 * G).unwrap().entries.len(),
            0,
            "fake pids are not alive to a reader"
        );
        assert_eq!(b.view().unwrap().used(), 2 * G);
    }

    #[test]
    fn dead_processes_do_not_count_and_their_files_are_swept() {
        let d = tmp();
        let mut dead = join(d.path(), 4 * G, None, 11, odd_ones_died);
        assert_eq!(dead.acquire(3 * G).unwrap(), Grant::Granted);
        let mut live = join(d.path(), 4 * G, None, 20, odd_ones_died);
        assert_eq!(live.view().unwrap().used(), 0);
        assert_eq!(
            files(d.path()).len(),
            1,
            "joining swept the dead one's file"
        );
        assert_eq!(live.acquire(4 * G).unwrap(), Grant::Granted);
    }

    #[test]
    fn real_processes_dead_zombie_reused_or_forged_do_not_count() {
        let d = tmp();
        let me = ProcessId::current_checked().unwrap();
        let uid = euid();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let cid = ProcessId {
            pid,
            start: process::start_time(pid).unwrap(),
        };
        let mut theirs =
            Ledger::join_as(d.path(), KEY, 4 * G, None, cid, process::verdict).unwrap();
        assert_eq!(theirs.acquire(3 * G).unwrap(), Grant::Granted);
        // Forgeries: the child's PID with another start time (a reused PID), PID 1 with
        // start time 0, and u64::MAX bytes in each.
        for id in [
            ProcessId {
                pid,
                start: cid.start + 1,
            },
            ProcessId { pid: 1, start: 0 },
        ] {
            let rec = Record {
                process: id,
                seq: 1,
                used: u64::MAX,
                pending: 0,
                peak: 0,
                limit: None,
                capacity: 4 * G,
                key: key_bytes(KEY),
            };
            std::fs::write(d.path().join(file_name(KEY, id, 1)), rec.encode()).unwrap();
        }
        let mut mine = Ledger::join_as(d.path(), KEY, 4 * G, None, me, process::verdict).unwrap();
        assert_eq!(mine.view().unwrap().used(), 3 * G);
        assert!(matches!(
            mine.acquire(2 * G).unwrap(),
            Grant::Refused { others, .. } if others == 3 * G
        ));
        // Killed, not reaped: a zombie's share is free at once.
        child.kill().unwrap();
        let mut granted = mine.acquire(2 * G).unwrap();
        for _ in 0..2000 {
            if granted == Grant::Granted {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            granted = mine.acquire(2 * G).unwrap();
        }
        assert_eq!(granted, Grant::Granted, "the zombie's 3 GiB came back");
        assert_eq!(
            process::verdict(cid, uid),
            Verdict::Zombie,
            "still unreaped"
        );
        child.wait().unwrap();
        assert_eq!(mine.view().unwrap().entries.len(), 1);
    }

    #[test]
    fn racing_processes_never_exceed_the_card() {
        let d = tmp();
        let capacity = 100 * M2 + M2 / 2;
        let granted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let p = d.path().to_owned();
                let granted = granted.clone();
                std::thread::spawn(move || {
                    let mut l = join(&p, capacity, None, 100 + 2 * t, everyone_lives);
                    while l.acquire(M2).unwrap() == Grant::Granted {
                        granted.fetch_add(M2, Ordering::Relaxed);
                    }
                    l.entry().used
                })
            })
            .collect();
        let held: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(held, 100 * M2);
        assert_eq!(granted.load(Ordering::Relaxed), 100 * M2);
    }

    #[test]
    fn readers_never_see_an_entry_half_written() {
        let d = tmp();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (p, done) = (d.path().to_owned(), done.clone());
            std::thread::spawn(move || {
                // Processes joining, claiming, giving back and leaving, over and over.
                for n in 0..150u32 {
                    let mut l = join(&p, 4 * G, None, 2 * n, everyone_lives);
                    assert_eq!(l.acquire(M2).unwrap(), Grant::Granted);
                    l.release(M2).unwrap();
                    l.leave().unwrap();
                }
                done.store(true, Ordering::Relaxed);
            })
        };
        let mut looks = 0;
        while !done.load(Ordering::Relaxed) {
            let seen = scan(d.path(), KEY, None, everyone_lives).unwrap();
            assert!(seen.damaged.is_empty(), "look {looks}: {:?}", seen.damaged);
            looks += 1;
        }
        writer.join().unwrap();
        assert!(files(d.path()).is_empty());
    }

    #[test]
    fn sums_past_2_to_the_64_saturate_and_refuse() {
        let d = tmp();
        let mut a = join(d.path(), 4 * G, None, 2, everyone_lives);
        let mut b = join(d.path(), 4 * G, None, 4, everyone_lives);
        let mut c = join(d.path(), 4 * G, None, 6, everyone_lives);
        // Two entries of u64::MAX / 2 + 1 each: their sum wraps to 0 in u64 arithmetic.
        a.used = u64::MAX / 2 + 1;
        a.write(0).unwrap();
        b.used = u64::MAX / 2 + 1;
        b.write(0).unwrap();
        assert!(matches!(
            c.acquire(1).unwrap(),
            Grant::Refused {
                others: u64::MAX,
                ..
            }
        ));
        assert_eq!(c.view().unwrap().used(), u64::MAX);
        assert_eq!(c.view().unwrap().available(), 0);
        // And a claim of u64::MAX itself.
        a.used = 0;
        a.write(0).unwrap();
        b.used = 0;
        b.write(0).unwrap();
        assert!(matches!(
            c.acquire(u64::MAX).unwrap(),
            Grant::Refused { .. }
        ));
        assert_eq!(c.acquire(4 * G).unwrap(), Grant::Granted);
    }

    /// Joins as `a` holding 3 GiB of 4, damages a's file with `damage`, and checks that b
    /// is refused until a writes its entry again, then that the card is shared right.
    fn damaged_entry_fails_closed_until_rewritten(damage: impl Fn(&Path)) {
        let d = tmp();
        let mut a = join(d.path(), 4 * G, None, 10, everyone_lives);
        let mut b = join(d.path(), 4 * G, None, 12, everyone_lives);
        assert_eq!(a.acquire(3 * G).unwrap(), Grant::Granted);
        damage(a.path().unwrap());
        let g = b.acquire(3 * G).unwrap();
        assert!(
            matches!(&g, Grant::Unknown { why } if why.contains("cannot be read")),
            "{g:?}"
        );
        assert_eq!(b.view().unwrap().available(), 0);
        // a's next look writes its entry again; the card is shared as before.
        let v = a.view().unwrap();
        assert_eq!(v.used(), 3 * G, "{v:?}");
        assert!(v.damaged.is_empty());
        assert!(matches!(b.acquire(3 * G).unwrap(), Grant::Refused { .. }));
        assert_eq!(b.acquire(G).unwrap(), Grant::Granted);
    }

    #[test]
    fn a_corrupt_entry_fails_closed_until_rewritten() {
        damaged_entry_fails_closed_until_rewritten(|p| {
            let mut bytes = std::fs::read(p).unwrap();
            bytes[40] ^= 0xff;
            std::fs::write(p, bytes).unwrap();
        });
        damaged_entry_fails_closed_until_rewritten(|p| {
            std::fs::write(p, b"hello, this is not a ledger").unwrap();
        });
    }

    #[test]
    fn a_truncated_or_emptied_entry_fails_closed_until_rewritten() {
        damaged_entry_fails_closed_until_rewritten(|p| {
            let f = OpenOptions::new().write(true).open(p).unwrap();
            f.set_len(50).unwrap();
        });
        damaged_entry_fails_closed_until_rewritten(|p| {
            let f = OpenOptions::new().write(true).open(p).unwrap();
            f.set_len(0).unwrap();
        });
        damaged_entry_fails_closed_until_rewritten(|p| {
            // Grown past a record: damaged too, and cut back by its owner.
            let mut f = OpenOptions::new().append(true).open(p).unwrap();
            std::io::Write::write_all(&mut f, b"more").unwrap();
        });
    }

    #[test]
    fn a_removed_or_replaced_entry_is_written_again() {
        let d = tmp();
        let mut a = join(d.path(), 4 * G, None, 10, everyone_lives);
        let mut b = join(d.path(), 4 * G, None, 12, everyone_lives);
        assert_eq!(a.acquire(3 * G).unwrap(), Grant::Granted);
        let p = a.path().unwrap().to_owned();
        std::fs::remove_file(&p).unwrap();
        // Gone: b does not see it until a writes again (a's next ledger call).
        a.view().unwrap();
        let notes = a.take_notes();
        assert!(
            notes.len() == 1
                && notes[0].contains("was removed")
                && notes[0].contains("written again"),
            "{notes:?}"
        );
        assert!(matches!(b.acquire(2 * G).unwrap(), Grant::Refused { .. }));
        // Replaced by a symbolic link to somewhere else: not followed, replaced.
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        a.release(0).unwrap();
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        assert!(a.take_notes()[0].contains("was replaced"));
        // Written in place by someone else: said, and written again.
        std::fs::write(&p, a.record(0).encode()).unwrap();
        a.release(0).unwrap();
        assert!(a.take_notes()[0].contains("written by another process"));
        assert!(matches!(b.acquire(2 * G).unwrap(), Grant::Refused { .. }));
        assert_eq!(files(d.path()).len(), 2, "no file left behind");
    }

    #[test]
    fn of_one_processs_files_the_newer_counts() {
        let d = tmp();
        let mut a = join(d.path(), 4 * G, None, 10, everyone_lives);
        let mut b = join(d.path(), 4 * G, None, 12, everyone_lives);
        assert_eq!(a.acquire(3 * G).unwrap(), Grant::Granted);
        // An older file of the same process that stays (immutable, say) loses to the newer.
        let stale = Record {
            seq: 1,
            used: 0,
            ..a.record(0)
        };
        std::fs::write(d.path().join(file_name(KEY, fake(10), 99)), stale.encode()).unwrap();
        assert!(matches!(
            b.acquire(2 * G).unwrap(),
            Grant::Refused { others, .. } if others == 3 * G
        ));
        // A newer one wins whatever its size.
        let newer = Record {
            seq: u64::MAX,
            used: 0,
            ..a.record(0)
        };
        std::fs::write(d.path().join(file_name(KEY, fake(10), 98)), newer.encode()).unwrap();
        assert_eq!(b.acquire(2 * G).unwrap(), Grant::Granted);
    }

    /// `chattr +i PATH` (or `-i`): whether it worked, or why not.
    fn chattr(flag: &str, path: &Path) -> Result<(), String> {
        let out = std::process::Command::new("chattr")
            .arg(flag)
            .arg(path)
            .output()
            .map_err(|e| format!("chattr: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Takes the immutable flag off again whatever happens, so that the folder can go.
    struct Mutable(PathBuf);

    impl Drop for Mutable {
        fn drop(&mut self) {
            let _ = chattr("-i", &self.0);
        }
    }

    #[test]
    fn an_immutable_entry_or_folder_fails_closed() {
        let d = tmp();
        let mut a = join(d.path(), 4 * G, None, 10, everyone_lives);
        let mut b = join(d.path(), 4 * G, None, 12, everyone_lives);
        assert_eq!(a.acquire(G).unwrap(), Grant::Granted);
        let old = a.path().unwrap().to_owned();
        if let Err(why) = chattr("+i", &old) {
            println!("skipped: chattr +i is not available here ({why})");
            return;
        }
        let _undo = Mutable(old.clone());
        // a cannot write its file: it writes a new one; the old stays, and loses.
        assert_eq!(a.acquire(2 * G).unwrap(), Grant::Granted);
        assert_ne!(a.path().unwrap(), old);
        assert!(old.exists());
        let notes = a.take_notes();
        assert!(notes[0].contains("could not be removed"), "{notes:?}");
        assert!(matches!(
            b.acquire(2 * G).unwrap(),
            Grant::Refused { others, .. } if others == 3 * G
        ));
        drop(_undo);
        // An immutable folder: no one can join (refused, with the reason), and those in
        // it go on writing their own files.
        let dir = d.path().to_owned();
        chattr("+i", &dir).unwrap();
        let _undo = Mutable(dir.clone());
        let e = Ledger::join_as(&dir, KEY, 4 * G, None, fake(14), everyone_lives)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("creating")
                && e.contains("cudaw-ledger-new.")
                && e.contains("not permitted"),
            "{e}"
        );
        // Nor can those in it write: refused (never taken unaccounted).
        let e = b.acquire(G).unwrap_err().to_string();
        assert!(e.contains("creating"), "{e}");
        assert!(a.release(3 * G).is_err());
        drop(_undo);
        assert_eq!(b.acquire(G).unwrap(), Grant::Granted);
        a.release(0).unwrap();
        assert_eq!(b.view().unwrap().used(), G);
    }

    #[test]
    fn names_and_records_round_trip() {
        let id = ProcessId {
            pid: 42,
            start: 1234,
        };
        let n = file_name("GPU-ab12-cd", id, 0xfeed);
        assert_eq!(n, "cudaw-ledger.GPU-ab12-cd.42.1234.000000000000feed");
        assert_eq!(parse_name(&n, "GPU-ab12-cd"), Some(id));
        assert_eq!(parse_name(&n, "GPU-ab12"), None);
        assert_eq!(
            parse_name("cudaw-ledger.GPU-ab12-cd.42.1234", "GPU-ab12-cd"),
            None
        );
        assert_eq!(safe_key("../x y"), "___x_y");
        let r = Record {
            process: id,
            seq: 3,
            used: 5,
            pending: 6,
            peak: 7,
            limit: None,
            capacity: 8,
            key: key_bytes("GPU-ab12-cd"),
        };
        assert_eq!(Record::decode(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[33] ^= 1;
        assert!(Record::decode(&bad).unwrap_err().contains("checksum"));
        assert!(Record::decode(&bad[..10]).unwrap_err().contains("10 bytes"));
    }
}
