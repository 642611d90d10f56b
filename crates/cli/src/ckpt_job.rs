//! `--job PID`: every process under cudaw in PID's job, paused, resumed, dumped and restored
//! together.
//!
//! The job is the process tree of its launcher: from PID, up through the parents that run
//! under cudaw too (a rank's PID finds `torchrun`'s tree when `torchrun` itself runs under
//! cudaw), then every process of that tree that serves a control socket. A launcher that is
//! not under cudaw (`mpirun`, a shell) is named by its own PID.
//!
//! A job pause holds every process at once (the protocol's `hold`: gates closed, devices
//! drained), and evicts only when every process is idle at the same time: ranks wait for
//! each other inside collectives, so a rank held after launching an all-reduce that another
//! rank was held before launching would never finish it. When the instant was such a one,
//! every process is released and another instant tried, a little later.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use cudaw_control::{Dumped, Held, Moved, PeerExport, Reply, Request, Restored, Shares, Status};
use serde::{Deserialize, Serialize};

use crate::ckpt_client::{self, fail, Kind};

/// A job: its launcher and the processes under cudaw in its tree.
#[derive(Debug, Clone)]
pub struct Job {
    /// The top of the tree.
    pub root: u32,
    /// The processes under cudaw in it, by PID.
    pub members: Vec<u32>,
    /// Something the caller should know about what was found (printed on standard error).
    pub note: Option<String>,
}

/// The parent of `pid`, from /proc/PID/stat (never reads memory of the process).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Every process's parent, from /proc.
fn parents() -> BTreeMap<u32, u32> {
    let mut map = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                if let Some(pp) = parent(pid) {
                    map.insert(pid, pp);
                }
            }
        }
    }
    map
}

/// The PIDs with a control socket in any run folder.
fn under_cudaw() -> Result<Vec<u32>> {
    let mut pids = Vec::new();
    for dir in ckpt_client::run_dirs()? {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if let Some(pid) = e
                    .file_name()
                    .to_str()
                    .and_then(cudaw_control::pid_of_socket)
                {
                    if ckpt_client::process_exists(pid) {
                        pids.push(pid);
                    }
                }
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// The job `pid` belongs to (see the module's documentation).
pub fn find(pid: u32) -> Result<Job> {
    if !ckpt_client::process_exists(pid) {
        return Err(fail(Kind::NoProcess, format!("no process with PID {pid}")));
    }
    let cudaw = under_cudaw()?;
    let parents = parents();
    let mut root = pid;
    while let Some(&p) = parents.get(&root) {
        if p <= 1 || !cudaw.contains(&p) {
            break;
        }
        root = p;
    }
    let under = |top: u32, mut p: u32| loop {
        if p == top {
            return true;
        }
        match parents.get(&p) {
            Some(&pp) if pp != p && pp != 0 => p = pp,
            _ => return false,
        }
    };
    let members: Vec<u32> = cudaw.iter().copied().filter(|&p| under(root, p)).collect();
    // A rank named by its own PID, whose launcher serves no socket (it never called CUDA):
    // its siblings under cudaw may be the rest of the job (or other jobs of one shell).
    let mut note = None;
    if let Some(&launcher) = parents.get(&root).filter(|&&p| p > 1) {
        let others: Vec<u32> = cudaw
            .iter()
            .copied()
            .filter(|&p| !under(root, p) && under(launcher, p))
            .collect();
        if !others.is_empty() {
            note = Some(format!(
                "process {launcher} ({}) also started {} under cudaw outside the tree of {root}; if they are ranks of the same job, name its launcher: --job {launcher}",
                comm(launcher),
                others
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if members.is_empty() {
        return Err(fail(
            Kind::NotUnderCudaw,
            format!(
                "no process under cudaw in the job of {pid} (process {root} and its descendants serve no control socket in {}; start the job with `cudaw run`)",
                ckpt_client::run_dir()?.display()
            ),
        ));
    }
    Ok(Job {
        root,
        members,
        note,
    })
}

/// `f` for every PID at once, each on a thread of its own: the results in PID order.
pub(crate) fn each<T: Send>(
    pids: &[u32],
    f: impl Fn(u32) -> Result<T> + Sync,
) -> Vec<(u32, Result<T>)> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = pids.iter().map(|&p| (p, s.spawn(move || f(p)))).collect();
        handles
            .into_iter()
            .map(|(p, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(fail(Kind::Failed, "a worker thread panicked")));
                (p, r)
            })
            .collect()
    })
}

fn request(pid: u32, req: &Request) -> Result<cudaw_control::Reply> {
    ckpt_client::request(pid, req, &mut |_| {})
}

/// The first failure among `results`, naming its process, with what became of the others.
fn first_failure<T>(results: &[(u32, Result<T>)], then: &str) -> Option<anyhow::Error> {
    results.iter().find_map(|(p, r)| {
        r.as_ref().err().map(|e| {
            let kind = ckpt_client::kind_of(e);
            let msg = format!("{e:#}");
            let msg = if msg.starts_with(&format!("process {p}:")) {
                msg
            } else {
                format!("process {p}: {msg}")
            };
            fail(
                kind,
                if then.is_empty() {
                    msg
                } else {
                    format!("{msg}; {then}")
                },
            )
        })
    })
}

/// Every value of `results`, or its first failure (naming its process, then `then`).
fn all_ok<T>(results: Vec<(u32, Result<T>)>, then: &str) -> Result<Vec<(u32, T)>> {
    if let Some(e) = first_failure(&results, then) {
        return Err(e);
    }
    Ok(results
        .into_iter()
        .filter_map(|(p, r)| r.ok().map(|v| (p, v)))
        .collect())
}

/// Sends `req` to `pid`: what `pick` takes from the reply, which must carry it (`what`).
fn ask<T>(pid: u32, req: &Request, pick: impl FnOnce(Reply) -> Option<T>, what: &str) -> Result<T> {
    ckpt_client::carried(pick(request(pid, req)?), what)
}

/// Releases every member (errors ignored: a member that died is gone either way).
fn release_all(job: &Job) {
    let _ = each(&job.members, |p| request(p, &Request::Release {}));
}

/// Resumes the members in `pids` (after a failure part-way): what failed to resume.
fn resume_all(pids: &[u32]) -> Vec<String> {
    each(pids, |p| request(p, &Request::RESUME))
        .into_iter()
        .filter_map(|(p, r)| r.err().map(|e| format!("process {p}: {e:#}")))
        .collect()
}

/// What a job pause did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobPaused {
    /// The launcher.
    pub root: u32,
    /// Each member's pause.
    pub members: Vec<MemberMoved>,
    /// Instants tried before one found every process at rest.
    pub attempts: u32,
    /// Milliseconds from the first hold to the last eviction.
    pub ms: f64,
    /// Allocations moved, over all members.
    pub allocations: u64,
    /// Bytes moved, over all members.
    pub bytes: u64,
    /// Memory the members share (NCCL's buffers) evicted with them (not with `--keep-shared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedEvicted>,
}

/// What of the members' shared memory a job pause evicts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SharedEvicted {
    /// Exports evicted (each paired with an import of the job).
    pub exports: u64,
    /// Imports evicted.
    pub imports: u64,
    /// Imports whose export is not in the job (left on the device).
    pub unpaired: u64,
    /// Why the shared memory stayed on the device, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One member's pause or resume.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberMoved {
    /// The process.
    pub pid: u32,
    /// What it did.
    #[serde(flatten)]
    pub moved: Moved,
}

/// Holds every member until one instant finds them all idle (or `timeout` passes), then
/// pauses each. On any failure every member is released or resumed: the job runs on.
pub fn pause(job: &Job, timeout: Option<Duration>, shared: bool) -> Result<JobPaused> {
    let started = Instant::now();
    let deadline = timeout.map(|t| started + t);
    let mut window = Duration::from_millis(250);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last_busy = match hold_until_idle(job, window)? {
            None => break,
            Some(busy) => busy,
        };
        release_all(job);
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(fail(
                Kind::Timeout,
                format!(
                    "the job of {} ({} processes) found no instant when every process was at rest within {:.1} s ({attempts} tries; last: {last_busy}); every process was released and runs on (a device busy for ever on one rank while another is idle is a collective that rank was held before joining: each try picks another instant; a kernel longer than the window needs a longer --timeout)",
                    job.root,
                    job.members.len(),
                    started.elapsed().as_secs_f64()
                ),
            ));
        }
        // Another instant: a jitter, so that the ranks' launches fall differently.
        let jitter = 10 + (started.elapsed().subsec_nanos() as u64 % 40) * attempts as u64;
        std::thread::sleep(Duration::from_millis(jitter.min(400)));
        window = (window * 2).min(Duration::from_secs(2));
    }
    let results = each(&job.members, |p| {
        ask(p, &Request::PAUSE, |r| r.pause, "pause result")
    });
    if let Some(e) = first_failure(&results, "") {
        // Every member resumes: those paused go back, those held are let go, and a resume
        // changes nothing in one that runs (a pause whose reply was lost may have paused).
        let left = resume_all(&job.members);
        let mut msg = format!("{e:#}");
        msg.push_str(&if left.is_empty() {
            "; the job pause was undone: every other process runs on".to_owned()
        } else {
            format!(
                "; the job pause was undone, but some did not resume: {}",
                left.join("; ")
            )
        });
        return Err(fail(ckpt_client::kind_of(&e), msg));
    }
    let members: Vec<MemberMoved> = results
        .into_iter()
        .filter_map(|(pid, r)| r.ok().map(|moved| MemberMoved { pid, moved }))
        .collect();
    let shared = shared.then(|| evict_shared(job));
    Ok(JobPaused {
        root: job.root,
        allocations: members.iter().map(|m| m.moved.allocations).sum(),
        bytes: members.iter().map(|m| m.moved.bytes).sum(),
        members,
        attempts,
        ms: started.elapsed().as_secs_f64() * 1e3,
        shared,
    })
}

/// With every member paused: pairs every import with its export (`shares`, then `pair`),
/// marks the exports every kept descriptor of which an import of the job matched and the
/// imports of those, then evicts every member's marked imports, then their exports. A
/// failure brings back what was evicted (the job stays paused, its shared memory on the
/// device) and is said in the summary.
fn evict_shared(job: &Job) -> SharedEvicted {
    let mut summary = SharedEvicted::default();
    if let Err(e) = try_evict_shared(job, &mut summary) {
        let back = match bring_back_shared(job) {
            Ok(_) => "what was evicted of it is back".to_owned(),
            Err(b) => format!("bringing back what was evicted failed too: {b:#}"),
        };
        summary.error = Some(format!(
            "{e:#}; the shared memory stays on the device ({back}); the job is paused"
        ));
        summary.exports = 0;
        summary.imports = 0;
    }
    summary
}

/// Every member's shares (`then` follows the first failure's message).
fn shares(job: &Job, then: &str) -> Result<Vec<(u32, Shares)>> {
    all_ok(
        each(&job.members, |p| {
            ask(p, &Request::Shares {}, |r| r.shares, "shares")
        }),
        then,
    )
}

fn try_evict_shared(job: &Job, summary: &mut SharedEvicted) -> Result<()> {
    let all: Vec<PeerExport> = shares(job, "")?
        .into_iter()
        .flat_map(|(pid, s)| s.exports.into_iter().map(move |e| PeerExport { pid, ..e }))
        .collect();
    let pair = Request::Pair {
        exports: all.clone(),
    };
    let paired = all_ok(
        each(&job.members, |p| ask(p, &pair, |r| r.paired, "pairing")),
        "",
    )?;
    let mut matched = std::collections::BTreeSet::new();
    for (pid, p) in &paired {
        if let Some(e) = &p.error {
            return Err(fail(Kind::Failed, format!("process {pid}: {e}")));
        }
        matched.extend(p.matched.iter().copied());
        summary.unpaired += p.unpaired;
    }
    // An export goes only when every descriptor it was exported to is an import of the job.
    let mut by_export: BTreeMap<(u32, u64), bool> = BTreeMap::new();
    for e in &all {
        let ok = matched.contains(&(e.pid, e.fd));
        by_export
            .entry((e.pid, e.handle))
            .and_modify(|all_ok| *all_ok &= ok)
            .or_insert(ok);
    }
    let marks = each(&job.members, |p| {
        let exports: Vec<u64> = by_export
            .iter()
            .filter(|((pid, _), ok)| *pid == p && **ok)
            .map(|((_, h), _)| *h)
            .collect();
        // The imports of the exports that go (the others stay mapped, as their exports).
        let imports: Vec<u64> = paired
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, r)| {
                r.imports
                    .iter()
                    .filter(|i| by_export.get(&(i.pid, i.export)) == Some(&true))
                    .map(|i| i.handle)
                    .collect()
            })
            .unwrap_or_default();
        ask(
            p,
            &Request::Mark { exports, imports },
            |r| r.marked,
            "marks",
        )
    });
    all_ok(marks, "")?;
    // Every import first, then every export: no import ever maps memory its exporter
    // has replaced.
    for imports in [true, false] {
        let evicted = each(&job.members, |p| {
            ask(
                p,
                &Request::EvictShared { imports },
                |r| r.evicted_shared,
                "eviction",
            )
        });
        for (_, m) in all_ok(evicted, "")? {
            summary.exports += m.exports;
            summary.imports += m.imports;
        }
    }
    Ok(())
}

/// Before a job's resume: every import evicted with the job comes back from its exporter's
/// new descriptor (`reexport`, then `reimport`). How many.
fn bring_back_shared(job: &Job) -> Result<u64> {
    let shares = shares(job, "the job stays paused")?;
    // Exporter -> its exports wanted (in order, once each).
    let mut wanted: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut awaiting = 0u64;
    for a in shares.iter().flat_map(|(_, s)| &s.awaiting) {
        awaiting += 1;
        let v = wanted.entry(a.pid).or_default();
        if !v.contains(&a.export) {
            v.push(a.export);
        }
    }
    if awaiting == 0 {
        return Ok(0);
    }
    if let Some(gone) = wanted.keys().find(|p| !job.members.contains(p)) {
        return Err(fail(
            Kind::Failed,
            format!(
                "process {gone}, which exported memory the job's imports need, is no longer in the job; the job stays paused"
            ),
        ));
    }
    // Every exporter makes its exports again at once, then every importer imports them at
    // once: one process after another cost a 2-rank DDP job's resume about 200 ms.
    let exporters: Vec<u32> = wanted.keys().copied().collect();
    let made = each(&exporters, |exporter| {
        let handles = &wanted[&exporter];
        let (reply, got) = ckpt_client::request_fds(
            exporter,
            &Request::Reexport {
                handles: handles.clone(),
            },
            &[],
        )?;
        let back = reply.reexported.map(|r| r.handles).unwrap_or_default();
        if back != *handles || got.len() != handles.len() {
            return Err(fail(
                Kind::Connection,
                format!(
                    "a reexport of {} handles came back with {} descriptors",
                    handles.len(),
                    got.len()
                ),
            ));
        }
        Ok(got)
    });
    if let Some(e) = first_failure(&made, "") {
        return Err(fail(
            ckpt_client::kind_of(&e),
            format!("{e:#}; the job stays paused"),
        ));
    }
    let mut fds: BTreeMap<(u32, u64), std::os::fd::OwnedFd> = BTreeMap::new();
    for (exporter, got) in made {
        let Ok(got) = got else { continue };
        for (&h, fd) in wanted[&exporter].iter().zip(got) {
            fds.insert((exporter, h), fd);
        }
    }
    let importers: Vec<u32> = shares
        .iter()
        .filter(|(_, s)| !s.awaiting.is_empty())
        .map(|(p, _)| *p)
        .collect();
    let by_pid: BTreeMap<u32, _> = shares.iter().map(|(p, s)| (*p, s)).collect();
    let imported = each(&importers, |pid| {
        let s = by_pid[&pid];
        let handles: Vec<u64> = s.awaiting.iter().map(|a| a.handle).collect();
        let passed: Vec<std::os::fd::BorrowedFd<'_>> = s
            .awaiting
            .iter()
            .filter_map(|a| fds.get(&(a.pid, a.export)).map(|f| f.as_fd()))
            .collect();
        let (reply, _) = ckpt_client::request_fds(pid, &Request::Reimport { handles }, &passed)?;
        Ok(reply.reimported.map_or(0, |r| r.imports))
    });
    if let Some(e) = first_failure(&imported, "") {
        return Err(fail(
            ckpt_client::kind_of(&e),
            format!("{e:#}; the job stays paused"),
        ));
    }
    Ok(imported.into_iter().filter_map(|(_, r)| r.ok()).sum())
}

/// One try: holds every member, holding again while devices are busy, up to four windows.
/// `None`: every member idle (all held); `Some(why not)`: some device still busy.
fn hold_until_idle(job: &Job, window: Duration) -> Result<Option<String>> {
    let req = Request::Hold {
        window_ms: window.as_millis() as u64,
        lease_ms: cudaw_control::DEFAULT_HOLD_LEASE_MS,
    };
    let mut why = String::new();
    for _ in 0..4 {
        let results = each(&job.members, |p| ask(p, &req, |r| r.hold, "hold result"));
        let held: Vec<(u32, Held)> = match all_ok(results, "every process was released and runs on")
        {
            Ok(h) => h,
            Err(e) => {
                release_all(job);
                return Err(e);
            }
        };
        if held.iter().all(|(_, h)| h.idle) {
            return Ok(None);
        }
        why = held
            .iter()
            .filter(|(_, h)| !h.idle)
            .map(|(p, h)| {
                if h.calls_in_flight > 0 {
                    format!("process {p}: {} call(s) in flight", h.calls_in_flight)
                } else {
                    format!(
                        "process {p}: device {} busy",
                        h.busy_devices
                            .iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
    }
    Ok(Some(why))
}

/// Resumes every member at once: what each did. A member that fails to resume is named;
/// the others resume regardless.
pub fn resume(job: &Job) -> Result<Vec<MemberMoved>> {
    bring_back_shared(job)?;
    let results = each(&job.members, |p| {
        ask(p, &Request::RESUME, |r| r.resume, "resume result")
    });
    Ok(all_ok(results, "the job's other processes were resumed")?
        .into_iter()
        .map(|(pid, moved)| MemberMoved { pid, moved })
        .collect())
}

/// Every member's status.
pub fn status(job: &Job) -> Result<Vec<Status>> {
    let results = each(&job.members, |p| {
        ask(p, &Request::Status {}, |r| r.status, "status")
    });
    Ok(all_ok(results, "")?.into_iter().map(|(_, s)| s).collect())
}

/// The manifest of a job image: a folder of one image per process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// `cudaw-job/1`.
    pub format: String,
    /// The launcher's PID when dumped.
    pub root: u32,
    /// One entry per process, by PID.
    pub members: Vec<ManifestMember>,
    /// Seconds since the epoch when written.
    pub created: u64,
}

/// One process's image in a job image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestMember {
    /// Its PID when dumped.
    pub pid: u32,
    /// Its command name (/proc/PID/comm).
    pub comm: String,
    /// The image file, in the job folder.
    pub image: String,
    /// Allocations in it.
    pub allocations: u64,
    /// Bytes in it.
    pub bytes: u64,
}

/// The manifest's name in a job folder.
pub const MANIFEST: &str = "job.json";
const FORMAT: &str = "cudaw-job/1";

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// What a job dump did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDumped {
    /// The job folder.
    pub path: String,
    /// The job pause before it.
    pub pause: JobPaused,
    /// Each member's dump.
    pub members: Vec<MemberDumped>,
    /// The shared memory evicted after the dump, as a job pause does (the job stays paused:
    /// without `--leave-running`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedEvicted>,
    /// Milliseconds in all.
    pub ms: f64,
}

/// One member's dump.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberDumped {
    /// The process.
    pub pid: u32,
    /// What it wrote.
    #[serde(flatten)]
    pub dumped: Dumped,
}

/// One member's restore.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberRestored {
    /// The process.
    pub pid: u32,
    /// What it loaded.
    #[serde(flatten)]
    pub restored: Restored,
}

/// Pauses the job, has every member write its image into `dir` (made if missing), writes
/// the manifest; resumes the job afterwards with `leave_running`. `dump_one` writes one
/// process's image.
pub fn dump(
    job: &Job,
    dir: &Path,
    leave_running: bool,
    timeout: Option<Duration>,
    dump_one: impl Fn(u32, &Path, bool) -> Result<Dumped> + Sync,
) -> Result<JobDumped> {
    let started = Instant::now();
    let dir = ckpt_client::absolute(dir)?;
    prepare_dir(&dir)?;
    // An earlier job image's manifest goes first: a dump that fails part-way leaves no
    // manifest naming a mix of old and new images.
    let path = dir.join(MANIFEST);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(fail(
                Kind::Io,
                format!("removing the earlier {}: {e}", path.display()),
            ))
        }
    }
    let pause = pause(job, timeout, false)?;
    // A job paused earlier may have its shared memory evicted: it comes back onto the
    // device first (the images leave it out, and a dump needs every handle in place).
    bring_back_shared(job)?;
    let results = each(&job.members, |p| {
        dump_one(p, &dir.join(format!("{p}.cudaw")), leave_running)
    });
    if let Some(e) = first_failure(&results, "") {
        let mut msg = format!("{e:#}");
        if leave_running {
            // Those whose dump succeeded run again already; the others follow.
            let left = resume_all(&job.members);
            msg.push_str(&if left.is_empty() {
                "; no job image was written, and the job runs on".to_owned()
            } else {
                format!(
                    "; no job image was written, and some did not resume: {}",
                    left.join("; ")
                )
            });
        } else {
            // The processes stay paused, with their memory where the dump left it.
            msg.push_str(&format!(
                "; no job image was written; the job stays paused (`cudaw-ckpt resume --job {}` continues it)",
                job.root
            ));
        }
        return Err(fail(ckpt_client::kind_of(&e), msg));
    }
    let members: Vec<MemberDumped> = results
        .into_iter()
        .filter_map(|(pid, r)| r.ok().map(|dumped| MemberDumped { pid, dumped }))
        .collect();
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        root: job.root,
        members: job
            .members
            .iter()
            .zip(&members)
            .map(|(&pid, d)| ManifestMember {
                pid,
                comm: comm(pid),
                image: format!("{pid}.cudaw"),
                allocations: d.dumped.allocations,
                bytes: d.dumped.bytes,
            })
            .collect(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let text = serde_json::to_string_pretty(&manifest)? + "\n";
    let tmp = dir.join(format!(".{MANIFEST}.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| fail(Kind::Io, format!("writing {}: {e}", path.display())))?;
    // A job left paused holds the contexts alone, as after `pause --job`: the shared memory
    // (never in the images) goes to host memory too.
    let shared = (!leave_running).then(|| evict_shared(job));
    Ok(JobDumped {
        path: dir.display().to_string(),
        pause,
        members,
        shared,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// Makes `dir` (private) if missing; refuses a file, or a folder holding another job's
/// manifest is fine (its images are replaced).
fn prepare_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(fail(
            Kind::Io,
            format!(
                "{} is a file; a job image is a folder (one image per process and {MANIFEST})",
                dir.display()
            ),
        )),
        Err(_) => std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                fail(
                    Kind::Io,
                    format!("creating the folder {}: {e}", dir.display()),
                )
            }),
    }
}

/// Reads and checks a job folder's manifest.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        fail(
            if e.kind() == std::io::ErrorKind::NotFound {
                Kind::BadImage
            } else {
                Kind::Io
            },
            format!(
                "reading {}: {e} (a job image is the folder `cudaw-ckpt dump --job` wrote)",
                path.display()
            ),
        )
    })?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| {
        fail(
            Kind::BadImage,
            format!("{} is not a job manifest: {e}", path.display()),
        )
    })?;
    if m.format != FORMAT {
        return Err(fail(
            Kind::BadImage,
            format!(
                "{}: format {:?}, expected {FORMAT:?}",
                path.display(),
                m.format
            ),
        ));
    }
    Ok(m)
}

/// Which image each member loads: by PID (the same processes), or with `force` by order
/// when the PIDs differ but the counts match.
pub fn pair(job: &Job, m: &Manifest, dir: &Path, force: bool) -> Result<Vec<(u32, PathBuf)>> {
    let by_pid: Option<Vec<(u32, PathBuf)>> = job
        .members
        .iter()
        .map(|&p| {
            m.members
                .iter()
                .find(|e| e.pid == p)
                .map(|e| (p, dir.join(&e.image)))
        })
        .collect();
    if let Some(v) = by_pid.filter(|v| v.len() == m.members.len()) {
        return Ok(v);
    }
    if force && job.members.len() == m.members.len() {
        let mut images: Vec<&ManifestMember> = m.members.iter().collect();
        images.sort_by_key(|e| e.pid);
        return Ok(job
            .members
            .iter()
            .zip(images)
            .map(|(&p, e)| (p, dir.join(&e.image)))
            .collect());
    }
    Err(fail(
        Kind::Mismatch,
        format!(
            "the job image {} holds processes {:?}, the job of {} is {:?}{}",
            dir.display(),
            m.members.iter().map(|e| e.pid).collect::<Vec<_>>(),
            job.root,
            job.members,
            if job.members.len() == m.members.len() {
                " (--force pairs them in PID order: the lowest PID gets the lowest PID's image; ranks whose tables are alike cannot be told apart, so use it only for a job whose launcher starts its ranks in rank order)"
            } else {
                ""
            }
        ),
    ))
}

/// What a job restore did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRestored {
    /// The job folder.
    pub path: String,
    /// The job pause before loading (nothing moved when the job was paused already).
    pub pause: JobPaused,
    /// Each member's restore.
    pub members: Vec<MemberRestored>,
    /// Milliseconds in all.
    pub ms: f64,
}

/// Pauses the job (every rank at rest together), then has every member check and load its
/// image and resume. A member whose image is refused stays paused, as it was; the others
/// are restored and run — their ranks then wait for it until it is resumed or restored.
pub fn restore(
    job: &Job,
    dir: &Path,
    force: bool,
    timeout: Option<Duration>,
    restore_one: impl Fn(u32, &Path, bool) -> Result<Restored> + Sync,
) -> Result<JobRestored> {
    let started = Instant::now();
    let dir = ckpt_client::absolute(dir)?;
    let manifest = read_manifest(&dir)?;
    let pairs = pair(job, &manifest, &dir, force)?;
    let pause = pause(job, timeout, false)?;
    // The images hold no shared memory: what a paused job evicted of it comes back first.
    bring_back_shared(job)?;
    let images: BTreeMap<u32, PathBuf> = pairs.into_iter().collect();
    let results = each(&job.members, |p| match images.get(&p) {
        Some(img) => restore_one(p, img, force),
        None => Err(fail(Kind::Mismatch, "no image for it in the job folder")),
    });
    if let Some(e) = first_failure(&results, "") {
        let mut msg = format!("{e:#}");
        let loaded: Vec<String> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(p, _)| p.to_string())
            .collect();
        msg.push_str(&format!(
            "; {} loaded their images and run on, the others stay paused with the memory they had (their ranks are now at different points: restore the job again from a sound image, or end it)",
            if loaded.is_empty() {
                "no process".to_owned()
            } else {
                format!("processes {}", loaded.join(", "))
            }
        ));
        return Err(fail(ckpt_client::kind_of(&e), msg));
    }
    Ok(JobRestored {
        path: dir.display().to_string(),
        pause,
        members: results
            .into_iter()
            .filter_map(|(pid, r)| r.ok().map(|restored| MemberRestored { pid, restored }))
            .collect(),
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_of_self_is_read_from_stat() {
        let me = std::process::id();
        let pp = parent(me).expect("our own parent");
        assert_eq!(pp, std::os::unix::process::parent_id());
    }

    fn manifest(pids: &[u32]) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            root: 1,
            members: pids
                .iter()
                .map(|&pid| ManifestMember {
                    pid,
                    comm: "python3".into(),
                    image: format!("{pid}.cudaw"),
                    allocations: 1,
                    bytes: 2,
                })
                .collect(),
            created: 0,
        }
    }

    #[test]
    fn images_pair_by_pid_and_by_order_only_when_forced() {
        let job = Job {
            root: 10,
            members: vec![11, 12],
            note: None,
        };
        let dir = Path::new("/j");
        let same = pair(&job, &manifest(&[12, 11]), dir, false).unwrap();
        assert_eq!(
            same,
            vec![(11, dir.join("11.cudaw")), (12, dir.join("12.cudaw"))]
        );
        let other = manifest(&[21, 20]);
        let e = pair(&job, &other, dir, false).unwrap_err();
        assert_eq!(ckpt_client::kind_of(&e), Kind::Mismatch);
        assert!(format!("{e:#}").contains("--force"), "{e:#}");
        let forced = pair(&job, &other, dir, true).unwrap();
        assert_eq!(
            forced,
            vec![(11, dir.join("20.cudaw")), (12, dir.join("21.cudaw"))]
        );
        let three = manifest(&[1, 2, 3]);
        assert!(pair(&job, &three, dir, true).is_err());
    }

    #[test]
    fn a_manifest_of_another_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_manifest(dir.path()).unwrap_err();
        assert_eq!(ckpt_client::kind_of(&e), Kind::BadImage);
        let mut m = manifest(&[5]);
        m.format = "cudaw-job/9".into();
        std::fs::write(
            dir.path().join(MANIFEST),
            serde_json::to_string(&m).unwrap(),
        )
        .unwrap();
        let e = read_manifest(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("cudaw-job/9"), "{e:#}");
        m.format = FORMAT.into();
        std::fs::write(
            dir.path().join(MANIFEST),
            serde_json::to_string(&m).unwrap(),
        )
        .unwrap();
        assert_eq!(read_manifest(dir.path()).unwrap().members[0].pid, 5);
    }
}
