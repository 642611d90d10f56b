//! `cudaw-ckpt pause PID --release` and the resume of a released process: the driver's
//! half. cudaw evicts the memory first (fast); then the driver's process checkpoint
//! (`cuCheckpointProcessLock` + `cuCheckpointProcessCheckpoint`, which NVIDIA's API
//! requires to be called from another process: this one) takes what is left — the
//! context, modules, streams — so the GPU holds nothing of the process. Resume reverses
//! it: the driver's restore and unlock, then cudaw's resume. The driver is `libcuda.so.1`
//! (`$CUDAW_LIBCUDA` names another), loaded here; its calls go through the typed wrapper
//! of the `driver` crate ([`driver::checkpoint`]). `cuInit` is called only where some GPU
//! is not in persistence mode (read through NVML), or where `$CUDAW_CKPT_CUINIT=always`
//! asks for it ([`init_needed`]).

use std::sync::OnceLock;
use std::time::Instant;

use driver::checkpoint::{CheckpointApi, ProcessState};
use driver::loader::LIBCUDA_ENV;
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
    /// warm-up thread's, which ran while cudaw evicted: a second one is quick); 0 when
    /// skipped.
    pub init_ms: f64,
    /// Whether `cudaw-ckpt` called `cuInit`: `called`, or `skipped: persistence mode`.
    pub init: &'static str,
    /// The NVML check of the GPUs' persistence mode, in milliseconds (made once, on the
    /// warm-up thread while cudaw evicted; 0 when not made).
    pub nvml_ms: f64,
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
    /// `cuInit` in `cudaw-ckpt`, in milliseconds (part of the resume's wait); 0 when
    /// skipped.
    pub init_ms: f64,
    /// Whether `cudaw-ckpt` called `cuInit`: `called`, or `skipped: persistence mode`.
    pub init: &'static str,
    /// The NVML check of the GPUs' persistence mode, in milliseconds (part of the
    /// resume's wait; 0 when not made).
    pub nvml_ms: f64,
}

/// Names when `cudaw-ckpt` calls `cuInit`: `auto` (the default: unless every GPU is in
/// persistence mode) or `always`.
const INIT_ENV: &str = "CUDAW_CKPT_CUINIT";

/// `$CUDAW_CKPT_CUINIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitSetting {
    /// `cuInit` unless every GPU is in persistence mode.
    Auto,
    /// `cuInit` always, as before persistence mode was looked at.
    Always,
}

/// Reads `$CUDAW_CKPT_CUINIT`'s value (`None`: unset); the error says what is accepted.
fn init_setting(value: Option<&str>) -> Result<InitSetting, String> {
    match value {
        None | Some("") | Some("auto") => Ok(InitSetting::Auto),
        Some("always") => Ok(InitSetting::Always),
        Some(other) => Err(format!(
            "{INIT_ENV}={other:?} is not a setting: `auto` (the default: cuInit unless every \
             GPU is in persistence mode) or `always`"
        )),
    }
}

fn init_setting_from_env() -> Result<InitSetting, String> {
    match std::env::var(INIT_ENV) {
        Ok(v) => init_setting(Some(&v)),
        Err(std::env::VarError::NotPresent) => init_setting(None),
        Err(std::env::VarError::NotUnicode(v)) => init_setting(Some(&v.to_string_lossy())),
    }
}

/// Whether `cudaw-ckpt` calls `cuInit`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Init {
    /// Called, for the reason given (for people).
    Call(String),
    /// Skipped: every GPU is in persistence mode.
    Skip,
}

/// `init` in the JSON when `cuInit` was called.
const CALLED: &str = "called";
/// `init` in the JSON when it was not.
const SKIPPED: &str = "skipped: persistence mode";

impl Init {
    /// `init` in the JSON.
    fn label(&self) -> &'static str {
        match self {
            Init::Call(_) => CALLED,
            Init::Skip => SKIPPED,
        }
    }
}

/// Decides whether `cudaw-ckpt` calls `cuInit`. NVIDIA documents that
/// `cuCheckpointProcessRestore` "requires persistence mode to be enabled or cuInit to
/// have been called before execution" (the other checkpoint calls name no such need), and
/// `cuInit` here took 341 ms of a resume on an H200 in persistence mode, more than the
/// restore (251 ms): it is skipped when every GPU of the machine is in persistence mode —
/// every GPU, not only the process's, since which GPUs those are is the driver's to say,
/// after a `cuInit`. Anything else calls it: NVML failing or listing no GPU (nothing is
/// known), `$CUDAW_LIBCUDA` naming another driver (simgpu: NVML's readings are about the
/// real one, and simgpu wants `cuInit` from its callers), or `always`. `persistence`
/// reads each GPU's mode, or says why it cannot; it is called only when the answer
/// matters.
///
/// Skipped, the driver does much of that work in the checkpoint and restore instead: on
/// one H200 (580.159.04, 2 GiB of PyTorch memory, 9 cycles each) the resume's driver step
/// took 311 ms skipped (restore 288, NVML 21) against 300 ms called (cuInit 104, restore
/// 194), and the pause 353 ms against 395 ms (the checkpoint 27 ms longer, but no wait
/// for the warm-up thread's `cuInit`).
fn init_needed(
    setting: InitSetting,
    system_driver: bool,
    persistence: impl FnOnce() -> Result<Vec<bool>, String>,
) -> Init {
    if setting == InitSetting::Always {
        return Init::Call(format!("{INIT_ENV}=always"));
    }
    if !system_driver {
        return Init::Call(format!(
            "${LIBCUDA_ENV} names the driver: NVML's persistence mode is about the machine's"
        ));
    }
    match persistence() {
        Err(why) => Init::Call(format!(
            "NVML could not say whether the GPUs are in persistence mode: {why}"
        )),
        Ok(modes) if modes.is_empty() => Init::Call("NVML lists no GPU".to_owned()),
        Ok(modes) => match modes.iter().position(|on| !on) {
            Some(i) => Init::Call(format!("GPU {i} (NVML's index) is not in persistence mode")),
            None => Init::Skip,
        },
    }
}

/// Each GPU's persistence mode, in NVML's order. NVML is loaded (`libnvidia-ml.so.1`) and
/// shut down again here. Not with `NVML_INIT_FLAG_NO_ATTACH`, which would spare attaching
/// GPUs out of persistence mode: with it NVML listed no GPU on an H200 in persistence
/// mode (580.159.04), so `cuInit` would never be skipped.
fn persistence_modes() -> Result<Vec<bool>, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("nvmlInit: {e}"))?;
    let n = nvml
        .device_count()
        .map_err(|e| format!("nvmlDeviceGetCount: {e}"))?;
    (0..n)
        .map(|i| {
            nvml.device_by_index(i)
                .and_then(|d| d.is_in_persistent_mode())
                .map_err(|e| format!("GPU {i}: {e}"))
        })
        .collect()
}

/// What [`init_needed`] decided, and what its NVML check took.
struct Check {
    init: Init,
    /// Milliseconds; 0 when NVML was not asked.
    nvml_ms: f64,
}

/// The check, made once in `cudaw-ckpt`: a pause's warm-up thread makes it while cudaw
/// evicts, and the release after it finds it made. An unknown `$CUDAW_CKPT_CUINIT` is the
/// error.
fn check() -> Result<&'static Check, String> {
    static CHECK: OnceLock<Result<Check, String>> = OnceLock::new();
    CHECK
        .get_or_init(|| {
            let setting = init_setting_from_env()?;
            let system_driver = std::env::var_os(LIBCUDA_ENV).is_none();
            let mut nvml_ms = 0.0;
            let init = init_needed(setting, system_driver, || {
                let t = Instant::now();
                let modes = persistence_modes();
                nvml_ms = t.elapsed().as_secs_f64() * 1e3;
                modes
            });
            Ok(Check { init, nvml_ms })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The driver, loaded and initialised where it must be, with its checkpoint API; the
/// reason (for people) when it has none.
struct Loaded {
    cuda: LibCuda,
    /// Milliseconds `cuInit` took here; 0 when skipped. A released process's resume spent
    /// 342 ms of its 646 ms driver step outside the restore and unlock on the H100 pair,
    /// and `cuInit` took 341 ms of an H200's resume (before a 251 ms restore).
    init_ms: f64,
    /// [`Init::label`].
    init: &'static str,
    /// [`Check::nvml_ms`].
    nvml_ms: f64,
}

/// Loads the driver for its checkpoint API, calling `cuInit` where [`init_needed`] says.
/// A restore that fails for want of it may leave the process unrestorable (cuda-checkpoint
/// issue 44): `CUDAW_CKPT_CUINIT=always` brings the call back should a driver want it
/// despite persistence mode.
fn load() -> Result<Loaded, String> {
    let check = check()?;
    let cuda = open()?;
    let init_ms = match &check.init {
        Init::Skip => 0.0,
        Init::Call(why) => initialise(&cuda, why)?,
    };
    Ok(Loaded {
        cuda,
        init_ms,
        init: check.init.label(),
        nvml_ms: check.nvml_ms,
    })
}

/// Loads the driver and calls `cuInit` whatever the persistence mode: the device queries
/// ([`gpus`]) need it.
fn load_initialised() -> Result<Loaded, String> {
    let cuda = open()?;
    let init_ms = initialise(&cuda, "the GPUs are to be listed")?;
    Ok(Loaded {
        cuda,
        init_ms,
        init: CALLED,
        nvml_ms: 0.0,
    })
}

fn open() -> Result<LibCuda, String> {
    LibCuda::open().map_err(|e| format!("the CUDA driver cannot be loaded ({e})"))
}

/// `cuInit`, called because `why`; its milliseconds.
fn initialise(cuda: &LibCuda, why: &str) -> Result<f64, String> {
    let t = Instant::now();
    cuda.init().map_err(|e| {
        format!("the CUDA driver did not initialise ({e}; cuInit called because {why})")
    })?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
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

/// Loads (and where needed initialises) the driver on a thread of its own, for a
/// `--release` to find it ready: the NVML check and `cuInit` in `cudaw-ckpt` may take
/// hundreds of milliseconds (`nvml_ms`, `init_ms`; `cuInit` 341 ms on an H200), which the
/// caller overlaps with cudaw's eviction (the driver's checkpoint can start only after
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
    done.init = loaded.init;
    done.nvml_ms = loaded.nvml_ms;
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
            api.restore(pid, pairs).map_err(|e| {
                let why = reason(&e, pid, 0);
                if loaded.init == SKIPPED {
                    // The one documented need this run left out: say so.
                    format!(
                        "{why}; cudaw-ckpt did not call cuInit (every GPU is in persistence \
                         mode, which NVIDIA documents as enough for a restore): try again \
                         with CUDAW_CKPT_CUINIT=always"
                    )
                } else {
                    why
                }
            })?;
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
    done.init = loaded.init;
    done.nvml_ms = loaded.nvml_ms;
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
    let loaded = load_initialised()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn all_on() -> Result<Vec<bool>, String> {
        Ok(vec![true, true])
    }

    #[test]
    fn the_setting_is_auto_unless_always_and_refuses_other_values() {
        assert_eq!(init_setting(None), Ok(InitSetting::Auto));
        assert_eq!(init_setting(Some("")), Ok(InitSetting::Auto));
        assert_eq!(init_setting(Some("auto")), Ok(InitSetting::Auto));
        assert_eq!(init_setting(Some("always")), Ok(InitSetting::Always));
        for bad in ["never", "Always", "1", " auto"] {
            let why = init_setting(Some(bad)).unwrap_err();
            assert!(why.contains(INIT_ENV) && why.contains("`always`"), "{why}");
        }
    }

    #[test]
    fn cuinit_is_skipped_only_when_every_gpu_is_in_persistence_mode() {
        let init = init_needed(InitSetting::Auto, true, all_on);
        assert_eq!(init, Init::Skip);
        assert_eq!(init.label(), "skipped: persistence mode");
        assert_eq!(
            init_needed(InitSetting::Auto, true, || Ok(vec![true])),
            Init::Skip
        );
    }

    #[test]
    fn one_gpu_out_of_persistence_mode_calls_cuinit_and_says_which() {
        let init = init_needed(InitSetting::Auto, true, || Ok(vec![true, false, true]));
        let Init::Call(why) = &init else {
            panic!("{init:?}")
        };
        assert!(why.contains("GPU 1"), "{why}");
        assert_eq!(init.label(), "called");
    }

    #[test]
    fn nvml_failing_or_listing_no_gpu_calls_cuinit() {
        let failed = init_needed(InitSetting::Auto, true, || {
            Err("nvmlInit: a libloading error".to_owned())
        });
        assert!(
            matches!(&failed, Init::Call(why) if why.contains("libloading")),
            "{failed:?}"
        );
        assert!(matches!(
            init_needed(InitSetting::Auto, true, || Ok(Vec::new())),
            Init::Call(_)
        ));
    }

    #[test]
    fn always_or_another_driver_calls_cuinit_without_asking_nvml() {
        let asked = std::cell::Cell::new(false);
        let read = || {
            asked.set(true);
            all_on()
        };
        let init = init_needed(InitSetting::Always, true, read);
        assert!(
            matches!(&init, Init::Call(why) if why.contains("always")),
            "{init:?}"
        );
        let init = init_needed(InitSetting::Auto, false, || {
            asked.set(true);
            all_on()
        });
        assert!(
            matches!(&init, Init::Call(why) if why.contains(LIBCUDA_ENV)),
            "{init:?}"
        );
        assert!(!asked.get());
    }

    #[test]
    fn the_json_carries_init_and_nvml_ms_beside_init_ms() {
        let pause = serde_json::to_value(DriverPause {
            init: SKIPPED,
            nvml_ms: 1.5,
            ..DriverPause::default()
        })
        .unwrap();
        assert_eq!(pause["init"], "skipped: persistence mode");
        assert_eq!(pause["nvml_ms"], 1.5);
        assert_eq!(pause["init_ms"], 0.0);
        let resume = serde_json::to_value(DriverResume {
            init: CALLED,
            init_ms: 341.0,
            ..DriverResume::default()
        })
        .unwrap();
        assert_eq!(resume["init"], "called");
        assert_eq!(resume["init_ms"], 341.0);
        assert_eq!(resume["nvml_ms"], 0.0);
    }
}
