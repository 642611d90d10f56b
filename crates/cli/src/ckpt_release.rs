//! `cudaw-ckpt pause PID --release` and the resume of a released process: the driver's
//! half. cudaw evicts the memory first (fast); then the driver's process checkpoint
//! (`cuCheckpointProcessLock` + `cuCheckpointProcessCheckpoint`, which NVIDIA's API
//! requires to be called from another process: this one) takes what is left — the
//! context, modules, streams — so the GPU holds nothing of the process. Resume reverses
//! it: the driver's restore and unlock, then cudaw's resume. The driver is `libcuda.so.1`
//! (`$CUDAW_LIBCUDA` names another), loaded here; its calls go through the typed wrapper
//! of the `driver` crate ([`driver::checkpoint`]).

use std::time::Instant;

use driver::checkpoint::{CheckpointApi, ProcessState};
use driver::{Driver, DriverError, LibCuda};
use serde::Serialize;

/// What the driver's half of a `--release` pause did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DriverPause {
    /// `cuCheckpointProcessLock`, in milliseconds.
    pub lock_ms: f64,
    /// `cuCheckpointProcessCheckpoint`, in milliseconds.
    pub checkpoint_ms: f64,
    /// The driver had it checkpointed already (a second `pause --release`).
    pub already: bool,
    /// `cuInit` in `cudaw-ckpt` when the release called it, in milliseconds (after the
    /// warm-up thread's, which ran while cudaw evicted: a second one is quick).
    pub init_ms: f64,
}

/// What the driver's half of resuming a released process did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DriverResume {
    /// `cuCheckpointProcessRestore`, in milliseconds (0 when the driver had it locked
    /// only).
    pub restore_ms: f64,
    /// `cuCheckpointProcessUnlock`, in milliseconds.
    pub unlock_ms: f64,
    /// The driver's state of the process before: `checkpointed`, `locked` or `running`.
    pub found: &'static str,
    /// `cuInit` in `cudaw-ckpt`, in milliseconds (part of the resume's wait).
    pub init_ms: f64,
}

/// The driver, loaded and initialised, with its checkpoint API; the reason (for people)
/// when it has none.
struct Loaded {
    cuda: LibCuda,
    /// Milliseconds `cuInit` took here. A released process's resume spent 342 ms of its
    /// 646 ms driver step outside the restore and unlock on the H100 pair (the pause's
    /// checkpoint step 45 ms): reported (`init_ms`) to see whether `cuInit` is that time.
    /// It is always called: NVIDIA documents that a restore needs persistence mode or
    /// `cuInit` without saying what fails otherwise, and a failed restore may leave the
    /// process unrestorable (cuda-checkpoint issue 44).
    init_ms: f64,
}

fn load() -> Result<Loaded, String> {
    let cuda = LibCuda::open().map_err(|e| format!("the CUDA driver cannot be loaded ({e})"))?;
    let t = Instant::now();
    cuda.init()
        .map_err(|e| format!("the CUDA driver did not initialise ({e})"))?;
    Ok(Loaded {
        cuda,
        init_ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

impl Loaded {
    fn api(&self) -> Result<CheckpointApi<'_>, String> {
        CheckpointApi::load(&self.cuda).map_err(|e| {
            format!(
                "the driver has no cuCheckpointProcess* (driver 550 or later needed; {})",
                e.name
            )
        })
    }
}

/// Loads and initialises the driver on a thread of its own, for a `--release` to find it
/// ready: `cuInit` in `cudaw-ckpt` may take hundreds of milliseconds (to be measured:
/// `init_ms`), which the caller overlaps with cudaw's eviction (the driver's checkpoint can start only after
/// it). What fails is said again, and acted on, by the [`release`] that follows.
pub fn warm_up() -> std::thread::JoinHandle<()> {
    std::thread::spawn(|| {
        // Kept loaded (cudaw-ckpt ends soon): dropped, the library could be unloaded and
        // the next load would initialise it again.
        if let Ok(loaded) = load() {
            std::mem::forget(loaded);
        }
    })
}

/// Whether the driver has process `pid` running (not locked, not checkpointed): `true`
/// too where the driver lacks the API or cannot say (it never touched the process then).
pub fn driver_runs(pid: u32) -> bool {
    let Ok(loaded) = load() else { return true };
    let Ok(api) = loaded.api() else { return true };
    !matches!(
        api.state(pid),
        Ok(ProcessState::Locked) | Ok(ProcessState::Checkpointed)
    )
}

/// Says why a driver call failed, with what the operator can do about it.
fn reason(e: &DriverError, pid: u32, lock_timeout_ms: u32) -> String {
    let what = format!("{} returned {} ({})", e.call, e.name, e.code);
    match e.name.as_str() {
        "CUDA_ERROR_NOT_PERMITTED" => format!(
            "the driver refused: {what}; its checkpoint may need root, persistence mode \
             (nvidia-smi -pm 1), or the same user as process {pid}"
        ),
        "CUDA_ERROR_NOT_SUPPORTED" => format!(
            "the driver cannot checkpoint process {pid}: {what} (memory shared with other \
             processes, IPC or a GPU the driver's checkpoint does not support)"
        ),
        "CUDA_ERROR_NOT_READY" => format!(
            "the driver could not lock process {pid} within {lock_timeout_ms} ms: {what} \
             (a CUDA call of the program's own, outside cudaw's gate, did not return)"
        ),
        _ => what,
    }
}

/// The driver's half of `pause --release`, once cudaw has paused the process (its gate
/// closed, none of its threads inside the driver): lock (waiting up to `lock_timeout_ms`,
/// 0 for ever) and checkpoint. A process the driver already holds checkpointed is left as
/// it is. On failure nothing of the driver's is left behind (a lock taken is undone); the
/// error is the reason, for people.
pub fn release(pid: u32, lock_timeout_ms: u32) -> Result<DriverPause, String> {
    let loaded = load()?;
    let api = loaded.api()?;
    let state = api
        .state(pid)
        .map_err(|e| reason(&e, pid, lock_timeout_ms))?;
    let mut done = DriverPause::default();
    match state {
        ProcessState::Checkpointed => {
            done.already = true;
            return Ok(done);
        }
        ProcessState::Running => {
            let t = Instant::now();
            api.lock(pid, lock_timeout_ms)
                .map_err(|e| reason(&e, pid, lock_timeout_ms))?;
            done.lock_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        // Locked by an earlier `--release` that stopped before its checkpoint.
        ProcessState::Locked => {}
        other => {
            return Err(format!(
                "the driver has process {pid} in state {other:?}; not checkpointing it"
            ))
        }
    }
    let t = Instant::now();
    if let Err(e) = api.checkpoint(pid) {
        let why = reason(&e, pid, lock_timeout_ms);
        return Err(match api.unlock(pid) {
            Ok(()) => why,
            Err(u) => format!(
                "{why}; and unlocking it again failed ({u}): its CUDA calls may wait until \
                 `cudaw-ckpt resume {pid}`"
            ),
        });
    }
    done.checkpoint_ms = t.elapsed().as_secs_f64() * 1e3;
    done.init_ms = loaded.init_ms;
    Ok(done)
}

/// The driver's half of resuming a released process, before cudaw's resume: restore (when
/// checkpointed; onto other GPUs by `pairs`, old UUID → new UUID, which must then name
/// every GPU the process was checkpointed on) and unlock (when locked). The error says
/// what failed; the process is then left released (paused, its context with the driver).
pub fn restore(pid: u32, pairs: &[([u8; 16], [u8; 16])]) -> Result<DriverResume, String> {
    let loaded = load()?;
    let api = loaded.api()?;
    let state = api.state(pid).map_err(|e| reason(&e, pid, 0))?;
    let mut done = DriverResume {
        found: match state {
            ProcessState::Checkpointed => "checkpointed",
            ProcessState::Locked => "locked",
            ProcessState::Running => "running",
            _ => "other",
        },
        ..DriverResume::default()
    };
    if !pairs.is_empty() && state != ProcessState::Checkpointed {
        return Err(format!(
            "the driver has process {pid} {}, not checkpointed: it cannot be restored onto other GPUs",
            done.found
        ));
    }
    match state {
        ProcessState::Running => return Ok(done),
        ProcessState::Checkpointed => {
            let t = Instant::now();
            api.restore(pid, pairs).map_err(|e| reason(&e, pid, 0))?;
            done.restore_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        ProcessState::Locked => {}
        other => {
            return Err(format!(
                "the driver has process {pid} in state {other:?}; it cannot be restored"
            ))
        }
    }
    let t = Instant::now();
    api.unlock(pid).map_err(|e| reason(&e, pid, 0))?;
    done.unlock_ms = t.elapsed().as_secs_f64() * 1e3;
    done.init_ms = loaded.init_ms;
    Ok(done)
}

/// A GPU of this machine, as the driver in `cudaw-ckpt` sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Its index (the driver's enumeration; [`gpus`] says in which order).
    pub index: i32,
    /// `cuDeviceGetUuid`.
    pub uuid: [u8; 16],
    /// The UUID as `nvidia-smi -L` writes it (`GPU-…`).
    pub text: String,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceTotalMem`, in bytes.
    pub total: u64,
    /// Its compute capability (major, minor): the driver restores a process only onto a
    /// GPU of the same chip.
    pub capability: (i32, i32),
}

/// Every GPU the driver in this process sees, in its order (the caller sets
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` and clears `CUDA_VISIBLE_DEVICES` before the driver is
/// loaded for `nvidia-smi`'s numbering).
pub fn gpus() -> Result<Vec<Gpu>, String> {
    let loaded = load()?;
    let cuda = &loaded.cuda;
    use driver::sys::CUdevice_attribute as A;
    let n = cuda
        .device_count()
        .map_err(|e| format!("cuDeviceGetCount failed ({e})"))?;
    (0..n)
        .map(|index| {
            let d = cuda
                .device_get(index)
                .map_err(|e| format!("cuDeviceGet({index}) failed ({e})"))?;
            let uuid = cuda
                .device_uuid(d)
                .map_err(|e| format!("cuDeviceGetUuid(GPU {index}) failed ({e})"))?;
            Ok(Gpu {
                index,
                uuid,
                text: cudaw_control::uuid_text(&uuid),
                name: cuda.device_name(d).unwrap_or_default(),
                total: cuda.device_total_mem(d).unwrap_or(0),
                capability: (
                    cuda.device_attribute(d, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                        .unwrap_or(0),
                    cuda.device_attribute(d, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                        .unwrap_or(0),
                ),
            })
        })
        .collect()
}
