//! The node ledger: one small file per GPU, `$CUDAW_RUN_DIR/GPU-UUID.ledger`, in which every
//! process under cudaw that uses the GPU records the device memory it holds. A process takes
//! memory only if what every process holds, plus the new memory, fits the card's capacity;
//! so the processes' limits may add up to more than the card while the card is never
//! promised twice.
//!
//! The file is read and written under `flock` (released by the kernel when a process dies,
//! however it dies). Entries of dead processes — `kill(PID, 0)` finds nothing, or the PID
//! now belongs to a process started at another time — are reclaimed when a process joins,
//! reads the ledger, or would be refused.
//!
//! Layout (little-endian), [`FILE_LEN`] bytes:
//!
//! | offset | header field | |
//! | --- | --- | --- |
//! | 0 | magic `CUDAWLDG` | 8 bytes |
//! | 8 | version ([`VERSION`]) | u32 |
//! | 12 | slot size ([`SLOT`]) | u32 |
//! | 16 | slots ([`SLOTS`]) | u32 |
//! | 20 | slots that may be in use: every later one is free (readers read no further) | u32 |
//! | 24 | capacity: the card's total memory, bytes | u64 |
//!
//! then [`SLOTS`] slots of [`SLOT`] bytes at offset [`HEADER`]: PID (u32, 0 = free),
//! start time (u64 at 8), bytes used (u64 at 16), peak (u64 at 24), limit (u64 at 32,
//! `u64::MAX` = none).

use crate::process::{self, ProcessId};
use rustix::fs::{flock, FlockOperation};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file's first bytes.
pub const MAGIC: [u8; 8] = *b"CUDAWLDG";
/// The layout version this code reads and writes; any other is refused.
pub const VERSION: u32 = 1;
/// Header bytes.
pub const HEADER: usize = 64;
/// Bytes per slot.
pub const SLOT: usize = 64;
/// Slots: processes that can share one GPU's ledger.
pub const SLOTS: usize = 256;
/// The file's length.
pub const FILE_LEN: u64 = (HEADER + SLOT * SLOTS) as u64;

/// The ledger file of a GPU in `run_dir`: `GPU-UUID.ledger` (`key` is the GPU's UUID as
/// `nvidia-smi -L` writes it, `GPU-…`, or another stable name of the device).
pub fn path(run_dir: &Path, key: &str) -> PathBuf {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    run_dir.join(format!("{safe}.ledger"))
}

/// What can go wrong with a ledger file.
#[derive(Debug)]
pub enum LedgerError {
    /// Opening, locking, reading or writing failed.
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// The file is not a ledger this code reads.
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the value seen and the value expected.
        what: String,
    },
    /// Every slot belongs to a live process.
    Full {
        /// The file.
        path: PathBuf,
    },
    /// The calling process is a fork of the one that opened the ledger.
    Forked,
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::Io { path, what, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
            LedgerError::Format { path, what } => {
                write!(
                    f,
                    "{} is not a cudaw ledger this version reads: {what}",
                    path.display()
                )
            }
            LedgerError::Full { path } => write!(
                f,
                "{}: all {SLOTS} slots belong to live processes",
                path.display()
            ),
            LedgerError::Forked => {
                f.write_str("the ledger was opened by the parent of this forked process")
            }
        }
    }
}

impl std::error::Error for LedgerError {}

/// One process's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The process.
    pub process: ProcessId,
    /// Device bytes it holds.
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
    /// The live processes' entries.
    pub entries: Vec<Entry>,
}

impl View {
    /// Bytes held by every process together.
    pub fn used(&self) -> u64 {
        self.entries.iter().map(|e| e.used).sum()
    }

    /// Bytes no process holds.
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.used())
    }
}

/// The answer to [`Ledger::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Recorded as this process's.
    Granted,
    /// It would not fit beside what the other processes hold.
    Refused {
        /// The card's total memory.
        capacity: u64,
        /// Bytes the other live processes hold.
        others: u64,
        /// Bytes this process holds.
        mine: u64,
    },
}

/// The ledger file's contents.
struct Image {
    capacity: u64,
    /// Slots at and after this one are free.
    in_use: usize,
    slots: Vec<Option<Entry>>,
}

/// An exclusive or shared `flock` on the file, released when dropped.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    fn new(file: &'a File, path: &Path, op: FlockOperation) -> Result<Self, LedgerError> {
        loop {
            match flock(file, op) {
                Ok(()) => return Ok(Locked(file)),
                Err(e) if e == rustix::io::Errno::INTR => continue,
                Err(e) => {
                    return Err(LedgerError::Io {
                        path: path.to_owned(),
                        what: "locking",
                        source: e.into(),
                    })
                }
            }
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let _ = flock(self.0, FlockOperation::Unlock);
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn encode_header(capacity: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(SLOT as u32).to_le_bytes());
    h[16..20].copy_from_slice(&(SLOTS as u32).to_le_bytes());
    h[24..32].copy_from_slice(&capacity.to_le_bytes());
    h
}

fn encode_slot(e: Option<&Entry>) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    if let Some(e) = e {
        s[0..4].copy_from_slice(&e.process.pid.to_le_bytes());
        s[8..16].copy_from_slice(&e.process.start.to_le_bytes());
        s[16..24].copy_from_slice(&e.used.to_le_bytes());
        s[24..32].copy_from_slice(&e.peak.to_le_bytes());
        s[32..40].copy_from_slice(&e.limit.unwrap_or(u64::MAX).to_le_bytes());
    }
    s
}

fn decode_slot(s: &[u8]) -> Option<Entry> {
    let pid = u32_at(s, 0);
    (pid != 0).then(|| Entry {
        process: ProcessId {
            pid,
            start: u64_at(s, 8),
        },
        used: u64_at(s, 16),
        peak: u64_at(s, 24),
        limit: Some(u64_at(s, 32)).filter(|&l| l != u64::MAX),
    })
}

fn open_file(path: &Path, create: bool) -> Result<File, LedgerError> {
    let mut o = OpenOptions::new();
    o.read(true);
    if create {
        o.write(true).create(true).mode(0o600);
    }
    o.open(path).map_err(|source| LedgerError::Io {
        path: path.to_owned(),
        what: "opening",
        source,
    })
}

/// Reads from `at` until `buf` is full or the file ends; the bytes read.
fn read_full(file: &File, path: &Path, buf: &mut [u8], at: u64) -> Result<usize, LedgerError> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(LedgerError::Io {
                    path: path.to_owned(),
                    what: "reading",
                    source,
                })
            }
        }
    }
    Ok(got)
}

fn load(file: &File, path: &Path) -> Result<Option<Image>, LedgerError> {
    let mut head = [0u8; HEADER];
    let got = read_full(file, path, &mut head, 0)?;
    let format = |what: String| LedgerError::Format {
        path: path.to_owned(),
        what,
    };
    // A new file, or one whose creator died before writing the header.
    if got == 0 || (got == HEADER && head.iter().all(|&b| b == 0)) {
        return Ok(None);
    }
    if got < HEADER || head[0..8] != MAGIC {
        return Err(format(format!(
            "it starts {:02x?}, expected {:02x?} ({:?})",
            &head[..got.min(8)],
            MAGIC,
            "CUDAWLDG"
        )));
    }
    let version = u32_at(&head, 8);
    if version != VERSION {
        return Err(format(format!(
            "version {version}, expected {VERSION} (processes of another cudaw version share this run folder; give them separate CUDAW_RUN_DIR)"
        )));
    }
    let (slot, slots, in_use) = (u32_at(&head, 12), u32_at(&head, 16), u32_at(&head, 20));
    if slot as usize != SLOT || slots as usize != SLOTS || in_use as usize > SLOTS {
        return Err(format(format!(
            "{slots} slots of {slot} bytes ({in_use} in use), expected {SLOTS} of {SLOT}"
        )));
    }
    let mut buf = vec![0u8; in_use as usize * SLOT];
    let got = read_full(file, path, &mut buf, HEADER as u64)?;
    if got < buf.len() {
        return Err(format(format!(
            "{} bytes long, expected at least {}",
            HEADER + got,
            HEADER + buf.len()
        )));
    }
    let mut slots: Vec<Option<Entry>> = buf.chunks_exact(SLOT).map(decode_slot).collect();
    slots.resize(SLOTS, None);
    Ok(Some(Image {
        capacity: u64_at(&head, 24),
        in_use: in_use as usize,
        slots,
    }))
}

fn write_at(file: &File, path: &Path, at: u64, bytes: &[u8]) -> Result<(), LedgerError> {
    file.write_all_at(bytes, at)
        .map_err(|source| LedgerError::Io {
            path: path.to_owned(),
            what: "writing",
            source,
        })
}

fn slot_offset(i: usize) -> u64 {
    (HEADER + i * SLOT) as u64
}

/// Reads a ledger without changing it (for tools): the live processes' entries. `None`
/// when the file does not exist.
pub fn read(path: &Path) -> Result<Option<View>, LedgerError> {
    let file = match OpenOptions::new().read(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LedgerError::Io {
                path: path.to_owned(),
                what: "opening",
                source,
            })
        }
    };
    let _lock = Locked::new(&file, path, FlockOperation::LockShared)?;
    Ok(load(&file, path)?.map(|img| View {
        capacity: img.capacity,
        entries: img
            .slots
            .into_iter()
            .flatten()
            .filter(|e| process::is_alive(e.process))
            .collect(),
    }))
}

/// This process's membership of one GPU's ledger.
pub struct Ledger {
    file: Arc<File>,
    path: PathBuf,
    me: ProcessId,
    slot: usize,
    entry: Entry,
    alive: fn(ProcessId) -> bool,
    /// Whether `me` is the calling process (so a fork of it must not write as it).
    is_caller: bool,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.path)
            .field("me", &self.me)
            .field("slot", &self.slot)
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Joins the ledger at `path` (creating it, with `capacity` bytes: the card's total
    /// memory) as the calling process, whose own limit is `limit`.
    pub fn open(path: &Path, capacity: u64, limit: Option<u64>) -> Result<Ledger, LedgerError> {
        let mut l = Self::open_as(
            path,
            capacity,
            limit,
            ProcessId::current(),
            process::is_alive,
        )?;
        l.is_caller = true;
        Ok(l)
    }

    /// As [`Ledger::open`], as process `me`, telling live processes by `alive` (tests play
    /// several processes in one).
    pub fn open_as(
        path: &Path,
        capacity: u64,
        limit: Option<u64>,
        me: ProcessId,
        alive: fn(ProcessId) -> bool,
    ) -> Result<Ledger, LedgerError> {
        let file = Arc::new(open_file(path, true)?);
        let mut ledger = Ledger {
            file: file.clone(),
            path: path.to_owned(),
            me,
            slot: usize::MAX,
            entry: Entry {
                process: me,
                used: 0,
                peak: 0,
                limit,
            },
            alive,
            is_caller: false,
        };
        {
            let _lock = Locked::new(&file, path, FlockOperation::LockExclusive)?;
            let mut img = match load(&ledger.file, path)? {
                Some(img) => img,
                None => {
                    ledger
                        .file
                        .set_len(FILE_LEN)
                        .map_err(|source| LedgerError::Io {
                            path: path.to_owned(),
                            what: "sizing",
                            source,
                        })?;
                    let mut all = vec![0u8; FILE_LEN as usize];
                    all[..HEADER].copy_from_slice(&encode_header(capacity));
                    write_at(&ledger.file, path, 0, &all)?;
                    Image {
                        capacity,
                        in_use: 0,
                        slots: vec![None; SLOTS],
                    }
                }
            };
            ledger.reclaim(&mut img, true)?;
            ledger.claim(&mut img)?;
        }
        Ok(ledger)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This process's entry, as last written.
    pub fn entry(&self) -> Entry {
        self.entry
    }

    fn check_fork(&self) -> Result<(), LedgerError> {
        if self.is_caller && std::process::id() != self.me.pid {
            return Err(LedgerError::Forked);
        }
        Ok(())
    }

    /// Frees the slots of dead processes (all of them, or with `others_only` not ours).
    fn reclaim(&self, img: &mut Image, others_only: bool) -> Result<usize, LedgerError> {
        let mut n = 0;
        for i in 0..img.slots.len() {
            let Some(e) = img.slots[i] else { continue };
            if others_only && e.process == self.me {
                continue;
            }
            if !(self.alive)(e.process) {
                img.slots[i] = None;
                write_at(&self.file, &self.path, slot_offset(i), &encode_slot(None))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Makes sure our entry is in the file (in a slot of its own), writing it.
    fn claim(&mut self, img: &mut Image) -> Result<(), LedgerError> {
        let ours = img
            .slots
            .iter()
            .position(|s| s.is_some_and(|e| e.process == self.me));
        let i = match ours {
            Some(i) => i,
            None => {
                img.slots
                    .iter()
                    .position(Option::is_none)
                    .ok_or_else(|| LedgerError::Full {
                        path: self.path.clone(),
                    })?
            }
        };
        self.slot = i;
        img.slots[i] = Some(self.entry);
        write_at(
            &self.file,
            &self.path,
            slot_offset(i),
            &encode_slot(Some(&self.entry)),
        )?;
        if i >= img.in_use {
            img.in_use = i + 1;
            write_at(
                &self.file,
                &self.path,
                20,
                &(img.in_use as u32).to_le_bytes(),
            )?;
        }
        Ok(())
    }

    fn others(&self, img: &Image) -> u64 {
        img.slots
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.slot)
            .filter_map(|(_, s)| s.map(|e| e.used))
            .sum()
    }

    /// Runs `f` on the file's contents under the exclusive lock.
    fn locked<R>(
        &mut self,
        f: impl FnOnce(&mut Self, &mut Image) -> Result<R, LedgerError>,
    ) -> Result<R, LedgerError> {
        self.check_fork()?;
        let file = self.file.clone();
        let _lock = Locked::new(&file, &self.path, FlockOperation::LockExclusive)?;
        let mut img = load(&file, &self.path)?.ok_or_else(|| LedgerError::Format {
            path: self.path.clone(),
            what: "it was emptied while in use".to_owned(),
        })?;
        f(self, &mut img)
    }

    /// Records `bytes` more as this process's if, beside what the other live processes
    /// hold, they fit the card; dead processes' entries are reclaimed before refusing.
    pub fn acquire(&mut self, bytes: u64) -> Result<Grant, LedgerError> {
        self.locked(|me, img| {
            let capacity = img.capacity;
            let fits = |others: u64, mine: u64| {
                others
                    .checked_add(mine)
                    .and_then(|v| v.checked_add(bytes))
                    .is_some_and(|v| v <= capacity)
            };
            let mut others = me.others(img);
            if !fits(others, me.entry.used) && me.reclaim(img, true)? > 0 {
                others = me.others(img);
            }
            if !fits(others, me.entry.used) {
                return Ok(Grant::Refused {
                    capacity,
                    others,
                    mine: me.entry.used,
                });
            }
            me.entry.used += bytes;
            me.entry.peak = me.entry.peak.max(me.entry.used);
            // Our slot may have been taken from us (by a process that thought us dead).
            me.claim(img)?;
            Ok(Grant::Granted)
        })
    }

    /// Records that this process gave `bytes` back.
    pub fn release(&mut self, bytes: u64) -> Result<(), LedgerError> {
        self.locked(|me, img| {
            me.entry.used = me.entry.used.saturating_sub(bytes);
            me.claim(img)
        })
    }

    /// The ledger now, dead processes' entries reclaimed.
    pub fn view(&mut self) -> Result<View, LedgerError> {
        self.locked(|me, img| {
            me.reclaim(img, true)?;
            Ok(View {
                capacity: img.capacity,
                entries: img.slots.iter().flatten().copied().collect(),
            })
        })
    }

    /// Removes this process's entry (at exit).
    pub fn leave(&mut self) -> Result<(), LedgerError> {
        self.locked(|me, img| {
            if let Some(i) = img
                .slots
                .iter()
                .position(|s| s.is_some_and(|e| e.process == me.me))
            {
                write_at(&me.file, &me.path, slot_offset(i), &encode_slot(None))?;
            }
            me.entry.used = 0;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const G: u64 = 1 << 30;
    const M2: u64 = 2 << 20;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("cudaw-ledger-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A process that cannot exist here (above the kernel's largest PID, 2^22).
    fn fake(n: u32) -> ProcessId {
        ProcessId {
            pid: (1 << 30) + n,
            start: 7,
        }
    }

    fn everyone_lives(_: ProcessId) -> bool {
        true
    }

    /// Processes with odd PIDs are dead.
    fn odd_ones_died(p: ProcessId) -> bool {
        p.pid % 2 == 0
    }

    #[test]
    fn processes_share_the_card() {
        let d = dir("share");
        let p = path(&d, "GPU-1234");
        let mut a = Ledger::open_as(&p, 4 * G, Some(3 * G), fake(10), everyone_lives).unwrap();
        let mut b = Ledger::open_as(&p, 4 * G, Some(3 * G), fake(12), everyone_lives).unwrap();
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
        assert_eq!(
            read(&p).unwrap().unwrap().entries.len(),
            0,
            "fake pids are not alive to a reader"
        );
        assert_eq!(b.view().unwrap().used(), 2 * G);
    }

    #[test]
    fn dead_processes_are_reclaimed() {
        let d = dir("dead");
        let p = path(&d, "GPU-dead");
        let mut dead = Ledger::open_as(&p, 4 * G, None, fake(11), odd_ones_died).unwrap();
        assert_eq!(dead.acquire(3 * G).unwrap(), Grant::Granted);
        let mut live = Ledger::open_as(&p, 4 * G, None, fake(20), odd_ones_died).unwrap();
        // Joining reclaimed the dead process's 3 GiB.
        assert_eq!(live.view().unwrap().used(), 0);
        assert_eq!(live.acquire(4 * G).unwrap(), Grant::Granted);
    }

    #[test]
    fn real_processes_dead_or_reused_pids_are_reclaimed() {
        let d = dir("real");
        let p = path(&d, "GPU-real");
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let cid = ProcessId {
            pid,
            start: process::start_time(pid).unwrap(),
        };
        let mut theirs = Ledger::open_as(&p, 4 * G, None, cid, process::is_alive).unwrap();
        assert_eq!(theirs.acquire(3 * G).unwrap(), Grant::Granted);
        // An entry with the child's PID but another start time: a reused PID.
        let reused = ProcessId {
            pid,
            start: cid.start + 1,
        };
        let mut stale = Ledger::open_as(&p, 4 * G, None, reused, everyone_lives).unwrap();
        assert_eq!(stale.acquire(G / 2).unwrap(), Grant::Granted);
        let mut me = Ledger::open(&p, 4 * G, None).unwrap();
        // The reused PID's entry went when we joined; the live child's stays.
        assert_eq!(me.view().unwrap().used(), 3 * G);
        assert!(
            matches!(me.acquire(2 * G).unwrap(), Grant::Refused { others, .. } if others == 3 * G)
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(me.acquire(2 * G).unwrap(), Grant::Granted);
        assert_eq!(me.view().unwrap().entries.len(), 1);
    }

    #[test]
    fn racing_processes_never_exceed_the_card() {
        let d = dir("race");
        let p = path(&d, "GPU-race");
        let capacity = 100 * M2 + M2 / 2;
        let granted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let p = p.clone();
                let granted = granted.clone();
                std::thread::spawn(move || {
                    let mut l =
                        Ledger::open_as(&p, capacity, None, fake(100 + 2 * t), everyone_lives)
                            .unwrap();
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
    fn foreign_and_damaged_files_are_refused() {
        let d = dir("format");
        let p = d.join("bad.ledger");
        std::fs::write(
            &p,
            b"hello, this is not a ledger at all; it is long enough to read a header from it......",
        )
        .unwrap();
        let e = Ledger::open(&p, G, None).unwrap_err().to_string();
        assert!(
            e.contains("not a cudaw ledger") && e.contains("expected"),
            "{e}"
        );
        let mut other = vec![0u8; FILE_LEN as usize];
        other[..HEADER].copy_from_slice(&encode_header(G));
        other[8..12].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&p, &other).unwrap();
        let e = Ledger::open(&p, G, None).unwrap_err().to_string();
        assert!(e.contains("version 2, expected 1"), "{e}");
        // All zeros (a creator that died before its header): taken as new.
        std::fs::write(&p, vec![0u8; FILE_LEN as usize]).unwrap();
        let l = Ledger::open(&p, G, None).unwrap();
        assert_eq!(read(&p).unwrap().unwrap().capacity, G);
        drop(l);
        assert!(read(&d.join("absent.ledger")).unwrap().is_none());
    }

    #[test]
    fn readers_read_only_the_slots_in_use() {
        let d = dir("in-use");
        let p = path(&d, "GPU-u");
        let mut ls: Vec<Ledger> = (0..3)
            .map(|n| Ledger::open_as(&p, G, None, fake(2 * n), everyone_lives).unwrap())
            .collect();
        let head = std::fs::read(&p).unwrap();
        assert_eq!(u32_at(&head, 20), 3);
        ls[0].leave().unwrap();
        ls[1].acquire(M2).unwrap();
        // A freed slot below the mark is taken again; the mark stays.
        let mut again = Ledger::open_as(&p, G, None, fake(99 * 2), everyone_lives).unwrap();
        again.acquire(M2).unwrap();
        assert_eq!(u32_at(&std::fs::read(&p).unwrap(), 20), 3);
        assert_eq!(again.view().unwrap().used(), 2 * M2);
        // A mark past the end of the slots is refused.
        let mut bad = std::fs::read(&p).unwrap();
        bad[20..24].copy_from_slice(&(SLOTS as u32 + 1).to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(again.view().unwrap_err().to_string().contains("in use"));
    }

    #[test]
    fn paths_are_safe_names() {
        assert_eq!(
            path(Path::new("/r"), "GPU-ab12-cd"),
            PathBuf::from("/r/GPU-ab12-cd.ledger")
        );
        assert_eq!(
            path(Path::new("/r"), "../x y"),
            PathBuf::from("/r/___x_y.ledger")
        );
    }
}
