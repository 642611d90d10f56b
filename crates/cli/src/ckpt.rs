//! `cudaw-ckpt`: pause, resume, dump, restore and inspect processes running under cudaw,
//! through their control sockets (`$CUDAW_RUN_DIR/PID.sock`), and inspect checkpoint
//! images.

#![forbid(unsafe_code)]

#[macro_use]
mod out;
mod ckpt_client;
mod ckpt_inspect;
mod ckpt_job;
mod ckpt_migrate;
mod ckpt_progress;
mod ckpt_release;
// Shared with cudaw, which reports kinds this binary never makes.
#[allow(dead_code)]
mod failure;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::{Parser, Subcommand};
use cudaw_control::{Moved, Request, State, Status};

use ckpt_client::{absolute, carried, fail, kind_of, request, utf8, Kind};
use ckpt_progress::Bars;

/// Pause, resume, checkpoint, restore and trace CUDA programs running under cudaw.
///
/// A program started with `cudaw run` (or with cudaw's libcudart.so preloaded) serves a
/// control socket at $CUDAW_RUN_DIR/PID.sock (default $XDG_RUNTIME_DIR/cudaw, else
/// /tmp/cudaw-UID). Only the process's owner, or root, may use it.
///
/// Pausing waits for cudaw's calls in flight, synchronises the device and copies every
/// allocation to host memory, handing the device memory back; the program's CUDA calls
/// wait. Resuming puts every allocation back at the same address and lets the calls
/// through. `kill -USR1 PID` / `kill -USR2 PID` do the same without a reply.
///
/// Dumping writes every allocation into a checkpoint image (the process writes it itself,
/// as its owner); restoring checks an image against the process and loads it.
///
/// Examples:
///
///   cudaw-ckpt status                  every process under cudaw on this machine
///
///   cudaw-ckpt pause 4242              pause; prints what was evicted and how long it took
///
///   cudaw-ckpt pause 4242 --release    pause, then have the driver checkpoint the context
///                                      too: the GPU holds nothing of 4242 (resume as usual)
///
///   cudaw-ckpt pause 4242 --job        every process of the job 4242 launched, together
///                                      (also resume, status, dump and restore --job)
///
///   cudaw-ckpt status 4242 --json      one process, as JSON (per device: limit, used,
///                                      peak, refused, node_used, node_capacity in bytes)
///
///   cudaw-ckpt dump 4242 -o job.img    checkpoint; 4242 stays paused, its memory in job.img
///
///   cudaw-ckpt resume 4242             continue (loads job.img back into device memory)
///
///   cudaw-ckpt restore 4242 -i job.img go back to job.img's memory, and continue
///
///   cudaw-ckpt inspect job.img --verify
///
///   cudaw-ckpt stats 4242 [--json|--prometheus]   metrics (CUDAW_TRACE=metrics|timeline)
///
///   cudaw-ckpt trace 4242 -o job.trace.json       the timeline so far (CUDAW_TRACE=timeline)
///
/// Exit status: 0 on success; 1 on a failure (no such process, not under cudaw,
/// permission, the file system, the request failed); 3 when an image is at fault (not a
/// cudaw image, another format version, truncated, corrupt, or another process's);
/// 2 for a usage error. With --json, a failure prints one line on standard output too,
/// {"ok":false,"kind":KIND,"error":MESSAGE}, as `cudaw` does; KIND is one of usage,
/// no_process, not_under_cudaw, permission, connection, io, bad_image, mismatch, request,
/// failed, unsupported, timeout. A closed standard output (`| head -1`) ends the command
/// quietly with status 0.
#[derive(Debug, Parser)]
#[command(name = "cudaw-ckpt", version, about, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Pause a process: evict its device memory to host memory and hold its CUDA calls.
    ///
    /// Waits until done; prints the allocations and bytes evicted and the time taken (a
    /// progress bar on a terminal). Pausing a paused process changes nothing.
    ///
    /// A paused process still holds its CUDA context on the GPU (hundreds of MiB for
    /// PyTorch). With --release, once cudaw has evicted the memory, the CUDA driver's own
    /// checkpoint (cuCheckpointProcessLock + cuCheckpointProcessCheckpoint, driver 550 or
    /// later, called from here) takes the rest to host memory: the GPU then holds nothing
    /// of the process (nvidia-smi lists it no more). `cudaw-ckpt resume` has the driver
    /// restore it first. What the driver's checkpoint requires (root or the same user,
    /// persistence mode) is not yet confirmed on GPUs; where the driver lacks the API or
    /// refuses, the process is paused without releasing the context, with a warning saying
    /// why (exit status 0). Not with --job (pause the job without it).
    #[command(
        after_help = "Examples:\n  cudaw-ckpt pause 4242\n  cudaw-ckpt pause 4242 --json    \
                            {\"allocations\":5,\"bytes\":327680,\"ms\":1.2,\"changed\":true}\n  \
                            cudaw-ckpt pause 4242 --release     the GPU holds nothing of 4242 afterwards\n  \
                            cudaw-ckpt pause 4242 --release --json    {...,\"released\":true,\"driver\":{\"lock_ms\",\"checkpoint_ms\"},\"driver_ms\"}\n                                   (\"released\":false,\"reason\":... when the driver could not)\n  \
                            cudaw-ckpt pause 4242 --job     every process of the job launched by 4242 (torchrun's PID), together\n  \
                            cudaw-ckpt pause 4242 --job --json    {\"root\",\"members\":[{\"pid\",...}],\"attempts\",\"ms\",\"allocations\",\"bytes\",\"shared\":{...}}"
    )]
    Pause {
        /// The process ID.
        pid: u32,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// PID names a job: act on every process under cudaw in its tree together (the
        /// launcher's: torchrun, mpirun, the shell that started the ranks).
        #[arg(long)]
        job: bool,
        /// With --job: how long to look for an instant when every process is at rest
        /// together ("60", "2.5s", "500ms", "2m", "off").
        #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_timeout, requires = "job")]
        timeout: Timeout,
        /// With --job: leave the memory the processes share on the device (cuMem buffers
        /// one exports and another imports, such as NCCL's). By default a job pause evicts
        /// it too, once every process sharing it is paused, and `resume --job` makes it
        /// again at the same addresses: the GPUs keep the contexts alone. Keep it when a
        /// process outside the job imports the job's memory (cudaw cannot see that).
        #[arg(long, requires = "job")]
        keep_shared: bool,
        /// Release the CUDA context too, through the driver's checkpoint (default for a
        /// process started with `cudaw run --release-on-pause`).
        #[arg(long, conflicts_with_all = ["job", "no_release"])]
        release: bool,
        /// Keep the context on the GPU even if the process was started with
        /// --release-on-pause.
        #[arg(long)]
        no_release: bool,
        /// With --release: how long the driver's lock waits for the program's CUDA work
        /// ("10s", "500ms", "off": for ever).
        #[arg(long, value_name = "TIME", default_value = "10s", value_parser = parse_timeout)]
        lock_timeout: Timeout,
    },
    /// Resume a paused process: restore its device memory at the same addresses.
    ///
    /// Loads from host memory, or from the image a `dump` left the memory in. Waits until
    /// done; prints the allocations and bytes restored and the time taken. If the image
    /// holding the memory is damaged the process stays paused (restore another image).
    /// A process paused with --release first has the driver restore and unlock its
    /// context (cuCheckpointProcessRestore + cuCheckpointProcessUnlock); `kill -USR2`
    /// cannot resume such a process.
    #[command(after_help = "Examples:\n  cudaw-ckpt resume 4242\n  cudaw-ckpt resume 4242 --json")]
    Resume {
        /// The process ID.
        pid: u32,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// PID names a job: act on every process under cudaw in its tree together (the
        /// launcher's: torchrun, mpirun, the shell that started the ranks).
        #[arg(long)]
        job: bool,
    },
    /// Show a process's state (running or paused), addressing mode and memory per device
    /// (its limit, use and peak; what the GPU's processes under cudaw hold together);
    /// without a PID, every process under cudaw on this machine. A socket that does not
    /// answer is stale: removed (said once, on standard error) when its process is gone
    /// or the PID now runs another program; else skipped with the reason.
    #[command(
        after_help = "Examples:\n  cudaw-ckpt status\n  cudaw-ckpt status 4242 --json    \
                            {\"pid\",\"state\",\"addressing\",\"image\",\"kept_host\",\"arena\",\"arena_building\",\"devices\":[...]}"
    )]
    Status {
        /// The process ID (default: all).
        pid: Option<u32>,
        /// Print JSON: the status object for one PID; for all, {"processes": [...],
        /// "stale": [PIDs of sockets that did not answer], "removed": [those of them
        /// removed]}.
        #[arg(long)]
        json: bool,
        /// PID names a job: every process under cudaw in its tree.
        #[arg(long, requires = "pid")]
        job: bool,
    },
    /// Write a checkpoint image of a process's device memory.
    ///
    /// Pauses the process (if running), then the process itself writes every allocation
    /// into FILE (streamed in 8 MiB checksummed chunks, through a temporary file renamed
    /// into place, mode 0600), and stays paused with its memory only in FILE: no device
    /// memory and no host copy held. A later `resume` loads FILE back; keep FILE until
    /// then. With --leave-running the process resumes once FILE is written. A failed
    /// dump leaves the process as it was.
    ///
    /// The image records the process (PID, executable, host, time), the GPU (name, UUID
    /// when the CUDA runtime reports it, device ordinal), the addressing mode and every
    /// allocation (address, size, creation order).
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt dump 4242 -o /scratch/job.img              checkpoint, stay paused\n  \
        cudaw-ckpt dump 4242 -o job.img --leave-running       checkpoint, keep running\n  \
        cudaw-ckpt dump 4242 -o job.img --json                {\"path\",\"image_bytes\",\"allocations\",\"bytes\",\"digest\",\"pause\",\"write_ms\",\"state\",\"ms\"}")]
    Dump {
        /// The process ID.
        pid: u32,
        /// The image file to write (replaced if it exists). Relative paths are taken from
        /// the current folder; the process must be able to write there.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Resume the process once the image is written.
        #[arg(long)]
        leave_running: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// PID names a job: pause every process of it together, then each writes its
        /// image into the folder FILE (made if missing: PID.cudaw each, and job.json).
        /// Memory the ranks share (NCCL's exported buffers) stays on the device, outside
        /// the images: restore such a job image into the same job.
        #[arg(long)]
        job: bool,
        /// With --job: how long to look for an instant when every process is at rest
        /// together ("60", "2.5s", "500ms", "2m", "off").
        #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_timeout, requires = "job")]
        timeout: Timeout,
    },
    /// Load a checkpoint image into a process's device memory and resume it.
    ///
    /// The process checks FILE against itself before touching anything: the format and
    /// version, the allocation table (every address, size and creation order), the
    /// addressing mode, and that it made the image itself (this PID on this host; --force
    /// accepts another process's image whose table matches). Then it reads the image once,
    /// loading it into new device memory and checking every chunk's checksum as it goes,
    /// and the image digest at the end; only then does the load replace the process's
    /// memory and the process resume. A running process is paused first. A refused or
    /// failed restore leaves the process as it was: a paused process stays paused with its
    /// memory intact (`resume` continues it unchanged).
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt restore 4242 -i /scratch/job.img\n  \
        cudaw-ckpt restore 4242 -i job.img --json      {\"path\",\"allocations\",\"bytes\",\"pause\",\"verify_ms\",\"load_ms\",\"state\",\"ms\"}\n\n\
        Exit status 3: the image is bad or not this process's; the process is unchanged.")]
    Restore {
        /// The process ID.
        pid: u32,
        /// The image file to load.
        #[arg(short = 'i', long = "input", value_name = "FILE")]
        input: PathBuf,
        /// Accept an image another process made, when its allocation table matches.
        #[arg(long)]
        force: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// PID names a job and FILE the folder `dump --job` wrote: pause every process of
        /// the job together, then each loads its own image (matched by PID; --force pairs
        /// them in PID order) and runs on.
        #[arg(long)]
        job: bool,
        /// With --job: how long to look for an instant when every process is at rest
        /// together ("60", "2.5s", "500ms", "2m", "off").
        #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_timeout, requires = "job")]
        timeout: Timeout,
    },
    /// Show a process's metrics (it must run with CUDAW_TRACE=metrics or timeline).
    ///
    /// Per runtime function: calls, total, mean and largest time in the call; per kernel
    /// (demangled name): launches; per copy direction: copies and bytes; pauses and
    /// resumes; and from the memory history the hottest allocations (most copies and
    /// launches) and the coldest (unused longest), each with its size, creation order, API,
    /// calling library, copies in and out, the kernels that received it and its idle time.
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt stats 4242\n  \
        cudaw-ckpt stats 4242 --json          {\"pid\",\"mode\",\"seconds\",\"calls\":[{\"name\",\"count\",\"total_ns\",\"mean_ns\",\"max_ns\"}],\"kernels\",\"copies\",\"pauses\",\"memory\":{\"hottest\",\"coldest\",...},\"timeline\"}\n  \
        cudaw-ckpt stats 4242 --prometheus    the Prometheus text format (cudaw_calls_total, cudaw_call_seconds_total, ...)")]
    Stats {
        /// The process ID.
        pid: u32,
        /// Print the metrics as JSON.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Print the metrics in the Prometheus text exposition format.
        #[arg(long)]
        prometheus: bool,
        /// How many hottest and coldest allocations to show.
        #[arg(long, default_value_t = cudaw_control::DEFAULT_TOP)]
        top: u32,
    },
    /// Write a process's timeline so far (CUDAW_TRACE=timeline) as Chrome trace-event JSON.
    ///
    /// The process writes FILE itself (as its owner), from its bounded ring of events:
    /// every runtime call with its start and duration, kernel launches with grid, block
    /// and the allocations they received, copies, allocations, frees, pauses and resumes.
    /// Open FILE in Perfetto (ui.perfetto.dev) or chrome://tracing.
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt trace 4242 -o job.trace.json\n  \
        cudaw-ckpt trace 4242 -o job.trace.json --json    {\"path\",\"events\",\"bytes\",\"dropped\"}")]
    Trace {
        /// The process ID.
        pid: u32,
        /// The file to write (replaced if it exists); the process must be able to write there.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Switch tracing off or back on in a running process (started with CUDAW_TRACE).
    ///
    /// Off, the process's calls take the same paths as with CUDAW_TRACE=off, so tracing
    /// costs nothing while it is off; the metrics, memory history and timeline recorded so
    /// far stay readable (stats, trace), and recording resumes when switched back on.
    /// Calls made while off are not counted. A process started without CUDAW_TRACE cannot
    /// be switched (start it with CUDAW_TRACE=metrics, then switch it off if you like).
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt tracing 4242 off\n  \
        cudaw-ckpt tracing 4242 on --json    {\"mode\",\"on\",\"was_on\"}")]
    Tracing {
        /// The process ID.
        pid: u32,
        /// `on` or `off`.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move a running process to another GPU, at the same device addresses.
    ///
    /// Checks first, before anything moves: the GPU exists, is the same model (the
    /// driver restores only onto the same kind of GPU) and has room for the process's
    /// memory beside the other processes under cudaw on it (the node ledger). Then
    /// pauses the process with its context released (as `pause --release`), has the
    /// driver restore the context on the other GPU (cuCheckpointProcessRestore with GPU
    /// pairs, driver 580 or later) and restores cudaw's memory there. The program keeps
    /// its device ordinal and every pointer; only the GPU behind them changes.
    ///
    /// What fails is undone: the process runs on where it was, and the error says why.
    /// A paused process is resumed on its new GPU. GPU indexes are nvidia-smi's (PCI bus
    /// order, every GPU of the machine whatever CUDA_VISIBLE_DEVICES says here).
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt migrate 4242 --to 1                    onto GPU 1 (nvidia-smi's index)\n  \
        cudaw-ckpt migrate 4242 --to GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9\n  \
        cudaw-ckpt migrate 4242 --to 0=2,1=3              a process on GPUs 0 and 1 onto 2 and 3\n  \
        cudaw-ckpt migrate 4100 --job --to 2,3            a job on GPUs 0 and 1 (torchrun's PID) onto 2 and 3\n  \
        cudaw-ckpt migrate 4242 --to 1 --json             {\"pid\",\"moved\":[{\"ordinal\",\"from\",\"to\"}],\"bytes\",\"allocations\",\"pause_ms\",\"release_ms\",\"restore_ms\",\"resume_ms\",\"total_ms\"}")]
    Migrate {
        /// The process ID.
        pid: u32,
        /// Where to: a GPU index or UUID for a process on one GPU; OLD=NEW[,OLD=NEW] for
        /// one on several.
        #[arg(long, value_name = "GPU")]
        to: String,
        /// How long the driver's lock waits for the program's CUDA work ("10s", "500ms",
        /// "off": for ever).
        #[arg(long, value_name = "TIME", default_value = "10s", value_parser = parse_timeout)]
        lock_timeout: Timeout,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// PID names a job: move every process under cudaw in its tree together (paused
        /// together, their shared memory evicted, each checkpointed and restored by the
        /// driver on its new GPUs, then resumed together). --to gives OLD=NEW for each of
        /// the job's GPUs that moves, or the new GPUs in the order of the job's.
        #[arg(long)]
        job: bool,
        /// With --job: how long to look for an instant when every process is at rest
        /// together ("60", "2.5s", "500ms", "2m", "off").
        #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_timeout, requires = "job")]
        timeout: Timeout,
    },
    /// Show a checkpoint image: format, producing process, GPU, allocation table.
    ///
    /// Reading the header checks the format, version, header and metadata checksums, the
    /// table and the file length (a truncated image fails here). --verify also reads every
    /// chunk and checks its checksum and the whole-image digest. Exit status 3 when the
    /// image is bad, with a message naming what and where.
    #[command(verbatim_doc_comment)]
    #[command(after_help = "Examples:\n  \
        cudaw-ckpt inspect job.img\n  \
        cudaw-ckpt inspect job.img --verify            check every chunk\n  \
        cudaw-ckpt inspect job.img --verify --json     {\"format_version\",\"process\",\"gpu\",\"allocations\":[...],\"verified\":{...}}")]
    Inspect {
        /// The image file.
        file: PathBuf,
        /// Check every chunk checksum and the image digest.
        #[arg(long)]
        verify: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// List every allocation (default: the first 20).
        #[arg(long)]
        all: bool,
    },
}

impl Command {
    fn json(&self) -> bool {
        match self {
            Command::Pause { json, .. }
            | Command::Resume { json, .. }
            | Command::Migrate { json, .. }
            | Command::Status { json, .. }
            | Command::Dump { json, .. }
            | Command::Restore { json, .. }
            | Command::Stats { json, .. }
            | Command::Trace { json, .. }
            | Command::Tracing { json, .. }
            | Command::Inspect { json, .. } => *json,
        }
    }
}

fn main() -> ExitCode {
    let cli = match failure::parse::<Cli>() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let json = cli.command.json();
    let result = match cli.command {
        Command::Pause {
            pid,
            json,
            job: true,
            timeout,
            keep_shared,
            ..
        } => job_pause(pid, timeout.0, !keep_shared, json),
        Command::Resume {
            pid,
            json,
            job: true,
        } => job_resume(pid, json),
        Command::Pause {
            pid,
            json,
            release,
            no_release,
            lock_timeout,
            ..
        } => {
            let want = match (release, no_release) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            pause_one(pid, want, lock_timeout.0, json)
        }
        Command::Resume { pid, json, .. } => resume_one(pid, json),
        Command::Migrate {
            pid,
            to,
            lock_timeout,
            json,
            job: true,
            timeout,
        } => ckpt_migrate::migrate_job(pid, &to, timeout.0, lock_timeout.0, json),
        Command::Migrate {
            pid,
            to,
            lock_timeout,
            json,
            ..
        } => ckpt_migrate::migrate(pid, &to, lock_timeout.0, json),
        Command::Status {
            pid: Some(pid),
            json,
            job: true,
        } => job_status(pid, json),
        Command::Status {
            pid: Some(pid),
            json,
            ..
        } => status_one(pid, json),
        Command::Status {
            pid: None, json, ..
        } => status_all(json),
        Command::Dump {
            pid,
            output,
            leave_running,
            json,
            job: true,
            timeout,
        } => job_dump(pid, &output, leave_running, timeout.0, json),
        Command::Dump {
            pid,
            output,
            leave_running,
            json,
            ..
        } => dump(pid, &output, leave_running, json),
        Command::Restore {
            pid,
            input,
            force,
            json,
            job: true,
            timeout,
        } => job_restore(pid, &input, force, timeout.0, json),
        Command::Restore {
            pid,
            input,
            force,
            json,
            ..
        } => restore(pid, &input, force, json),
        Command::Inspect {
            file,
            verify,
            json,
            all,
        } => ckpt_inspect::run(&file, verify, json, all),
        Command::Stats {
            pid,
            json,
            prometheus,
            top,
        } => stats(pid, json, prometheus, top),
        Command::Trace { pid, output, json } => trace(pid, &output, json),
        Command::Tracing { pid, state, json } => tracing(pid, state == "on", json),
    };
    failure::finish("cudaw-ckpt", result, json)
}

/// `--timeout`'s value: `None` waits for ever.
#[derive(Debug, Clone, Copy)]
struct Timeout(Option<Duration>);

fn parse_timeout(v: &str) -> std::result::Result<Timeout, String> {
    cudaw_control::parse_timeout(v)
        .map(Timeout)
        .ok_or_else(|| format!("{v:?} is not a time ({})", cudaw_control::TIMEOUT_SYNTAX))
}

/// The job of `pid`, its note (if any) said on standard error.
fn find_job(pid: u32) -> Result<ckpt_job::Job> {
    let job = ckpt_job::find(pid)?;
    if let Some(n) = &job.note {
        eprintln!("cudaw-ckpt: note: {n}");
    }
    Ok(job)
}

fn job_pause(pid: u32, timeout: Option<Duration>, shared: bool, json: bool) -> Result<()> {
    let job = find_job(pid)?;
    let p = ckpt_job::pause(&job, timeout, shared)?;
    if json {
        outln!("{}", serde_json::to_string(&p)?)?;
        return Ok(());
    }
    print_job_paused(&p)
}

fn print_job_paused(p: &ckpt_job::JobPaused) -> Result<()> {
    for m in &p.members {
        if m.moved.changed {
            outln!(
                "{}: paused: {} allocations, {} bytes ({}) evicted in {:.1} ms",
                m.pid,
                m.moved.allocations,
                m.moved.bytes,
                mib(m.moved.bytes),
                m.moved.ms
            )?;
        } else {
            outln!("{}: already paused", m.pid)?;
        }
    }
    let tries = if p.attempts > 1 {
        format!(
            " ({} tries to find an instant when every process was at rest)",
            p.attempts
        )
    } else {
        String::new()
    };
    print_shared(p.root, p.shared.as_ref())?;
    outln!(
        "job of {}: {} processes paused: {} allocations, {} ({}) evicted in {:.1} ms{tries}",
        p.root,
        p.members.len(),
        p.allocations,
        p.bytes,
        mib(p.bytes),
        p.ms
    )
}

fn job_resume(pid: u32, json: bool) -> Result<()> {
    let job = find_job(pid)?;
    let started = std::time::Instant::now();
    let members = ckpt_job::resume(&job)?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let bytes: u64 = members.iter().map(|m| m.moved.bytes).sum();
    if json {
        let allocations: u64 = members.iter().map(|m| m.moved.allocations).sum();
        let v = serde_json::json!({"root": job.root, "members": members, "allocations": allocations, "bytes": bytes, "ms": ms});
        outln!("{v}")?;
        return Ok(());
    }
    for m in &members {
        if m.moved.changed {
            outln!(
                "{}: resumed: {} allocations, {} bytes ({}) restored in {:.1} ms",
                m.pid,
                m.moved.allocations,
                m.moved.bytes,
                mib(m.moved.bytes),
                m.moved.ms
            )?;
        } else {
            outln!("{}: not paused; nothing to resume", m.pid)?;
        }
    }
    outln!(
        "job of {}: {} processes running: {} ({}) restored in {ms:.1} ms",
        job.root,
        members.len(),
        bytes,
        mib(bytes)
    )
}

fn job_status(pid: u32, json: bool) -> Result<()> {
    let job = find_job(pid)?;
    let all = ckpt_job::status(&job)?;
    if json {
        let v = serde_json::json!({"root": job.root, "members": all});
        outln!("{v}")?;
        return Ok(());
    }
    outln!("job of {}: {} processes under cudaw", job.root, all.len())?;
    for s in &all {
        print_status(s)?;
    }
    Ok(())
}

/// What a job operation did with the memory its processes share.
fn print_shared(root: u32, shared: Option<&ckpt_job::SharedEvicted>) -> Result<()> {
    let Some(s) = shared else { return Ok(()) };
    if let Some(e) = &s.error {
        eprintln!("cudaw-ckpt: warning: the job's shared memory: {e}");
        return Ok(());
    }
    if s.exports + s.imports + s.unpaired == 0 {
        return Ok(());
    }
    let outside = if s.unpaired > 0 {
        format!(
            "; {} imports of memory from outside the job left on the device",
            s.unpaired
        )
    } else {
        String::new()
    };
    outln!(
        "job of {root}: shared memory: {} exports and {} imports evicted with the job{outside}",
        s.exports,
        s.imports
    )
}

fn job_dump(
    pid: u32,
    output: &Path,
    leave_running: bool,
    timeout: Option<Duration>,
    json: bool,
) -> Result<()> {
    let job = find_job(pid)?;
    let d = ckpt_job::dump(&job, output, leave_running, timeout, |p, path, leave| {
        dump_one(p, path, leave, true, true)
    })?;
    if json {
        outln!("{}", serde_json::to_string(&d)?)?;
        return Ok(());
    }
    print_job_paused(&d.pause)?;
    for m in &d.members {
        print_dumped(m.pid, &m.dumped)?;
    }
    print_shared(job.root, d.shared.as_ref())?;
    let bytes: u64 = d.members.iter().map(|m| m.dumped.image_bytes).sum();
    outln!(
        "job of {}: {} images and {} written to {} ({} bytes) in {:.1} ms",
        job.root,
        d.members.len(),
        ckpt_job::MANIFEST,
        d.path,
        bytes,
        d.ms
    )
}

fn job_restore(
    pid: u32,
    input: &Path,
    force: bool,
    timeout: Option<Duration>,
    json: bool,
) -> Result<()> {
    let job = find_job(pid)?;
    let r = ckpt_job::restore(&job, input, force, timeout, |p, path, force| {
        restore_one(p, path, force, true)
    })?;
    if json {
        outln!("{}", serde_json::to_string(&r)?)?;
        return Ok(());
    }
    for m in &r.members {
        print_restored(m.pid, &m.restored)?;
    }
    outln!(
        "job of {}: {} processes restored from {} in {:.1} ms; running",
        job.root,
        r.members.len(),
        r.path,
        r.ms
    )
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Sends `req` (asking for progress when bars are drawn) and returns the reply.
fn with_bars(pid: u32, req: Request, json: bool) -> Result<cudaw_control::Reply> {
    with_bars_and_file(pid, req, None, json)
}

/// [`with_bars`], passing `file` with the request.
fn with_bars_and_file(
    pid: u32,
    mut req: Request,
    file: Option<std::os::fd::BorrowedFd<'_>>,
    json: bool,
) -> Result<cudaw_control::Reply> {
    let mut bars = Bars::new(json);
    if bars.wanted() {
        match &mut req {
            Request::Pause { progress, .. }
            | Request::Resume { progress, .. }
            | Request::Dump { progress, .. }
            | Request::Restore { progress, .. } => *progress = true,
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
            | Request::Tracing { .. } => {}
        }
    }
    let r = ckpt_client::request_with_file(pid, &req, file, &mut |p| bars.update(p));
    bars.finish();
    r
}

fn pause_or_resume(pid: u32, pause: bool, json: bool) -> Result<()> {
    let req = if pause {
        Request::PAUSE
    } else {
        Request::RESUME
    };
    let reply = with_bars(pid, req, json)?;
    let (moved, verb, already): (Option<Moved>, &str, &str) = if pause {
        (reply.pause, "paused", "already paused")
    } else {
        (reply.resume, "resumed", "not paused; nothing to resume")
    };
    let m = carried(moved, "result")?;
    if json {
        outln!("{}", serde_json::to_string(&m)?)?;
    } else if m.changed {
        let what = if pause { "evicted" } else { "restored" };
        outln!(
            "{pid}: {verb}: {} allocations, {} bytes ({}) {what} in {:.1} ms",
            m.allocations,
            m.bytes,
            mib(m.bytes),
            m.ms
        )?;
    } else {
        outln!("{pid}: {already}")?;
    }
    Ok(())
}

/// The process's status.
fn status_of(pid: u32) -> Result<Status> {
    ckpt_client::status(pid)
}

/// `pause PID`, with `--release` (`Some(true)`), `--no-release` (`Some(false)`), or as
/// the process was started (`cudaw run --release-on-pause`).
fn pause_one(
    pid: u32,
    release: Option<bool>,
    lock_timeout: Option<Duration>,
    json: bool,
) -> Result<()> {
    let release = match release {
        Some(r) => r,
        None => status_of(pid)?.release_on_pause,
    };
    if !release {
        return pause_or_resume(pid, true, json);
    }
    // Held until the driver's step is done and cudaw told: a resume waits for it.
    let _sequence = ckpt_client::sequence_lock(pid);
    let driver_ready = ckpt_release::warm_up();
    let req = Request::Pause {
        progress: false,
        release_context: true,
        by: None,
    };
    let m = carried(with_bars(pid, req, json)?.pause, "result")?;
    let _ = driver_ready.join();
    let lock_ms = lock_timeout.map_or(0, |d| d.as_millis().clamp(1, u128::from(u32::MAX)) as u32);
    let started = std::time::Instant::now();
    let driver = ckpt_release::release(pid, lock_ms);
    let driver_ms = started.elapsed().as_secs_f64() * 1e3;
    let reason = match &driver {
        Ok(_) => None,
        Err(why) if !ckpt_release::driver_runs(pid) => {
            // The driver still holds the process (locked, or checkpointed: an unlock that
            // failed after a failed checkpoint). cudaw must not call the driver for it: it
            // stays released, and `resume` has the driver restore and unlock it first.
            eprintln!(
                "cudaw-ckpt: warning: --release: {why}; the driver still holds process {pid}: it stays paused with its context released, and `cudaw-ckpt resume {pid}` brings it back"
            );
            Some(why.clone())
        }
        Err(why) => {
            // Back to a plain pause: the process must not stay refusing resumes.
            if let Err(e) = request(pid, &Request::ContextKept {}, &mut |_| {}) {
                eprintln!(
                    "cudaw-ckpt: warning: telling process {pid} that its context stays on the GPU failed: {e:#}"
                );
            }
            eprintln!(
                "cudaw-ckpt: warning: --release: {why}; paused without releasing the context"
            );
            Some(why.clone())
        }
    };
    if json {
        let mut v = serde_json::to_value(m)?;
        v["released"] = serde_json::Value::Bool(driver.is_ok());
        match &driver {
            Ok(d) => {
                v["driver"] = serde_json::to_value(d)?;
                v["driver_ms"] = serde_json::json!(driver_ms);
            }
            Err(_) => v["reason"] = serde_json::json!(reason),
        }
        outln!("{v}")?;
        return Ok(());
    }
    if m.changed {
        outln!(
            "{pid}: paused: {} allocations, {} bytes ({}) evicted in {:.1} ms",
            m.allocations,
            m.bytes,
            mib(m.bytes),
            m.ms
        )?;
    } else {
        outln!("{pid}: already paused")?;
    }
    match driver {
        Ok(d) if d.already => outln!("{pid}: context already released: the GPU holds nothing of it"),
        Ok(d) => outln!(
            "{pid}: context released by the driver in {driver_ms:.1} ms (lock {:.1} ms, checkpoint {:.1} ms): the GPU holds nothing of it; `cudaw-ckpt resume {pid}` brings it back",
            d.lock_ms,
            d.checkpoint_ms
        ),
        Err(_) => outln!("{pid}: context kept on the GPU"),
    }
}

/// `resume PID`: a released process has the driver restore its context first.
fn resume_one(pid: u32, json: bool) -> Result<()> {
    if status_of(pid)?.state != State::Released {
        return pause_or_resume(pid, false, json);
    }
    // A `--release` pause under way finishes first (its driver step, then cudaw told);
    // then the state is read again (it may have kept the context).
    let _sequence = ckpt_client::sequence_lock(pid);
    if status_of(pid)?.state != State::Released {
        return pause_or_resume(pid, false, json);
    }
    let started = std::time::Instant::now();
    let d = ckpt_release::restore(pid, &[]).map_err(|why| {
        fail(
            Kind::Failed,
            format!(
                "process {pid} was paused with --release and the driver could not restore its context: {why}; it stays paused, its context with the driver"
            ),
        )
    })?;
    let driver_ms = started.elapsed().as_secs_f64() * 1e3;
    let req = Request::Resume {
        progress: false,
        context_restored: true,
    };
    let m = carried(with_bars(pid, req, json)?.resume, "result")?;
    if json {
        let mut v = serde_json::to_value(m)?;
        v["released"] = serde_json::Value::Bool(true);
        v["driver"] = serde_json::to_value(&d)?;
        v["driver_ms"] = serde_json::json!(driver_ms);
        outln!("{v}")?;
        return Ok(());
    }
    outln!(
        "{pid}: context restored by the driver in {driver_ms:.1} ms (restore {:.1} ms, unlock {:.1} ms)",
        d.restore_ms,
        d.unlock_ms
    )?;
    if m.changed {
        outln!(
            "{pid}: resumed: {} allocations, {} bytes ({}) restored in {:.1} ms",
            m.allocations,
            m.bytes,
            mib(m.bytes),
            m.ms
        )
    } else {
        outln!("{pid}: not paused; nothing to resume")
    }
}

/// Checks, before asking the process, that `path` can be an image file to write.
fn check_output(path: &Path) -> Result<()> {
    if path.file_name().is_none() {
        return Err(fail(Kind::Io, format!("{} names no file", path.display())));
    }
    if path.is_dir() {
        return Err(fail(
            Kind::Io,
            format!(
                "{} is a folder; name the image file to write",
                path.display()
            ),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(fail(
            Kind::Io,
            format!(
                "cannot write {}: {} is not a folder",
                path.display(),
                dir.display()
            ),
        )),
        Err(e) => Err(fail(
            Kind::Io,
            format!(
                "cannot write {}: the folder {}: {e}",
                path.display(),
                dir.display()
            ),
        )),
    }
}

fn dump(pid: u32, output: &Path, leave_running: bool, json: bool) -> Result<()> {
    let d = dump_one(pid, output, leave_running, false, json)?;
    if json {
        outln!("{}", serde_json::to_string(&d)?)?;
        return Ok(());
    }
    print_dumped(pid, &d)
}

/// Has `pid` write its image to `output` (created here, passed to it, renamed into place):
/// the result. Progress bars unless `quiet`.
fn dump_one(
    pid: u32,
    output: &Path,
    leave_running: bool,
    keep_shared: bool,
    quiet: bool,
) -> Result<cudaw_control::Dumped> {
    let path = absolute(output)?;
    check_output(&path)?;
    // Created here, as the user, beside the target (exclusive, no-follow, 0600); the
    // process writes into it; renamed into place once the reply says it is complete.
    let mut image = cudaw_files::NewFile::create(&path)
        .map_err(|e| ckpt_client::file_failure("create the image", &path, e))?;
    let req = Request::Dump {
        path: utf8(&path)?,
        leave_running,
        keep_shared,
        fd: true,
        progress: false,
    };
    let reply = with_bars_and_file(pid, req, Some(image.file().as_fd()), quiet)?;
    if !leave_running {
        // The process holds its memory in this file now: never removed, even if the
        // rename fails.
        image.keep();
    }
    let tmp = image.temporary();
    image.commit().map_err(|e| {
        fail(
            Kind::Io,
            format!(
                "the image is written to {}, but renaming it into place failed: {e}{}",
                tmp.display(),
                if leave_running {
                    ""
                } else {
                    " (the process holds its memory in that file: keep it)"
                }
            ),
        )
    })?;
    carried(reply.dump, "dump result")
}

fn print_dumped(pid: u32, d: &cudaw_control::Dumped) -> Result<()> {
    let paused = if d.pause.changed {
        format!(
            "paused ({} evicted in {:.1} ms), ",
            mib(d.pause.bytes),
            d.pause.ms
        )
    } else {
        String::new()
    };
    outln!(
        "{pid}: {paused}{} allocations, {} bytes ({}) written to {} ({} bytes) in {:.1} ms",
        d.allocations,
        d.bytes,
        mib(d.bytes),
        d.path,
        d.image_bytes,
        d.write_ms
    )?;
    match d.resume {
        Some(m) => outln!("{pid}: running again ({} loaded in {:.1} ms)", mib(m.bytes), m.ms)?,
        None => outln!(
            "{pid}: paused, its device memory only in {} (keep the file): `cudaw-ckpt resume {pid}` loads it back",
            d.path
        )?,
    }
    Ok(())
}

fn restore(pid: u32, input: &Path, force: bool, json: bool) -> Result<()> {
    let r = restore_one(pid, input, force, json)?;
    if json {
        outln!("{}", serde_json::to_string(&r)?)?;
        return Ok(());
    }
    print_restored(pid, &r)
}

/// Has `pid` check and load the image `input` (opened here, passed to it): the result.
/// Progress bars unless `quiet`.
fn restore_one(
    pid: u32,
    input: &Path,
    force: bool,
    quiet: bool,
) -> Result<cudaw_control::Restored> {
    let path = absolute(input)?;
    let image = ckpt_inspect::open(&path).map(drop);
    if !ckpt_client::process_exists(pid) {
        let also = match &image {
            Ok(()) => String::new(),
            Err(e) => format!(" (and the image is refused too: {e:#})"),
        };
        return Err(fail(
            Kind::NoProcess,
            format!("no process with PID {pid}: nothing to restore into{also}"),
        ));
    }
    // Opened here, as the user (a FIFO or a device refused at once), and passed to the
    // process: it reads no file the user could not.
    let file = cudaw_files::open_input(&path, cudaw_files::Follow::Yes).map_err(|e| {
        ckpt_client::file_failure("open", &path, e).context(format!("process {pid} left unchanged"))
    })?;
    // A file that is no readable image is refused before the process is asked (which
    // checks it again, and everything else, itself).
    if let Err(e) = image {
        if kind_of(&e) != Kind::Permission {
            return Err(e.context(format!("process {pid} left unchanged")));
        }
    }
    let req = Request::Restore {
        path: utf8(&path)?,
        force,
        fd: true,
        progress: false,
    };
    let reply = with_bars_and_file(pid, req, Some(file.as_fd()), quiet)?;
    carried(reply.restore, "restore result")
}

fn print_restored(pid: u32, r: &cudaw_control::Restored) -> Result<()> {
    outln!(
        "{pid}: restored {} allocations, {} bytes ({}) from {} (read once: loaded in {:.1} ms, digest checked in {:.1} ms); running",
        r.allocations,
        r.bytes,
        mib(r.bytes),
        r.path,
        r.load_ms,
        r.verify_ms
    )?;
    Ok(())
}

fn stats(pid: u32, json: bool, prometheus: bool, top: u32) -> Result<()> {
    let reply = request(pid, &Request::Stats { top: Some(top) }, &mut |_| {})?;
    let s = carried(reply.stats, "stats")?;
    if json {
        outln!("{}", serde_json::to_string(&s)?)?;
    } else if prometheus {
        out!("{}", s.to_prometheus())?;
    } else {
        out!("{pid}: {}", s.summary(top as usize))?;
    }
    Ok(())
}

fn trace(pid: u32, output: &Path, json: bool) -> Result<()> {
    let path = absolute(output)?;
    check_output(&path)?;
    let timeline = cudaw_files::NewFile::create(&path)
        .map_err(|e| ckpt_client::file_failure("create", &path, e))?;
    let req = Request::Trace {
        path: utf8(&path)?,
        fd: true,
    };
    let reply =
        ckpt_client::request_with_file(pid, &req, Some(timeline.file().as_fd()), &mut |_| {})?;
    timeline
        .commit()
        .map_err(|e| ckpt_client::file_failure("write the timeline", &path, e))?;
    let t = carried(reply.trace, "trace result")?;
    if json {
        outln!("{}", serde_json::to_string(&t)?)?;
    } else {
        let dropped = if t.dropped > 0 {
            format!(" ({} older events dropped from the ring)", t.dropped)
        } else {
            String::new()
        };
        outln!(
            "{pid}: timeline of {} events written to {} ({} bytes){dropped}; open it in Perfetto",
            t.events,
            t.path,
            t.bytes
        )?;
    }
    Ok(())
}

fn tracing(pid: u32, on: bool, json: bool) -> Result<()> {
    let reply = request(pid, &Request::Tracing { on }, &mut |_| {})?;
    let t = carried(reply.tracing, "tracing result")?;
    if json {
        outln!("{}", serde_json::to_string(&t)?)?;
    } else {
        let word = |b: bool| if b { "on" } else { "off" };
        let change = if t.was_on == t.on {
            format!("was already {}", word(t.on))
        } else {
            format!("switched {}", word(t.on))
        };
        outln!("{pid}: tracing ({}) {change}", t.mode)?;
    }
    Ok(())
}

fn print_status(s: &Status) -> Result<()> {
    outln!(
        "{}: {} ({} addressing)",
        s.pid,
        s.state.as_str(),
        s.addressing
    )?;
    if s.state == State::Released {
        outln!(
            "  context released to the driver: the GPU holds nothing of it (`cudaw-ckpt resume {}` restores it)",
            s.pid
        )?;
    }
    if let Some(img) = &s.image {
        outln!("  memory in the image {img} (resume loads it)")?;
    }
    if s.kept_host > 0 {
        outln!(
            "  host memory kept for the next pause: {} (given back to the system when it needs it; CUDAW_HOST_REUSE=off frees it at resume)",
            mib(s.kept_host)
        )?;
    }
    if s.arena > 0 || s.arena_building > 0 {
        let building = if s.arena_building > 0 {
            format!(", {} being made", mib(s.arena_building))
        } else {
            String::new()
        };
        outln!(
            "  page-locked host arena for pauses: {}{building} (CUDAW_HOST_ARENA=pinned; held while the program runs)",
            mib(s.arena)
        )?;
    }
    if s.devices.is_empty() {
        outln!("  no device memory managed yet")?;
    }
    for d in &s.devices {
        let limit = d.limit.map_or_else(|| "none".to_owned(), mib);
        let in_file = if d.in_file > 0 {
            format!(" ({} in the image)", mib(d.in_file))
        } else {
            String::new()
        };
        outln!(
            "  device {}: limit {limit}, use {}, peak {}; {} allocations, {} resident, {} evicted{in_file}, {} mapped",
            d.ordinal,
            mib(d.used),
            mib(d.peak),
            d.allocations,
            mib(d.resident),
            mib(d.evicted),
            mib(d.mapped)
        )?;
        if d.refused > 0 {
            outln!("    {} allocations refused (out of memory)", d.refused)?;
        }
        if let (Some(used), Some(cap)) = (d.node_used, d.node_capacity) {
            outln!(
                "    the GPU's processes under cudaw hold {} of its {}",
                mib(used),
                mib(cap)
            )?;
        }
    }
    Ok(())
}

fn status_one(pid: u32, json: bool) -> Result<()> {
    let reply = request(pid, &Request::Status {}, &mut |_| {})?;
    let s = carried(reply.status, "status")?;
    if json {
        outln!("{}", serde_json::to_string(&s)?)?;
    } else {
        print_status(&s)?;
    }
    Ok(())
}

/// Every `PID.sock` in `dir`, sorted by PID.
fn sockets(dir: &Path) -> Result<Vec<u32>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| cudaw_control::pid_of_socket(&e.file_name().to_string_lossy()))
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// A socket that did not answer: its PID, why, its folder, and what became of it
/// ([`ckpt_client::remove_stale_socket`]).
type Stale = (
    u32,
    String,
    PathBuf,
    std::result::Result<Option<String>, String>,
);

fn status_all(json: bool) -> Result<()> {
    let dir = ckpt_client::run_dir()?;
    let mut live = Vec::new();
    // Sockets that did not answer: (PID, why, their folder, what became of the socket).
    let mut stale: Vec<Stale> = Vec::new();
    let mut found = Vec::new();
    for d in ckpt_client::run_dirs()? {
        found.extend(sockets(&d)?.into_iter().map(|pid| (d.clone(), pid)));
    }
    for (dir, pid) in found {
        let path = cudaw_control::socket_path(&dir, pid);
        let reply = UnixStream::connect(&path)
            .map_err(anyhow::Error::from)
            .and_then(|s| ckpt_client::exchange(s, &Request::Status {}, &mut |_| {}));
        let why = match reply.map(|r| r.status) {
            Ok(Some(s)) => {
                live.push(s);
                continue;
            }
            Ok(None) => "no status in the reply".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        let removed = ckpt_client::remove_stale_socket(&dir, pid);
        stale.push((pid, why, dir, removed));
    }
    if json {
        let v = serde_json::json!({
            "processes": live,
            "stale": stale.iter().map(|(p, ..)| p).collect::<Vec<_>>(),
            "removed": stale
                .iter()
                .filter(|(.., r)| matches!(r, Ok(Some(_))))
                .map(|(p, ..)| p)
                .collect::<Vec<_>>(),
        });
        outln!("{v}")?;
    } else {
        if live.is_empty() {
            outln!("no processes under cudaw (run folder {})", dir.display())?;
        }
        for s in &live {
            print_status(s)?;
        }
    }
    for (pid, why, dir, removed) in &stale {
        let path = cudaw_control::socket_path(dir, *pid);
        match removed {
            Ok(Some(gone)) => errln!(
                "cudaw-ckpt: removed stale socket {} ({gone}; connecting: {why})",
                path.display()
            ),
            Ok(None) => errln!(
                "cudaw-ckpt: stale socket {} skipped: {why} (kept: process {pid} still runs \
                 and may be its owner)",
                path.display()
            ),
            Err(e) => errln!(
                "cudaw-ckpt: stale socket {} skipped: {why} (not removed: {e})",
                path.display()
            ),
        }
    }
    Ok(())
}
