//! The requests the engine carries out — pause, resume, dump, restore — one at a time,
//! on the control thread: [`crate::control`] is the only caller of [`handle`], for the
//! signals and the control socket alike. Pause and resume are [`crate::evict`]'s; dump
//! and restore [`crate::image`]'s. Also what happens to a pause when the process exits
//! ([`serve_exit`], [`abandon`]).

use crate::failure::{Failure, Report};
use crate::host::host;
use crate::state::{Ctl, CTL};
use crate::{evict, handles, hold, image, lifecycle, log, memory, staging};
use cudaw_control::{Dumped, ErrorKind, Held, Moved, Restored};
use std::path::PathBuf;
use std::time::Duration;

/// One control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Pause.
    Pause,
    /// Resume.
    Resume,
    /// Pause, then stay [`Ctl::released`]: the client has the driver checkpoint the
    /// context (`cudaw-ckpt pause --release`).
    PauseForRelease,
    /// Resume a released process whose context the client has had the driver restore.
    ResumeReleased,
    /// The driver kept the context after a [`Request::PauseForRelease`]: plainly paused.
    ContextKept,
    /// A job pause's first step: close the gate, wait up to `window` for the process to be
    /// idle; the gate opens by itself after `lease` without a pause, release or resume.
    Hold {
        /// How long to wait for idle.
        window: Duration,
        /// How long the hold lasts.
        lease: Duration,
    },
    /// End a hold.
    Release,
    /// Write an image of every allocation to `path` (absolute); stay paused with the bytes
    /// only in the image, or resume when `leave_running`.
    Dump {
        /// The image's path.
        path: PathBuf,
        /// Resume once written.
        leave_running: bool,
        /// Leave memory shared with other processes on the device, outside the image.
        keep_shared: bool,
    },
    /// Check the image at `path` against the process, load it and resume.
    Restore {
        /// The image's path.
        path: PathBuf,
        /// Accept another process's image whose table matches.
        force: bool,
    },
}

/// What a request did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A pause's result.
    Pause(Moved),
    /// A resume's result.
    Resume(Moved),
    /// A hold's result.
    Hold(Held),
    /// A release's result.
    Release(Held),
    /// A dump's result.
    Dump(Dumped),
    /// A restore's result.
    Restore(Restored),
}

/// Carries out one request (on the control thread, [`crate::control`] its only caller):
/// what it did, or why it failed. `report` receives progress.
pub(crate) fn handle(req: Request, report: Report<'_>) -> Result<Outcome, Failure> {
    let mut ctl = CTL.lock();
    let held = ctl.hold.is_some();
    let out = serve(&mut ctl, req, report);
    // A pause, resume, dump or restore takes the gate over from a hold: whatever it did,
    // the hold is over, and a process left running must not stay behind a closed gate.
    if held && ctl.hold.is_some() && !matches!(out, Ok(Outcome::Hold(_))) {
        let paused = ctl.paused;
        hold::release(&mut ctl.hold, paused);
    }
    out
}

fn serve(ctl: &mut Ctl, req: Request, report: Report<'_>) -> Result<Outcome, Failure> {
    if ctl.released {
        match req {
            Request::Pause | Request::PauseForRelease => {
                log::info(format_args!("pause: already paused (context released)"));
                return Ok(Outcome::Pause(Moved::default()));
            }
            Request::ContextKept => {
                // Restored by the driver, maybe on other GPUs (a job's migration, which
                // resumes the job after): the node-ledger entries follow first. Until they
                // have, the process stays released, so that every later resume tries again.
                if let Err(why) = memory::follow_moved_devices() {
                    let msg = format!("{why}; the process stays paused");
                    log::warn(format_args!("context kept: {msg}"));
                    return Err(Failure::new(ErrorKind::Failed, msg));
                }
                ctl.released = false;
                crate::slim::restore();
                log::info(format_args!(
                    "the context is on the GPU again (kept, or restored by the driver): paused as before"
                ));
                // An exit that began while released was left waiting at the gate: now the
                // pause can be undone for its teardown, as at any exit.
                if lifecycle::is_exiting() && ctl.paused {
                    match evict::resume(ctl, &mut |_| {}) {
                        Ok(m) => log::info(format_args!(
                            "exiting while paused: the pause was undone ({} bytes restored) so that the program's teardown runs as it would have",
                            m.bytes
                        )),
                        Err(e) => abandon(ctl, &format!("exiting while paused: {e}")),
                    }
                }
                return Ok(Outcome::Pause(Moved {
                    changed: true,
                    ..Moved::default()
                }));
            }
            Request::ResumeReleased => {
                // The restore may have put a device on another GPU (a migration): its
                // node-ledger entry follows before any memory comes back there. Until it
                // has, the process stays released: the next resume tries again.
                if let Err(why) = memory::follow_moved_devices() {
                    let msg = format!("{why}; the process stays paused");
                    log::warn(format_args!("resume: {msg}"));
                    return Err(Failure::new(ErrorKind::Failed, msg));
                }
                ctl.released = false;
                crate::slim::restore();
                log::info(format_args!(
                    "the driver restored the context: resuming cudaw's memory"
                ));
            }
            other => {
                let msg = released_refusal(request_name(&other));
                log::warn(format_args!("{msg}"));
                return Err(Failure::new(ErrorKind::Failed, msg));
            }
        }
    }
    let (req, release) = match req {
        Request::PauseForRelease => (Request::Pause, true),
        Request::ResumeReleased => (Request::Resume, false),
        Request::ContextKept => return Ok(Outcome::Pause(Moved::default())),
        other => (other, false),
    };
    let out = serve_plain(ctl, req, report);
    if release && ctl.paused && matches!(out, Ok(Outcome::Pause(_))) {
        // An arena still being made would be inside the driver when it locks the process.
        staging::finish_arena_builds();
        // Less for the driver to copy: the stack's local memory, unused while paused.
        crate::slim::shrink();
        ctl.released = true;
        log::info(format_args!(
            "paused for the driver's checkpoint: the context is the driver's until `cudaw-ckpt resume {}`",
            std::process::id()
        ));
    }
    out
}

/// Why a released process refuses `what`.
pub(crate) fn released_refusal(what: &str) -> String {
    format!(
        "{what} refused: the process's context is released to the driver (cudaw-ckpt pause \
         --release) and cudaw cannot call the driver until it is restored; resume it with \
         `cudaw-ckpt resume {}`, which has the driver restore the context first",
        std::process::id()
    )
}

fn request_name(req: &Request) -> &'static str {
    match req {
        Request::Pause | Request::PauseForRelease => "pause",
        Request::Resume | Request::ResumeReleased => "resume",
        Request::ContextKept => "context_kept",
        Request::Hold { .. } => "hold",
        Request::Release => "release",
        Request::Dump { .. } => "dump",
        Request::Restore { .. } => "restore",
    }
}

fn serve_plain(ctl: &mut Ctl, req: Request, report: Report<'_>) -> Result<Outcome, Failure> {
    match req {
        Request::Hold { .. } if !ctl.paused && exiting() => {
            let msg = "the process is exiting: hold refused";
            log::info(format_args!("{msg}"));
            Err(Failure::new(ErrorKind::Failed, msg))
        }
        Request::Hold { window, lease } => {
            hold::hold(&mut ctl.hold, ctl.paused, window, lease).map(Outcome::Hold)
        }
        Request::Release => Ok(Outcome::Release(hold::release(&mut ctl.hold, ctl.paused))),
        Request::Resume if !ctl.paused && ctl.hold.is_some() => {
            let paused = ctl.paused;
            hold::release(&mut ctl.hold, paused);
            Ok(Outcome::Resume(Moved {
                changed: true,
                ..Moved::default()
            }))
        }
        Request::Pause if ctl.paused => {
            log::info(format_args!("pause: already paused"));
            Ok(Outcome::Pause(Moved::default()))
        }
        Request::Resume if !ctl.paused => {
            log::info(format_args!("resume: not paused"));
            Ok(Outcome::Resume(Moved::default()))
        }
        Request::Pause | Request::Dump { .. } | Request::Restore { .. }
            if !ctl.paused && exiting() =>
        {
            let msg = "the process is exiting: pause refused";
            log::info(format_args!("{msg}"));
            Err(Failure::new(ErrorKind::Failed, msg))
        }
        Request::Pause => {
            let t0 = host().trace_now();
            // cudaw's exit handler runs first if the process exits while paused.
            lifecycle::register_exit_handler();
            let m = evict::pause(report);
            // What a job marked of its shared memory was for this pause alone.
            handles::shared::clear_marks();
            let m = m?;
            host().trace_pause(false, t0, m.allocations, m.bytes);
            ctl.paused = true;
            ctl.paused_by = None;
            Ok(Outcome::Pause(m))
        }
        Request::Resume => {
            let t0 = host().trace_now();
            handles::shared::clear_marks();
            let m = match evict::resume(ctl, report) {
                Ok(m) => m,
                Err(e) if driver_shut_down() => {
                    lifecycle::mark_exiting_from_control();
                    let msg = format!(
                        "{}; the driver has shut down (CUDA_ERROR_DEINITIALIZED): the process is exiting",
                        e.message
                    );
                    abandon(ctl, &msg);
                    return Err(Failure::new(
                        ErrorKind::Failed,
                        format!("{msg}; the pause was abandoned and its threads let go"),
                    ));
                }
                Err(e) => return Err(e),
            };
            host().trace_pause(true, t0, m.allocations, m.bytes);
            Ok(Outcome::Resume(m))
        }
        Request::Dump {
            path,
            leave_running,
            keep_shared,
        } => image::dump(ctl, &path, leave_running, keep_shared, report).map(Outcome::Dump),
        Request::Restore { path, force } => {
            image::restore(ctl, &path, force, report).map(Outcome::Restore)
        }
        Request::PauseForRelease | Request::ResumeReleased | Request::ContextKept => {
            unreachable!("mapped by serve")
        }
    }
}

/// At exit: undoes a pause (a resume), or abandons it when the memory cannot come back, so
/// that the program's teardown runs with its gate open; then lets the exiting thread go.
pub(crate) fn serve_exit() {
    let mut ctl = CTL.lock();
    if ctl.hold.is_some() {
        let paused = ctl.paused;
        hold::release(&mut ctl.hold, paused);
        log::info(format_args!("exiting while held: the hold ends"));
    }
    if ctl.released {
        // The driver holds the context: cudaw cannot bring the memory back, and a
        // program let go would wait inside the locked driver. It waits at the gate instead.
        log::warn(format_args!(
            "exiting while paused with the context released to the driver: the program's \
             teardown waits until `cudaw-ckpt resume {}` restores it",
            std::process::id()
        ));
    } else if ctl.paused {
        match evict::resume(&mut ctl, &mut |_| {}) {
            Ok(m) => log::info(format_args!(
                "exiting while paused: the pause was undone ({} bytes restored) so that the program's teardown runs as it would have",
                m.bytes
            )),
            Err(e) => abandon(&mut ctl, &format!("exiting while paused: {e}")),
        }
    }
    drop(ctl);
    lifecycle::exit_served();
}

/// Gives a pause up without its memory: the gate opens and the program's threads go on,
/// their evicted allocations left where they are (in host memory or an image). Only for a
/// process that is exiting, or whose driver has shut down: nothing can bring the memory
/// back, and holding the threads would hold the process for ever.
fn abandon(ctl: &mut Ctl, why: &str) {
    ctl.paused = false;
    ctl.paused_by = None;
    ctl.image = None;
    host().open_gate();
    log::warn(format_args!(
        "{why}; the pause is abandoned: the program's threads go on without their device memory"
    ));
}

/// Whether the process is exiting: C's `exit` has begun, or the Python interpreter is
/// finalizing (marked exiting from then on).
pub(crate) fn exiting() -> bool {
    if lifecycle::is_exiting() {
        return true;
    }
    let finalizing = lifecycle::interpreter_finalizing();
    if finalizing {
        log::debug(format_args!(
            "the Python interpreter is finalizing: the process is exiting"
        ));
        lifecycle::mark_exiting_from_control();
    }
    finalizing
}

/// Whether the driver has shut down (`CUDA_ERROR_DEINITIALIZED` from a synchronise on a
/// device holding cudaw's memory): the process is exiting, and no memory can come back.
fn driver_shut_down() -> bool {
    const CUDA_ERROR_DEINITIALIZED: i32 = 4;
    memory::managed_devices().any(|(_, m)| {
        matches!(m.vmm.backend().synchronize(), Err(e) if e.code as i32 == CUDA_ERROR_DEINITIALIZED)
    })
}

/// Ends a hold whose lease has passed (the control thread looks while the gate is closed).
pub(crate) fn expire_hold() {
    if let Some(mut ctl) = CTL.try_lock() {
        let paused = ctl.paused;
        hold::expire(&mut ctl.hold, paused);
    }
}

/// The requests about memory shared with the job's other processes (the protocol's "Jobs:
/// shared memory"), which carry descriptors in or out: their reply and descriptors, or the
/// request back when it is another (before any lock: `status` is answered beside a long
/// request). On the control thread, as every queued request.
#[allow(clippy::result_large_err)]
pub(crate) fn shared(
    req: cudaw_control::Request,
    fds: Vec<std::os::fd::OwnedFd>,
) -> Result<(cudaw_control::Reply, Vec<std::os::fd::OwnedFd>), cudaw_control::Request> {
    use cudaw_control::{
        Marked, Paired, PairedImport, PeerExport, Reexported, Reimported, Reply, Request as R,
        Shares,
    };
    use handles::shared;
    if !matches!(
        req,
        R::Shares {}
            | R::Pair { .. }
            | R::Mark { .. }
            | R::EvictShared { .. }
            | R::Reexport { .. }
            | R::Reimport { .. }
    ) {
        return Err(req);
    }
    let ok = || Reply {
        ok: true,
        ..Reply::default()
    };
    let failed = |msg: String| {
        log::error(format_args!("shared memory: {msg}"));
        (Reply::error(ErrorKind::Failed, msg), Vec::new())
    };
    let ctl = CTL.lock();
    if ctl.released {
        return Ok(failed(released_refusal(req.name())));
    }
    if !ctl.paused && !matches!(req, R::Shares {}) {
        return Ok(failed(format!(
            "{}: the process is not paused (a job pauses every process before it shares out their memory)",
            req.name()
        )));
    }
    Ok(match req {
        R::Shares {} => {
            let mut r = ok();
            r.shares = Some(Shares {
                exports: shared::exports()
                    .into_iter()
                    .map(|(handle, fd)| PeerExport { pid: 0, handle, fd })
                    .collect(),
                awaiting: shared::awaiting_imports()
                    .into_iter()
                    .map(|(handle, pid, export)| PairedImport {
                        handle,
                        pid,
                        export,
                    })
                    .collect(),
            });
            (r, Vec::new())
        }
        R::Pair { exports } => {
            let peers: Vec<(u32, u64, i32)> =
                exports.iter().map(|e| (e.pid, e.handle, e.fd)).collect();
            let mut r = ok();
            r.paired = Some(match shared::pair(&peers) {
                Ok((found, unpaired)) => Paired {
                    imports: found
                        .iter()
                        .map(|&(handle, pid, export, _)| PairedImport {
                            handle,
                            pid,
                            export,
                        })
                        .collect(),
                    matched: found.iter().map(|&(_, pid, _, fd)| (pid, fd)).collect(),
                    unpaired: unpaired as u64,
                    error: None,
                },
                Err(e) => {
                    log::warn(format_args!("shared memory: {e}"));
                    Paired {
                        error: Some(e),
                        ..Paired::default()
                    }
                }
            });
            (r, Vec::new())
        }
        R::Mark { exports, imports } => match shared::mark(&exports, &imports) {
            Ok((e, i)) => {
                let mut r = ok();
                r.marked = Some(Marked {
                    exports: e as u64,
                    imports: i as u64,
                });
                (r, Vec::new())
            }
            Err(e) => failed(format!("mark: {e}")),
        },
        R::EvictShared { imports } => match shared::evict_shared(imports) {
            Ok(n) => {
                let what = if imports { "imports" } else { "exports" };
                if n > 0 {
                    log::info(format_args!(
                        "shared memory: {n} {what} of memory shared within the job evicted \
                         (every process sharing them is paused)"
                    ));
                }
                let mut r = ok();
                r.evicted_shared = Some(if imports {
                    Marked {
                        imports: n as u64,
                        ..Marked::default()
                    }
                } else {
                    Marked {
                        exports: n as u64,
                        ..Marked::default()
                    }
                });
                (r, Vec::new())
            }
            Err(e) => failed(format!("evicting shared memory: {e}")),
        },
        R::Reexport { handles } => {
            match shared::reexport(&handles, &mut crate::staging::staging()) {
                Ok(out) => {
                    log::info(format_args!(
                        "shared memory: {} exports of memory shared within the job handed to \
                         its importers again (the evicted ones made again at the same addresses)",
                        handles.len()
                    ));
                    let mut r = ok();
                    r.reexported = Some(Reexported { handles });
                    (r, out)
                }
                Err(e) => failed(format!("reexport: {e}")),
            }
        }
        R::Reimport { handles } => match shared::reimport(handles.into_iter().zip(fds).collect()) {
            Ok(n) => {
                log::info(format_args!(
                    "shared memory: {n} imports of memory shared within the job imported again, \
                     at the same addresses"
                ));
                let mut r = ok();
                r.reimported = Some(Reimported { imports: n as u64 });
                (r, Vec::new())
            }
            Err(e) => failed(format!("reimport: {e}")),
        },
        other => return Err(other),
    })
}
