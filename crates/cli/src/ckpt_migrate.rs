//! `cudaw-ckpt migrate PID --to GPU`: a process moved to another GPU while it runs, at the
//! same device addresses; the program never notices.
//!
//! 1. Checks first, before anything moves: the target GPU exists, is not where the process
//!    is, is the same model (the driver restores only onto the same chip), and has room in
//!    the node ledger for what the process holds there.
//! 2. `pause --release`: cudaw evicts the memory, the driver checkpoints the rest
//!    ([`ckpt_release::release`]); the GPU holds nothing of the process.
//! 3. The driver restores the context onto the target through its GPU remapping
//!    (`cuCheckpointProcessRestore`'s GPU pairs: a permutation of every GPU of the
//!    machine, the driver's rule, see [`every_gpu`]) and unlocks it. The ordinal stays; the GPU behind it
//!    changes.
//! 4. cudaw's resume: its node-ledger entry follows the ordinal to the new GPU, and every
//!    allocation comes back there at its old address.
//!
//! What fails is undone: a driver that cannot restore on the target restores where the
//! process was; cudaw's memory that does not fit on the target (a process outside cudaw
//! took it) is released again and moved back. Moved, the process runs (a paused one too:
//! migrate resumes it on its new GPU); not moved, it is as it was found (running or
//! paused), unless it exited, or the driver keeps it and the error says how to bring it
//! back.

use std::time::{Duration, Instant};

use anyhow::Result;
use cudaw_control::{DeviceStatus, Moved, Request, State, Status};
use serde::Serialize;

use crate::ckpt_client::{self, carried, fail, request, Kind};
use crate::ckpt_release::{self, Gpu};

/// One device of the process, moved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Move {
    /// The process's CUDA ordinal (unchanged).
    pub ordinal: i32,
    /// The GPU it was on (`GPU-…`).
    pub from: String,
    /// The GPU it is on now.
    pub to: String,
}

/// What a migration did, and how long each step took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Migrated {
    /// The process.
    pub pid: u32,
    /// The devices moved.
    pub moved: Vec<Move>,
    /// Bytes of cudaw's memory moved.
    pub bytes: u64,
    /// Allocations moved.
    pub allocations: u64,
    /// cudaw's eviction, in milliseconds (0 for a process already paused).
    pub pause_ms: f64,
    /// The driver's lock and checkpoint.
    pub release_ms: f64,
    /// The driver's restore onto the new GPUs and its unlock.
    pub restore_ms: f64,
    /// cudaw's memory back, on the new GPUs.
    pub resume_ms: f64,
    /// The whole migration, as the operator waits for it.
    pub total_ms: f64,
}

/// A GPU pair for the driver's restore: old UUID → new UUID.
type Pair = ([u8; 16], [u8; 16]);

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The GPUs of this machine numbered as `nvidia-smi` numbers them: the driver loaded in
/// this process with `CUDA_DEVICE_ORDER=PCI_BUS_ID` and every GPU visible.
fn machine_gpus() -> Result<Vec<Gpu>> {
    // cudaw-ckpt is single-threaded here, and the driver is not loaded yet (it reads
    // both at cuInit).
    std::env::set_var("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    std::env::remove_var("CUDA_VISIBLE_DEVICES");
    ckpt_release::gpus().map_err(|why| fail(Kind::Failed, format!("listing the GPUs: {why}")))
}

fn list(gpus: &[Gpu]) -> String {
    gpus.iter()
        .map(|g| format!("{}: {} ({})", g.index, g.text, g.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The GPU `spec` names: an index as `nvidia-smi` numbers them, or a UUID.
fn find<'a>(gpus: &'a [Gpu], spec: &str) -> Result<&'a Gpu> {
    let spec = spec.trim();
    let found = if let Ok(i) = spec.parse::<i32>() {
        gpus.iter().find(|g| g.index == i)
    } else if let Some(u) = cudaw_control::parse_uuid(spec) {
        gpus.iter().find(|g| g.uuid == u)
    } else {
        return Err(fail(
            Kind::Usage,
            format!(
                "--to {spec:?}: not a GPU index (0, 1, ...) or UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L writes it)"
            ),
        ));
    };
    found.ok_or_else(|| {
        fail(
            Kind::Usage,
            format!("--to {spec}: no such GPU; this machine has {}", list(gpus)),
        )
    })
}

/// The process's devices with the GPU behind each (status gives them).
fn process_devices(pid: u32, st: &Status) -> Result<Vec<DeviceStatus>> {
    let devices: Vec<DeviceStatus> = st
        .devices
        .iter()
        .filter(|d| !d.gpu.is_empty())
        .cloned()
        .collect();
    if devices.is_empty() {
        return Err(fail(
            Kind::Failed,
            format!(
                "process {pid} holds no memory on any GPU under cudaw (or its driver names no GPU UUID): nothing to move"
            ),
        ));
    }
    Ok(devices)
}

/// The GPU a process's device is on, from the machine's list.
fn gpu_of<'a>(d: &DeviceStatus, gpus: &'a [Gpu]) -> Result<&'a Gpu> {
    gpus.iter()
        .find(|g| g.text.eq_ignore_ascii_case(&d.gpu))
        .ok_or_else(|| {
            fail(
                Kind::Failed,
                format!(
                    "device {} is on {}, which this machine's driver does not list ({})",
                    d.ordinal,
                    d.gpu,
                    list(gpus)
                ),
            )
        })
}

fn names(devices: &[DeviceStatus]) -> String {
    devices
        .iter()
        .map(|d| d.gpu.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `OLD=NEW,...` (each an index or UUID): the moves it names, each OLD once.
fn parse_map<'a>(to: &str, gpus: &'a [Gpu]) -> Result<Vec<(&'a Gpu, &'a Gpu)>> {
    let mut wanted: Vec<(&Gpu, &Gpu)> = Vec::new();
    for item in to.split(',') {
        let (old, new) = item
            .split_once('=')
            .ok_or_else(|| fail(Kind::Usage, format!("--to {to:?}: {item:?} is not OLD=NEW")))?;
        let (old, new) = (find(gpus, old)?, find(gpus, new)?);
        if wanted.iter().any(|(o, _)| o.uuid == old.uuid) {
            return Err(fail(
                Kind::Usage,
                format!("--to {to}: GPU {} is named twice", old.index),
            ));
        }
        wanted.push((old, new));
    }
    Ok(wanted)
}

/// The moves `--to` asks for: `GPU` for a process on one GPU, else `OLD=NEW,...` (each an
/// index or UUID; OLD one of the process's GPUs). Pairs for the driver name every GPU of
/// the machine ([`every_gpu`]).
fn plan(to: &str, devices: &[DeviceStatus], gpus: &[Gpu]) -> Result<(Vec<Pair>, Vec<Move>)> {
    let wanted = if to.contains('=') {
        let wanted = parse_map(to, gpus)?;
        for (old, _) in &wanted {
            if !devices
                .iter()
                .any(|d| d.gpu.eq_ignore_ascii_case(&old.text))
            {
                return Err(fail(
                    Kind::Usage,
                    format!(
                        "--to {to}: the process is not on GPU {} ({}); it is on {}",
                        old.index,
                        old.text,
                        names(devices)
                    ),
                ));
            }
        }
        wanted
    } else {
        if devices.len() > 1 {
            return Err(fail(
                Kind::Usage,
                format!(
                    "the process is on {} GPUs ({}): say which goes where, --to OLD=NEW[,OLD=NEW]",
                    devices.len(),
                    names(devices)
                ),
            ));
        }
        vec![(gpu_of(&devices[0], gpus)?, find(gpus, to)?)]
    };
    let (pairs, moves) = pairs_for(&wanted, devices, gpus)?;
    if moves.is_empty() {
        return Err(fail(
            Kind::Usage,
            format!(
                "--to {to}: the process is already there ({}); nothing to move",
                names(devices)
            ),
        ));
    }
    Ok((pairs, moves))
}

/// The driver's pairs for one process whose devices are `devices`, and its moves, from
/// the moves `wanted` (old GPU, new GPU): every device named, onto itself where it stays.
fn pairs_for(
    wanted: &[(&Gpu, &Gpu)],
    devices: &[DeviceStatus],
    gpus: &[Gpu],
) -> Result<(Vec<Pair>, Vec<Move>)> {
    let mut pairs = Vec::new();
    let mut moves = Vec::new();
    for d in devices {
        let from = gpu_of(d, gpus)?;
        let to_gpu = wanted
            .iter()
            .find(|(o, _)| o.uuid == from.uuid)
            .map_or(from, |(_, n)| *n);
        if to_gpu.uuid != from.uuid {
            if to_gpu.capability != from.capability {
                let cc = |g: &Gpu| format!("{}.{}", g.capability.0, g.capability.1);
                return Err(fail(
                    Kind::Failed,
                    format!(
                        "GPU {} ({}, compute capability {}) is not the same chip as GPU {} ({}, compute capability {}): the driver restores a process only onto the same kind of GPU",
                        to_gpu.index,
                        to_gpu.name,
                        cc(to_gpu),
                        from.index,
                        from.name,
                        cc(from)
                    ),
                ));
            }
            moves.push(Move {
                ordinal: d.ordinal,
                from: from.text.clone(),
                to: to_gpu.text.clone(),
            });
        }
        pairs.push((from.uuid, to_gpu.uuid));
    }
    let mut targets: Vec<[u8; 16]> = pairs.iter().map(|p| p.1).collect();
    targets.sort_unstable();
    if targets.windows(2).any(|w| w[0] == w[1]) {
        return Err(fail(
            Kind::Usage,
            "two of the process's devices would share one GPU".to_owned(),
        ));
    }
    Ok((every_gpu(pairs, gpus), moves))
}

/// `pairs` completed to a permutation of every GPU of the machine. The driver checkpoints
/// every GPU of the machine, not only those the process uses or sees (on an H100 pair,
/// driver 580, a process with `CUDA_VISIBLE_DEVICES=0` restored with the one pair 0 → 1
/// got `CUDA_ERROR_INVALID_VALUE`; with 0 → 1 and 1 → 0 it moved; every GPU onto itself
/// was taken too): "it must contain every checkpointed GPU". A GPU the process does not
/// use stays itself, unless a moved device lands on it; then it takes the GPU at the start
/// of that chain of moves (the one a device left and none landed on), so that each pair
/// stays within one chip when the moves do.
fn every_gpu(mut pairs: Vec<Pair>, gpus: &[Gpu]) -> Vec<Pair> {
    let moved: Vec<Pair> = pairs.clone();
    let lands = |u: &[u8; 16]| moved.iter().find(|p| p.1 == *u).map(|p| p.0);
    for g in gpus.iter().map(|g| g.uuid) {
        if moved.iter().any(|p| p.0 == g) {
            continue;
        }
        // Back along the moves that land on it, to a GPU none lands on.
        let mut cur = g;
        for _ in 0..=moved.len() {
            match lands(&cur) {
                Some(from) => cur = from,
                None => break,
            }
        }
        pairs.push((g, cur));
    }
    pairs
}

/// Refuses, before anything moves, a target whose node ledger lacks room for what the
/// processes moving there hold on the devices that go there (`moving`: each process's
/// status and moves; a job's ranks are summed per target).
fn check_room(moving: &[(u32, &Status, &[Move])], gpus: &[Gpu]) -> Result<()> {
    // Target GPU -> (bytes wanted, who); GPU -> bytes the processes moving away free there
    // (a job's ranks swapping GPUs make room for each other).
    let mut wanted: std::collections::BTreeMap<String, (u64, Vec<String>)> = Default::default();
    let mut freed: std::collections::BTreeMap<String, u64> = Default::default();
    let mut dir = None;
    for (pid, st, moves) in moving {
        let Some(d) = &st.node_dir else { continue };
        dir = Some(d.clone());
        for m in moves.iter() {
            let Some(d) = st.devices.iter().find(|d| d.ordinal == m.ordinal) else {
                continue;
            };
            // A paused process holds nothing against its budget: what it will ask for is
            // its evicted memory.
            let need = d.used.max(d.resident + d.evicted);
            *freed.entry(m.from.clone()).or_default() += d.used;
            let w = wanted.entry(m.to.clone()).or_default();
            w.0 += need;
            w.1.push(format!(
                "process {pid} holds {} on its device {}",
                gib(need),
                d.ordinal
            ));
        }
    }
    let Some(dir) = dir else { return Ok(()) };
    for (to, (need, who)) in wanted {
        let Some(g) = gpus.iter().find(|g| g.text == to) else {
            continue;
        };
        let view = cudaw_ledger::ledger::read(std::path::Path::new(&dir), &to, g.total)
            .map_err(|e| {
                fail(
                    Kind::Failed,
                    format!(
                        "the node ledger of GPU {} ({to}) cannot be read ({e}); not moving onto a card whose use is unknown",
                        g.index
                    ),
                )
            })?;
        let room = view.available() + freed.get(&to).copied().unwrap_or(0);
        if need > room {
            return Err(fail(
                Kind::Failed,
                format!(
                    "GPU {} ({to}) has {} free in the node ledger ({} of {} held by {} process(es) under cudaw, counting what the processes moving away leave); {}: not moved",
                    g.index,
                    gib(room),
                    gib(view.used()),
                    gib(view.capacity),
                    view.entries.len(),
                    who.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Test builds only: whether `CUDAW_CKPT_FAULT` asks for the fault `at` —
/// `skip-room-check` (a target that had room when checked and has none when the memory
/// comes) or `kill-after-release` (a process that exits mid-migration).
fn fault(at: &str) -> bool {
    cfg!(debug_assertions) && std::env::var("CUDAW_CKPT_FAULT").is_ok_and(|v| v == at)
}

/// Kills `pid` and waits for it to be gone (the `kill-after-release` fault).
fn kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    for _ in 0..500 {
        if !ckpt_client::process_exists(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Says, on a terminal, which step runs.
struct Steps {
    on: bool,
}

impl Steps {
    fn say(&self, what: std::fmt::Arguments<'_>) {
        if self.on {
            eprintln!("cudaw-ckpt: {what}");
        }
    }
}

/// Why a process that left mid-way cannot be moved.
fn gone_or(pid: u32, why: String) -> anyhow::Error {
    if ckpt_client::process_exists(pid) {
        fail(Kind::Failed, why)
    } else {
        fail(
            Kind::Failed,
            format!("process {pid} exited during the migration ({why}); nothing is left to move"),
        )
    }
}

/// Resumes a released process where the driver put it back; the error for people.
fn resume_released(pid: u32) -> Result<Moved, String> {
    let req = Request::Resume {
        progress: false,
        context_restored: true,
    };
    request(pid, &req, &mut |_| {})
        .map_err(|e| format!("{e:#}"))
        .and_then(|r| carried(r.resume, "result").map_err(|e| format!("{e:#}")))
}

/// After a migration failed, with the process's context on the GPU where it was (kept,
/// or restored there by the driver): the process as it was found — running again, or
/// paused. What it is now, for the error; or why it could not be settled.
fn settle(pid: u32, was_running: bool) -> Result<&'static str, String> {
    request(pid, &Request::ContextKept {}, &mut |_| {}).map_err(|e| format!("{e:#}"))?;
    if !was_running {
        return Ok("it stays paused where it was");
    }
    let req = Request::Resume {
        progress: false,
        context_restored: false,
    };
    request(pid, &req, &mut |_| {}).map_err(|e| format!("{e:#}"))?;
    Ok("it runs where it was")
}

/// Pause with the context released: cudaw's eviction, then the driver's checkpoint.
/// Returns (pause ms, release ms); on failure the process is as it was found.
fn release(pid: u32, lock_ms: u32, was_running: bool, steps: &Steps) -> Result<(Moved, f64)> {
    steps.say(format_args!("{pid}: pausing (cudaw evicts its memory)"));
    let req = Request::Pause {
        progress: false,
        release_context: true,
        by: None,
    };
    let paused = carried(request(pid, &req, &mut |_| {})?.pause, "result")?;
    steps.say(format_args!("{pid}: the driver checkpoints its context"));
    let t = Instant::now();
    match ckpt_release::release(pid, lock_ms) {
        Ok(_) => Ok((paused, ms(t))),
        Err(why) if !ckpt_release::driver_runs(pid) => Err(gone_or(
            pid,
            format!(
                "not moved: {why}; the driver still holds process {pid}: `cudaw-ckpt resume {pid}` brings it back where it was"
            ),
        )),
        Err(why) => {
            let state = match settle(pid, was_running) {
                Ok(s) => s.to_owned(),
                Err(e) => format!("resuming it failed too ({e}): `cudaw-ckpt resume {pid}`"),
            };
            Err(gone_or(pid, format!("not moved: {why}; {state}")))
        }
    }
}

/// `cudaw-ckpt migrate PID --to GPU`.
pub fn migrate(pid: u32, to: &str, lock_timeout: Option<Duration>, json: bool) -> Result<()> {
    let started = Instant::now();
    let steps = Steps {
        on: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    // Held from the first look to the end: a `resume`, a `pause --release` or another
    // migration of the process waits for this one (and plans from what it left).
    let _sequence = ckpt_client::sequence_lock(pid);
    let st = ckpt_client::status(pid)?;
    let devices = process_devices(pid, &st)?;
    let gpus = machine_gpus()?;
    let (pairs, moves) = plan(to, &devices, &gpus)?;
    if !fault("skip-room-check") {
        check_room(&[(pid, &st, &moves)], &gpus)?;
    }
    let lock_ms = lock_timeout.map_or(0, |d| d.as_millis().clamp(1, u128::from(u32::MAX)) as u32);
    let was_running = matches!(st.state, State::Running | State::Held);
    // Released already: the driver's step still runs (it leaves a checkpointed process as
    // it is, and checkpoints one a stopped command left locked or running).
    let (paused, release_ms) = release(pid, lock_ms, was_running, &steps)?;
    if fault("kill-after-release") {
        kill(pid);
    }
    let targets = moves
        .iter()
        .map(|m| m.to.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    steps.say(format_args!(
        "{pid}: the driver restores its context on {targets}"
    ));
    let t = Instant::now();
    if let Err(why) = ckpt_release::restore(pid, &pairs) {
        if !ckpt_client::process_exists(pid) {
            return Err(gone_or(pid, why));
        }
        let back = ckpt_release::restore(pid, &[]).and_then(|_| settle(pid, was_running));
        return Err(fail(
            Kind::Failed,
            match back {
                Ok(state) => format!(
                    "not moved: the driver could not restore process {pid} on {targets}: {why}; {state}"
                ),
                Err(e) => format!(
                    "not moved: the driver could not restore process {pid} on {targets}: {why}; and bringing it back where it was failed ({e}): `cudaw-ckpt resume {pid}` tries again"
                ),
            },
        ));
    }
    let restore_ms = ms(t);
    steps.say(format_args!(
        "{pid}: cudaw restores its memory on {targets}"
    ));
    let t = Instant::now();
    let resumed = match resume_released(pid) {
        Ok(m) => m,
        Err(why) => return Err(move_back(pid, &pairs, lock_ms, was_running, &why)),
    };
    let resume_ms = ms(t);
    // Where the process is now, by its own account: a move reported is a move made.
    let now = ckpt_client::status(pid)?;
    for m in &moves {
        let at = now.devices.iter().find(|d| d.ordinal == m.ordinal);
        if at.is_none_or(|d| !d.gpu.eq_ignore_ascii_case(&m.to)) {
            return Err(fail(
                Kind::Failed,
                format!(
                    "process {pid} runs, but its device {} is on {}, not {}: the driver did not move it",
                    m.ordinal,
                    at.map_or("no GPU", |d| d.gpu.as_str()),
                    m.to
                ),
            ));
        }
    }
    let done = Migrated {
        pid,
        moved: moves,
        bytes: resumed.bytes.max(paused.bytes),
        allocations: resumed.allocations.max(paused.allocations),
        pause_ms: paused.ms,
        release_ms,
        restore_ms,
        resume_ms,
        total_ms: ms(started),
    };
    if json {
        outln!("{}", serde_json::to_string(&done)?)?;
        return Ok(());
    }
    for m in &done.moved {
        outln!(
            "{pid}: device {} moved from {} to {}",
            m.ordinal,
            m.from,
            m.to
        )?;
    }
    outln!(
        "{pid}: {} allocations, {} ({} bytes) moved in {:.1} ms (pause {:.1}, driver checkpoint {:.1}, driver restore {:.1}, resume {:.1})",
        done.allocations,
        gib(done.bytes),
        done.bytes,
        done.total_ms,
        done.pause_ms,
        done.release_ms,
        done.restore_ms,
        done.resume_ms
    )
}

/// cudaw's memory did not come back on the new GPUs (the node ledger refused, or the card
/// is full): the process, paused with its context on the new GPUs, is released again and
/// restored where it was. The error says what happened.
fn move_back(
    pid: u32,
    pairs: &[Pair],
    lock_ms: u32,
    was_running: bool,
    why: &str,
) -> anyhow::Error {
    let back: Vec<Pair> = pairs.iter().map(|(o, n)| (*n, *o)).collect();
    let undone = request(
        pid,
        &Request::Pause {
            progress: false,
            release_context: true,
            by: None,
        },
        &mut |_| {},
    )
    .map_err(|e| format!("{e:#}"))
    .and_then(|_| ckpt_release::release(pid, lock_ms))
    .and_then(|_| ckpt_release::restore(pid, &back))
    .and_then(|_| settle(pid, was_running));
    match undone {
        Ok(state) => fail(
            Kind::Failed,
            format!("not moved: cudaw's memory did not come back on the new GPU ({why}); the process was moved back: {state}"),
        ),
        Err(e) => gone_or(
            pid,
            format!(
                "not moved: cudaw's memory did not come back on the new GPU ({why}); moving it back failed too ({e}): it is paused; `cudaw-ckpt status {pid}` says where, `cudaw-ckpt resume {pid}` tries again"
            ),
        ),
    }
}

/// What a job's migration did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobMigrated {
    /// The launcher.
    pub root: u32,
    /// Each member's moves.
    pub members: Vec<MemberMigrated>,
    /// Bytes of cudaw's memory moved, over all members.
    pub bytes: u64,
    /// The job pause (every member at rest at once, its shared memory evicted).
    pub pause_ms: f64,
    /// The driver's lock and checkpoint of every member (at once).
    pub release_ms: f64,
    /// The driver's restores onto the new GPUs and unlocks (at once).
    pub restore_ms: f64,
    /// The job resume on the new GPUs (shared memory made again, then every member).
    pub resume_ms: f64,
    /// The whole migration.
    pub total_ms: f64,
}

/// One member of a job, moved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberMigrated {
    /// The process.
    pub pid: u32,
    /// Its devices moved.
    pub moved: Vec<Move>,
}

/// Brings every member of a job whose migration failed part-way back where it was and
/// resumes the job: `on_new` are the members the driver restored onto their new GPUs
/// (with their pairs), `checkpointed` those it holds checkpointed. What could not be
/// undone is returned, for the error.
fn job_home(
    job: &crate::ckpt_job::Job,
    on_new: &[(u32, Vec<Pair>)],
    checkpointed: &[u32],
    lock_ms: u32,
    was_running: bool,
) -> Vec<String> {
    let mut left = Vec::new();
    let back = crate::ckpt_job::each(checkpointed, |p| {
        ckpt_release::restore(p, &[]).map_err(|e| fail(Kind::Failed, e))
    });
    let moved_pids: Vec<u32> = on_new.iter().map(|(p, _)| *p).collect();
    let undone = crate::ckpt_job::each(&moved_pids, |p| {
        let pairs = &on_new.iter().find(|(q, _)| *q == p).expect("listed").1;
        let reverse: Vec<Pair> = pairs.iter().map(|(o, n)| (*n, *o)).collect();
        request(p, &Request::ContextKept {}, &mut |_| {})?;
        request(
            p,
            &Request::Pause {
                progress: false,
                release_context: true,
                by: None,
            },
            &mut |_| {},
        )?;
        ckpt_release::release(p, lock_ms)
            .and_then(|_| ckpt_release::restore(p, &reverse))
            .map_err(|e| fail(Kind::Failed, e))
    });
    for (p, r) in back.into_iter().chain(undone) {
        if let Err(e) = r {
            left.push(format!("process {p}: {e:#}"));
        }
    }
    // A process the driver still holds must not be told its context is back: its next
    // driver call would wait for ever. It stays released; `resume` restores it.
    let (runs, held): (Vec<u32>, Vec<u32>) = job
        .members
        .iter()
        .filter(|&&p| ckpt_client::process_exists(p))
        .partition(|&&p| ckpt_release::driver_runs(p));
    for p in held {
        left.push(format!(
            "process {p}: the driver still holds it (released): `cudaw-ckpt resume {p}`"
        ));
    }
    let kept = crate::ckpt_job::each(&runs, |p| request(p, &Request::ContextKept {}, &mut |_| {}));
    left.extend(
        kept.into_iter()
            .filter_map(|(p, r)| r.err().map(|e| format!("process {p}: {e:#}"))),
    );
    // As it was found: a job found paused stays paused (its memory comes back with
    // `resume --job`).
    if was_running {
        if let Err(e) = crate::ckpt_job::resume(job) {
            left.push(format!("resuming the job: {e:#}"));
        }
    }
    left
}

fn job_failed(what: String, left: Vec<String>, was_running: bool) -> anyhow::Error {
    let state = if was_running {
        "the job runs where it was"
    } else {
        "the job stays paused where it was"
    };
    fail(
        Kind::Failed,
        if left.is_empty() {
            format!("not moved: {what}; {state}")
        } else {
            format!(
                "not moved: {what}; bringing the job back where it was failed in part ({}): `cudaw-ckpt status --job` says where each is",
                left.join("; ")
            )
        },
    )
}

/// `cudaw-ckpt migrate ROOT --job --to ...`: every process of the job moved together —
/// `OLD=NEW,...` for the job's GPUs, or `NEW,NEW,...` onto the job's GPUs in their order.
pub fn migrate_job(
    root: u32,
    to: &str,
    timeout: Option<Duration>,
    lock_timeout: Option<Duration>,
    json: bool,
) -> Result<()> {
    let started = Instant::now();
    let steps = Steps {
        on: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let job = crate::ckpt_job::find(root)?;
    if let Some(n) = &job.note {
        eprintln!("cudaw-ckpt: note: {n}");
    }
    // Every member's sequence lock, in PID order, for the whole migration: a `resume`
    // of one rank waits for it.
    let _locks: Vec<_> = job
        .members
        .iter()
        .map(|&p| ckpt_client::sequence_lock(p))
        .collect();
    let statuses: Vec<(u32, Status)> = job
        .members
        .iter()
        .map(|&p| ckpt_client::status(p).map(|s| (p, s)))
        .collect::<Result<_>>()?;
    // The members with something on a GPU move; the others (a launcher that imports
    // CUDA's libraries and never uses a GPU) are paused and resumed with the job only.
    let was_running = statuses
        .iter()
        .all(|(_, st)| matches!(st.state, State::Running | State::Held));
    let statuses: Vec<(u32, Status)> = {
        // Idle: no device at all (a device whose GPU the driver does not name is refused
        // below, as before).
        let (on_gpu, idle): (Vec<_>, Vec<_>) = statuses
            .into_iter()
            .partition(|(_, st)| !st.devices.is_empty());
        if on_gpu.is_empty() {
            return Err(fail(
                Kind::Failed,
                format!(
                    "no process of job {root} holds memory on a GPU under cudaw (or its driver names no GPU UUID): nothing to move"
                ),
            ));
        }
        for (p, _) in &idle {
            eprintln!("cudaw-ckpt: note: process {p} of the job uses no GPU: it is paused and resumed with the job, nothing of it moves");
        }
        on_gpu
    };
    let movers: Vec<u32> = statuses.iter().map(|(p, _)| *p).collect();
    let gpus = machine_gpus()?;
    let mut job_gpus: Vec<&Gpu> = Vec::new();
    for (p, st) in &statuses {
        for d in process_devices(*p, st)? {
            let g = gpu_of(&d, &gpus)?;
            if !job_gpus.iter().any(|j| j.uuid == g.uuid) {
                job_gpus.push(g);
            }
        }
    }
    job_gpus.sort_by_key(|g| g.index);
    let wanted: Vec<(&Gpu, &Gpu)> = if to.contains('=') {
        let wanted = parse_map(to, &gpus)?;
        if let Some((old, _)) = wanted
            .iter()
            .find(|(o, _)| !job_gpus.iter().any(|j| j.uuid == o.uuid))
        {
            return Err(fail(
                Kind::Usage,
                format!(
                    "--to {to}: the job is not on GPU {} ({}); it is on {}",
                    old.index,
                    old.text,
                    job_gpus
                        .iter()
                        .map(|g| g.index.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        wanted
    } else {
        let new: Vec<&Gpu> = to
            .split(',')
            .map(|t| find(&gpus, t))
            .collect::<Result<_>>()?;
        if new.len() != job_gpus.len() {
            return Err(fail(
                Kind::Usage,
                format!(
                    "--to {to}: the job is on {} GPUs ({}): name as many, in that order, or OLD=NEW for each that moves",
                    job_gpus.len(),
                    job_gpus.iter().map(|g| g.index.to_string()).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        job_gpus.iter().copied().zip(new).collect()
    };
    let mut plans: Vec<(u32, Vec<Pair>, Vec<Move>)> = Vec::new();
    for (p, st) in &statuses {
        let (pairs, moves) = pairs_for(&wanted, &process_devices(*p, st)?, &gpus)
            .map_err(|e| fail(ckpt_client::kind_of(&e), format!("process {p}: {e:#}")))?;
        plans.push((*p, pairs, moves));
    }
    // Two members onto one GPU is what a job may do (ranks sharing a GPU); the driver
    // decides. Nothing to move at all is refused.
    if plans.iter().all(|(_, _, m)| m.is_empty()) {
        return Err(fail(
            Kind::Usage,
            format!("--to {to}: the job is already there; nothing to move"),
        ));
    }
    if !fault("skip-room-check") {
        let moving: Vec<(u32, &Status, &[Move])> = plans
            .iter()
            .zip(&statuses)
            .map(|((p, _, m), (_, st))| (*p, st, m.as_slice()))
            .collect();
        check_room(&moving, &gpus)?;
    }
    let lock_ms = lock_timeout.map_or(0, |d| d.as_millis().clamp(1, u128::from(u32::MAX)) as u32);
    steps.say(format_args!("job {root}: pausing every process together"));
    let paused = crate::ckpt_job::pause(&job, timeout, true)?;
    let pause_ms = paused.ms;
    if let Some(why) = paused.shared.as_ref().and_then(|s| s.error.clone()) {
        let left = if was_running {
            crate::ckpt_job::resume(&job)
                .err()
                .map(|e| vec![format!("{e:#}")])
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        return Err(job_failed(
            format!("the memory the processes share stayed on the device ({why}), and the driver cannot checkpoint it"), left, was_running));
    }
    steps.say(format_args!(
        "job {root}: the driver checkpoints every process"
    ));
    let t = Instant::now();
    let released = crate::ckpt_job::each(&movers, |p| {
        request(
            p,
            &Request::Pause {
                progress: false,
                release_context: true,
                by: None,
            },
            &mut |_| {},
        )?;
        ckpt_release::release(p, lock_ms).map_err(|e| fail(Kind::Failed, e))
    });
    let release_ms = ms(t);
    if let Some((p, e)) = released
        .iter()
        .find_map(|(p, r)| r.as_ref().err().map(|e| (p, e)))
    {
        let held: Vec<u32> = released
            .iter()
            .filter(|(p, r)| r.is_ok() || !ckpt_release::driver_runs(*p))
            .map(|(p, _)| *p)
            .collect();
        let left = job_home(&job, &[], &held, lock_ms, was_running);
        return Err(job_failed(format!("process {p}: {e:#}"), left, was_running));
    }
    if fault("kill-after-release") {
        kill(job.members[0]);
    }
    steps.say(format_args!(
        "job {root}: the driver restores every process on its new GPUs"
    ));
    let t = Instant::now();
    let restored = crate::ckpt_job::each(&movers, |p| {
        let pairs = &plans.iter().find(|(q, _, _)| *q == p).expect("planned").1;
        ckpt_release::restore(p, pairs).map_err(|e| fail(Kind::Failed, e))
    });
    let restore_ms = ms(t);
    if let Some((p, e)) = restored
        .iter()
        .find_map(|(p, r)| r.as_ref().err().map(|e| (p, e)))
    {
        let mut what = format!("process {p}: {e:#}");
        let dead: Vec<String> = job
            .members
            .iter()
            .filter(|&&m| !ckpt_client::process_exists(m))
            .map(|m| m.to_string())
            .collect();
        if !dead.is_empty() {
            what = format!(
                "process(es) {} exited during the migration ({what})",
                dead.join(", ")
            );
        }
        let on_new: Vec<(u32, Vec<Pair>)> = restored
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(p, _)| {
                (
                    *p,
                    plans
                        .iter()
                        .find(|(q, _, _)| q == p)
                        .expect("planned")
                        .1
                        .clone(),
                )
            })
            .collect();
        let failed: Vec<u32> = restored
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(p, _)| *p)
            .collect();
        let left = job_home(&job, &on_new, &failed, lock_ms, was_running);
        return Err(job_failed(what, left, was_running));
    }
    steps.say(format_args!(
        "job {root}: cudaw restores the memory on the new GPUs"
    ));
    let t = Instant::now();
    let kept = crate::ckpt_job::each(&movers, |p| {
        request(p, &Request::ContextKept {}, &mut |_| {})
    });
    let resumed = match kept
        .iter()
        .find_map(|(p, r)| r.as_ref().err().map(|e| (p, e)))
    {
        Some((p, e)) => Err(format!("process {p}: {e:#}")),
        None => crate::ckpt_job::resume(&job).map_err(|e| format!("{e:#}")),
    };
    let members = match resumed {
        Ok(m) => m,
        Err(what) => {
            let on_new: Vec<(u32, Vec<Pair>)> = plans
                .iter()
                .map(|(p, pairs, _)| (*p, pairs.clone()))
                .collect();
            // Ranks the resume let go run again: the job is paused as one first (their
            // shared memory evicted), so that the driver can checkpoint each.
            let mut left = Vec::new();
            if let Err(e) = crate::ckpt_job::pause(&job, timeout, true) {
                left.push(format!("pausing the job again: {e:#}"));
            }
            left.extend(job_home(&job, &on_new, &[], lock_ms, was_running));
            return Err(job_failed(
                format!("the job did not resume on the new GPUs: {what}"),
                left,
                was_running,
            ));
        }
    };
    let resume_ms = ms(t);
    let done = JobMigrated {
        root: job.root,
        bytes: members.iter().map(|m| m.moved.bytes).sum(),
        members: plans
            .into_iter()
            .map(|(pid, _, moved)| MemberMigrated { pid, moved })
            .collect(),
        pause_ms,
        release_ms,
        restore_ms,
        resume_ms,
        total_ms: ms(started),
    };
    if json {
        outln!("{}", serde_json::to_string(&done)?)?;
        return Ok(());
    }
    for m in &done.members {
        for d in &m.moved {
            outln!(
                "{}: device {} moved from {} to {}",
                m.pid,
                d.ordinal,
                d.from,
                d.to
            )?;
        }
    }
    outln!(
        "job {}: {} processes, {} moved in {:.1} ms (pause {:.1}, driver checkpoint {:.1}, driver restore {:.1}, resume {:.1})",
        done.root,
        done.members.len(),
        gib(done.bytes),
        done.total_ms,
        done.pause_ms,
        done.release_ms,
        done.restore_ms,
        done.resume_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: i32) -> Vec<Gpu> {
        (0..n)
            .map(|i| {
                let mut uuid = [0u8; 16];
                uuid[15] = i as u8 + 1;
                Gpu {
                    index: i,
                    uuid,
                    text: cudaw_control::uuid_text(&uuid),
                    name: "H100".into(),
                    total: 80 << 30,
                    capability: (9, 0),
                }
            })
            .collect()
    }

    fn on(g: &[Gpu], which: &[usize]) -> Vec<DeviceStatus> {
        which
            .iter()
            .enumerate()
            .map(|(ordinal, &i)| DeviceStatus {
                ordinal: ordinal as i32,
                gpu: g[i].text.clone(),
                ..DeviceStatus::default()
            })
            .collect()
    }

    fn refusal(to: &str, devices: &[DeviceStatus], g: &[Gpu]) -> String {
        format!("{:#}", plan(to, devices, g).unwrap_err())
    }

    #[test]
    fn a_process_on_several_gpus_names_each_move_and_the_pairs_name_every_gpu() {
        let g = gpus(4);
        let d = on(&g, &[0, 1]);
        let u = |i: usize| g[i].uuid;
        let (pairs, moves) = plan("0=2,1=3", &d, &g).unwrap();
        // Every GPU of the machine is named: 2 and 3 take the two that 0 and 1 left.
        assert_eq!(
            pairs,
            vec![(u(0), u(2)), (u(1), u(3)), (u(2), u(0)), (u(3), u(1))]
        );
        assert_eq!(moves.len(), 2);
        // One moves, the other stays: the pairs still name it, onto itself.
        let (pairs, moves) = plan("1=3", &d, &g).unwrap();
        assert_eq!(
            pairs,
            vec![(u(0), u(0)), (u(1), u(3)), (u(2), u(2)), (u(3), u(1))]
        );
        assert_eq!(moves[0].ordinal, 1);
        // Moves between chips' pairs: each GPU landed on takes the one its chain left.
        let mut mixed = gpus(4);
        mixed[1].capability = (8, 0);
        mixed[2].capability = (8, 0);
        let m = |i: usize| mixed[i].uuid;
        let (pairs, _) = plan("0=3,1=2", &on(&mixed, &[0, 1]), &mixed).unwrap();
        assert_eq!(
            pairs,
            vec![(m(0), m(3)), (m(1), m(2)), (m(2), m(1)), (m(3), m(0))]
        );
        // A chain: 0 -> 1 -> 2; GPU 2 takes 0, GPU 3 stays.
        let (pairs, _) = plan("0=1,1=2", &d, &g).unwrap();
        assert_eq!(
            pairs,
            vec![(u(0), u(1)), (u(1), u(2)), (u(2), u(0)), (u(3), u(3))]
        );
        // A process on one GPU of two, moved: the two swap (what the driver took).
        let two = gpus(2);
        let (pairs, _) = plan("1", &on(&two, &[0]), &two).unwrap();
        assert_eq!(
            pairs,
            vec![(two[0].uuid, two[1].uuid), (two[1].uuid, two[0].uuid)]
        );
        // A swap is two distinct GPUs.
        assert!(plan("0=1,1=0", &d, &g).is_ok());
        // Refused: a bare GPU for two devices, two onto one, a GPU of another chip.
        assert!(refusal("2", &d, &g).contains("say which goes where"));
        assert!(refusal("0=1", &d, &g).contains("would share one GPU"));
        let mut other = gpus(4);
        other[3].capability = (8, 0);
        assert!(refusal("1=3", &on(&other, &[0, 1]), &other).contains("not the same chip"));
    }
}
