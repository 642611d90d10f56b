//! Device memory: the runtime's allocation calls, replaced by the virtual memory manager.
//!
//! One [`Vmm`] per device, created on the first allocation on that device over the driver's
//! VMM calls in the device's primary context (the runtime's own context). Stream-ordered
//! frees (`cudaFreeAsync`) take effect when their stream reaches them: an event is recorded
//! and the memory is released once it has completed.
//!
//! One [`DeviceBudget`] per device (`CUDAW_MEM_LIMIT` and the node ledger), asked before any
//! device memory is taken: by the VMM for every chunk it creates (granule rounding
//! included), by the driver entry points for `cuMemCreate`, and here for managed memory.
//! A limit or ledger that cannot be kept refuses every allocation, with the reason logged.

use crate::config::Addressing;
use crate::host::host;
use crate::log;
use crate::types::*;
use cudaw_ledger::{Accounting, DeviceBudget, Ledger, Note};
use driver::{DriverBackend, LibCuda};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use vmm::{Allocation, Config as VmmConfig, Vmm, VmmError};

/// Tags recorded with each allocation: which API created it.
pub mod tag {
    /// `cudaMalloc`.
    pub const MALLOC: u32 = 1;
    /// `cudaMallocPitch`.
    pub const PITCH: u32 = 2;
    /// `cudaMalloc3D`.
    pub const MALLOC_3D: u32 = 3;
    /// `cudaMallocAsync` / `cudaMallocFromPoolAsync`.
    pub const ASYNC: u32 = 4;
    /// `cuMemAlloc` / `cuMemAllocAsync` handed out through a driver entry point.
    pub const DRIVER: u32 = 5;

    /// The API a tag stands for.
    pub fn api(tag: u32) -> &'static str {
        match tag {
            MALLOC => "cudaMalloc",
            PITCH => "cudaMallocPitch",
            MALLOC_3D => "cudaMalloc3D",
            ASYNC => "cudaMallocAsync",
            DRIVER => "cuMemAlloc",
            _ => "unknown",
        }
    }
}

/// Pitch alignment for `cudaMallocPitch` / `cudaMalloc3D` (what the runtime uses on
/// current GPUs).
pub const PITCH_ALIGNMENT: usize = 512;

/// The most devices cudaw manages in one process.
pub const MAX_DEVICES: usize = 64;

/// One device's memory.
pub struct DeviceMemory {
    /// The manager.
    pub vmm: Vmm<DriverBackend>,
    /// Frees waiting for their stream: (event, pointer).
    deferred: Mutex<Vec<(usize, u64)>>,
    /// Events of deferred frees released by a pause, destroyed by the next thread that
    /// reaps (the control thread does not call the real runtime).
    spent_events: Mutex<Vec<usize>>,
    /// The peer access enabled before the device was managed is granted once it is
    /// ([`crate::peer`]).
    peers_applied: std::sync::Once,
    /// With smart pinning on, the pinned staging is made in the background once the
    /// device is managed ([`crate::staging::prepare_in_background`]).
    staging_started: std::sync::Once,
}

static DRIVER: OnceLock<Result<Arc<LibCuda>, String>> = OnceLock::new();
static DEVICES: [OnceLock<Result<DeviceMemory, String>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
static BUDGETS: [OnceLock<Result<Arc<DeviceBudget>, String>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];

/// The real driver cudaw calls (never its own driver shim).
pub fn driver() -> Result<Arc<LibCuda>, String> {
    DRIVER
        .get_or_init(|| {
            let cfg = crate::config::get();
            let r = match &cfg.libcuda {
                Some(p) => LibCuda::open_path(&p.to_string_lossy()),
                None => LibCuda::open(),
            };
            r.map(Arc::new).map_err(|e| e.to_string())
        })
        .clone()
}

/// The device the calling thread uses (the real runtime's current device).
pub fn current_device() -> Result<i32, cudaError_t> {
    host().current_device()
}

/// The memory of device `ordinal`, created on first use.
pub fn device(ordinal: i32) -> Result<&'static DeviceMemory, cudaError_t> {
    device_slot(ordinal, true)
}

/// The memory of device `ordinal`, created on first use through the driver alone (the
/// primary context retained by cudaw, the real runtime not called): for the control
/// thread while the gate is closed, when a thread held at the driver layer's gate from
/// inside the real runtime may hold one of the runtime's locks. The device is in use
/// already then (its driver handles are why it is asked for), so the runtime needs no
/// initialising.
pub fn device_without_runtime(ordinal: i32) -> Result<&'static DeviceMemory, cudaError_t> {
    device_slot(ordinal, false)
}

fn device_slot(ordinal: i32, through_runtime: bool) -> Result<&'static DeviceMemory, cudaError_t> {
    let slot = DEVICES
        .get(usize::try_from(ordinal).map_err(|_| ERROR_INVALID_VALUE)?)
        .ok_or(ERROR_INVALID_VALUE)?;
    let r = slot.get_or_init(|| {
        let started = std::time::Instant::now();
        // The runtime creates and makes current the device's primary context.
        if through_runtime {
            if let Err(rc) = host().initialise_runtime() {
                return Err(format!(
                    "initialising the runtime on device {ordinal} failed ({rc})"
                ));
            }
        }
        let drv = driver()?;
        let backend = DriverBackend::new(drv, ordinal).map_err(|e| e.to_string())?;
        let cfg = crate::config::get();
        let vcfg = match cfg.addressing {
            Addressing::Mapped => VmmConfig::mapped(),
            Addressing::Translated => translated_config(ordinal),
        };
        // The budget holds the limit, over the VMM's chunks and the driver's cuMemCreate
        // together: the VMM itself has none.
        let budget = budget_arc(ordinal).map_err(|e| format!("its memory budget: {e}"))?;
        let vmm = Vmm::with_budget(backend, vcfg, budget).map_err(|e| e.to_string())?;
        log::info(format_args!(
            "device {ordinal}: cudaw manages its memory ({:?} addressing, granularity {} KiB, ready in {:.1} ms)",
            cfg.addressing,
            vmm.granularity() >> 10,
            started.elapsed().as_secs_f64() * 1e3
        ));
        Ok(DeviceMemory {
            vmm,
            deferred: Mutex::new(Vec::new()),
            spent_events: Mutex::new(Vec::new()),
            peers_applied: std::sync::Once::new(),
            staging_started: std::sync::Once::new(),
        })
    });
    match r {
        Ok(m) => {
            // After it is published: a pair enabled meanwhile is granted by `peer::enabled`
            // or here (granting twice does nothing).
            m.peers_applied.call_once(|| apply_peers(ordinal, m));
            m.staging_started.call_once(|| {
                if crate::staging::prepare_in_background(m.vmm.backend()) {
                    // Registered now, after the runtime's (the device's initialisation
                    // registered it), it runs before the runtime's teardown and waits
                    // for the thread.
                    crate::lifecycle::register_exit_handler();
                }
            });
            Ok(m)
        }
        Err(e) => {
            log::error(format_args!("device {ordinal}: {e}"));
            Err(ERROR_INITIALIZATION)
        }
    }
}

/// Peer access enabled: (accessor, owner) pairs, kept by [`crate::peer`].
static PEER_PAIRS: Mutex<std::collections::BTreeSet<(i32, i32)>> =
    Mutex::new(std::collections::BTreeSet::new());

/// Records (`on`) or forgets the pair: device `accessor` may access device `owner`'s
/// memory. Whether that changed anything.
pub(crate) fn set_peer_pair(accessor: i32, owner: i32, on: bool) -> bool {
    let mut p = PEER_PAIRS.lock();
    if on {
        p.insert((accessor, owner))
    } else {
        p.remove(&(accessor, owner))
    }
}

/// The devices that may access device `owner`'s memory (peer access enabled).
pub fn peer_accessors(owner: i32) -> Vec<i32> {
    PEER_PAIRS
        .lock()
        .iter()
        .filter(|&&(_, o)| o == owner)
        .map(|&(a, _)| a)
        .collect()
}

/// Every pair (accessor, owner) with peer access enabled, in order.
pub fn peer_pairs() -> Vec<(i32, i32)> {
    PEER_PAIRS.lock().iter().copied().collect()
}

/// Once device `owner`'s memory is managed (its VMM made): grants the accessors recorded
/// before on its mappings.
fn apply_peers(owner: i32, m: &DeviceMemory) {
    for accessor in peer_accessors(owner) {
        if let Err(e) = m.vmm.backend().add_peer(accessor) {
            log::error(format_args!(
                "peer access: granting device {accessor} access to device {owner}'s memory: {e}"
            ));
        }
    }
}

/// Bytes of the synthetic range of translated addressing each device hands pointers out
/// of (more than any GPU's memory: 288 GB is the largest today).
pub const TRANSLATED_SLICE: u64 = 512 << 30;

/// Translated addressing on device `ordinal`: its own slice of the synthetic range
/// (device 0's first), so that no two devices hand out the same pointer and a pointer
/// names its device. [`MAX_DEVICES`] slices end well inside the default range's 64 TiB up
/// to the top of the address space.
fn translated_config(ordinal: i32) -> VmmConfig {
    let mut c = VmmConfig::translated();
    c.translated_base = vmm::config::DEFAULT_TRANSLATED_BASE + ordinal as u64 * TRANSLATED_SLICE;
    c.translated_size = TRANSLATED_SLICE;
    c
}

/// The memory of the calling thread's current device.
pub fn current() -> Result<&'static DeviceMemory, cudaError_t> {
    device(current_device()?)
}

/// What cudaw reads about a device from the real runtime (`cudaGetDeviceProperties`).
#[derive(Debug, Clone)]
pub struct DeviceFacts {
    /// `totalGlobalMem`: the card's memory in bytes.
    pub total: u64,
    /// `uuid`.
    pub uuid: [u8; 16],
}

/// Offsets in `cudaDeviceProp`, the same in CUDA 11, 12 and 13: `char name[256]`,
/// `cudaUUID_t uuid` (16 bytes), `char luid[8]`, `unsigned luidDeviceNodeMask`, then
/// (8-aligned) `size_t totalGlobalMem`.
pub const PROP_UUID: usize = 256;
/// See [`PROP_UUID`].
pub const PROP_TOTAL_GLOBAL_MEM: usize = 288;

/// The real runtime's properties of device `ordinal`: its memory and UUID.
pub fn device_facts(ordinal: i32) -> Result<DeviceFacts, cudaError_t> {
    // Larger than any version's cudaDeviceProp (about 1 KiB), 8-byte aligned.
    let mut buf = vec![0u64; 1024];
    host().device_properties(ordinal, &mut buf)?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let total = u64::from_ne_bytes(
        bytes[PROP_TOTAL_GLOBAL_MEM..PROP_TOTAL_GLOBAL_MEM + 8]
            .try_into()
            .expect("8 bytes"),
    );
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&bytes[PROP_UUID..PROP_UUID + 16]);
    Ok(DeviceFacts { total, uuid })
}

/// The GPU's name in the ledger: its UUID as `nvidia-smi -L` writes it (`GPU-…`), or
/// `device-ORDINAL` when the runtime gives none.
pub fn ledger_key(ordinal: i32, uuid: &[u8; 16]) -> String {
    uuid_text(uuid).unwrap_or_else(|| format!("device-{ordinal}"))
}

/// A GPU's UUID as `nvidia-smi -L` writes it ([`cudaw_control::uuid_text`]); `None` for
/// the all-zero UUID of a driver that gives none.
pub fn uuid_text(uuid: &[u8; 16]) -> Option<String> {
    (uuid.iter().any(|&b| b != 0)).then(|| cudaw_control::uuid_text(uuid))
}

/// The GPU behind device `ordinal` (`GPU-…`), as cudaw last read it: when the device's
/// budget was made, and after each restore of the context by the driver (a migration
/// changes it). `None` for a device without a budget, or a driver that gives no UUID.
/// Never calls the driver: status asks it while the driver holds the process locked.
pub fn gpu_of(ordinal: i32) -> Option<String> {
    uuid_text(DEVICE_GPU.lock().get(&ordinal)?)
}

/// What a device's budget says, logged: refusals at info level (each one), ledger
/// failures as errors (once per reason), repairs as warnings.
fn budget_notes(ordinal: i32) -> impl Fn(Note<'_>) + Send + Sync + 'static {
    move |n| match n {
        // The retries of an allocation waiting for room are not logged one by one.
        Note::Refused(_) if crate::room::quiet() => {}
        Note::Refused(r) => log::info(format_args!("device {ordinal}: {r}")),
        Note::LedgerFailed(m) => log::error(format_args!("device {ordinal}: {m}")),
        Note::LedgerRepaired(m) => log::warn(format_args!("device {ordinal}: node ledger: {m}")),
    }
}

/// A device's budget. Whatever goes wrong, there is one: a limit or a ledger that cannot
/// be kept gives a budget that refuses every allocation with the reason (never none, which
/// would let every allocation through uncounted).
fn new_budget(ordinal: i32) -> Result<Arc<DeviceBudget>, String> {
    let notes = budget_notes(ordinal);
    leave_ledgers_at_exit_once();
    let cfg = crate::config::get();
    let limits = match &cfg.mem_limits {
        Ok(l) => l,
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| log::error(format_args!("{why}")));
            // Each refusal names the value; the error said once gives the whole reason.
            let cut = why.find(" cannot be enforced").unwrap_or(why.len());
            let short = format!(
                "{} cannot be enforced (the error logged with the first allocation says why)",
                &why[..cut]
            );
            return Ok(Arc::new(DeviceBudget::refusing(short, notes)));
        }
    };
    let facts = match device_facts(ordinal) {
        Ok(f) => f,
        Err(rc) => {
            let why = format!(
                "cudaGetDeviceProperties({ordinal}) failed ({rc}): the card's memory is unknown, so its limit and the node ledger cannot be kept"
            );
            log::error(format_args!("device {ordinal}: {why}"));
            return Ok(Arc::new(DeviceBudget::refusing(why, notes)));
        }
    };
    let limit = limits.resolve(ordinal, facts.total);
    if let Some(l) = limit {
        log::info(format_args!(
            "device {ordinal}: memory limit {l} bytes ({:.2} GiB of the card's {:.2} GiB; CUDAW_MEM_LIMIT={})",
            l as f64 / GIB,
            facts.total as f64 / GIB,
            limits
        ));
    }
    DEVICE_GPU.lock().insert(ordinal, facts.uuid);
    let accounting = if cfg.ledger {
        ledger_accounting(ordinal, &facts.uuid, facts.total, limit)
    } else {
        Accounting::Off
    };
    Ok(Arc::new(
        DeviceBudget::new(limit, accounting, notes)
            .sharing_node_limit(Arc::clone(&NODE_LIMIT))
            .counting_retries_once(crate::room::quiet),
    ))
}

/// The GPU (UUID) behind each device with a budget, by ordinal: read when the budget is
/// made, and again by [`follow_moved_devices`] (never while paused: the driver may hold
/// the process locked then, and a call into it would wait).
static DEVICE_GPU: Mutex<BTreeMap<i32, [u8; 16]>> = Mutex::new(BTreeMap::new());

/// Joins GPU `uuid`'s node ledger for device `ordinal` (a card of `total` bytes), or,
/// when it cannot be joined, an accounting that refuses until it can.
fn ledger_accounting(ordinal: i32, uuid: &[u8; 16], total: u64, limit: Option<u64>) -> Accounting {
    let cfg = crate::config::get();
    {
        let key = ledger_key(ordinal, uuid);
        let dir = cfg.node_dir.clone();
        let join = move || Ledger::join(&dir, &key, total, limit).map_err(|e| e.to_string());
        match join() {
            Ok(l) => {
                log::info(format_args!(
                    "device {ordinal}: node ledger {}",
                    l.path().unwrap_or(l.dir()).display()
                ));
                Accounting::Ledger(l)
            }
            Err(why) => {
                log::error(format_args!(
                    "device {ordinal}: the node ledger cannot be joined: {why}; allocations on this device are refused until it can be (CUDAW_LEDGER=off runs outside the node's accounting)"
                ));
                Accounting::Rejoin {
                    why,
                    rejoin: Box::new(join),
                }
            }
        }
    }
}

/// One device's budget moved to another GPU's node ledger: the device's ordinal and the
/// ledger keys (`GPU-…`) before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMove {
    /// The CUDA ordinal (the same before and after: the program never notices).
    pub ordinal: i32,
    /// The GPU it was on.
    pub from: String,
    /// The GPU it is on now.
    pub to: String,
}

/// After the driver restored the process's context, possibly onto other GPUs
/// (`cudaw-ckpt migrate`: the restore's GPU pairs keep every ordinal and change the GPU
/// behind it): each device's budget follows its ordinal to the node ledger of the GPU it
/// names now, asking that GPU's ledger for what the budget holds now (evicted memory is
/// not held: the resume asks the new GPU's ledger for it as it comes back). The moves
/// made; an error names the device that does not fit beside the new GPU's other
/// processes — the devices before it stay moved (a later call moves them back if the
/// driver does), nothing of it is moved.
pub fn follow_moved_devices() -> Result<Vec<DeviceMove>, String> {
    use driver::Driver;
    let drv = driver()?;
    let mut moves = Vec::new();
    let keyed: Vec<(i32, [u8; 16])> = DEVICE_GPU.lock().iter().map(|(o, u)| (*o, *u)).collect();
    for (ordinal, was) in keyed {
        let Ok(budget) = budget(ordinal) else {
            continue;
        };
        let dev = drv
            .device_get(ordinal)
            .map_err(|e| format!("device {ordinal}: the driver does not name its GPU ({e})"))?;
        let now = drv
            .device_uuid(dev)
            .map_err(|e| format!("device {ordinal}: cuDeviceGetUuid failed ({e})"))?;
        if now == was {
            continue;
        }
        let total = drv
            .device_total_mem(dev)
            .map_err(|e| format!("device {ordinal}: cuDeviceTotalMem failed ({e})"))?;
        let (from, to) = (ledger_key(ordinal, &was), ledger_key(ordinal, &now));
        let accounting = if crate::config::get().ledger {
            ledger_accounting(ordinal, &now, total, budget.limit())
        } else {
            Accounting::Off
        };
        budget.move_to(accounting).map_err(|r| {
            format!("device {ordinal} cannot move from {from} to {to} in the node ledger: {r}")
        })?;
        DEVICE_GPU.lock().insert(ordinal, now);
        log::info(format_args!(
            "device {ordinal}: now on {to} (was {from}): its node-ledger entry moved with it"
        ));
        moves.push(DeviceMove { ordinal, from, to });
    }
    Ok(moves)
}

const GIB: f64 = (1u64 << 30) as f64;

fn budget_arc(ordinal: i32) -> Result<Arc<DeviceBudget>, cudaError_t> {
    let slot = usize::try_from(ordinal)
        .ok()
        .and_then(|i| BUDGETS.get(i))
        .ok_or(ERROR_INVALID_VALUE)?;
    thread_local! {
        static CREATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    let r = match slot.get() {
        Some(r) => r,
        None => {
            if CREATING.with(|c| c.replace(true)) {
                // Re-entered while creating one (the real runtime called back into an
                // export): no budget for this inner call, rather than a deadlock.
                return Err(ERROR_NOT_READY);
            }
            let r = slot.get_or_init(|| new_budget(ordinal));
            CREATING.with(|c| c.set(false));
            r
        }
    };
    match r {
        Ok(b) => Ok(b.clone()),
        Err(e) => {
            log::error(format_args!("device {ordinal}: {e}"));
            Err(ERROR_INITIALIZATION)
        }
    }
}

/// Whether `CUDAW_MEM_LIMIT` gives device `ordinal` a limit, or cannot be enforced (asking
/// creates no budget: a program that only looks at a device's properties does not join its
/// ledger).
pub fn has_limit(ordinal: i32) -> bool {
    match &crate::config::get().mem_limits {
        Ok(l) => l.for_device(ordinal).is_some(),
        Err(_) => true,
    }
}

/// The memory budget of device `ordinal` (its limit and its entry in the node ledger),
/// created on first use.
pub fn budget(ordinal: i32) -> Result<&'static DeviceBudget, cudaError_t> {
    budget_arc(ordinal)?;
    match BUDGETS[ordinal as usize].get() {
        Some(Ok(b)) => Ok(b),
        _ => Err(ERROR_INITIALIZATION),
    }
}

/// The node daemon's memory limit for this process (`u64::MAX`: none), as every device's
/// budget reads it (they share it: one made later reads it too).
static NODE_LIMIT: std::sync::LazyLock<Arc<std::sync::atomic::AtomicU64>> =
    std::sync::LazyLock::new(|| Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)));

/// The limit the daemon asked for (`u64::MAX`: none), and how many resumes lift it now:
/// [`NODE_LIMIT`] is it, or none while lifted. Written under this lock only.
static NODE_WANTED: Mutex<(u64, u32)> = Mutex::new((u64::MAX, 0));

/// Sets the node daemon's memory limit (its job's `memory`) on every device, those whose
/// budget is made later too (kept lifted while a resume runs, in force when it ends). Per
/// device with a budget: (ordinal, the limit in force, bytes held).
pub fn set_node_limit(bytes: Option<u64>) -> Vec<(i32, Option<u64>, u64)> {
    let want = bytes.map_or(u64::MAX, |b| b.min(u64::MAX - 1));
    {
        let mut w = NODE_WANTED.lock();
        if w.0 != want {
            match bytes {
                Some(b) => log::info(format_args!(
                    "the node daemon limits this process's memory to {b} bytes ({:.2} GiB) on each device (its job's `memory`)",
                    b as f64 / GIB
                )),
                None => log::info(format_args!("the node daemon lifts its memory limit")),
            }
        }
        w.0 = want;
        if w.1 == 0 {
            NODE_LIMIT.store(want, std::sync::atomic::Ordering::Relaxed);
        }
    }
    budgets()
        .map(|(o, b)| {
            let u = b.usage();
            if let (Some(l), true) = (u.limit, bytes.is_some()) {
                if u.used > l {
                    log::warn(format_args!(
                        "device {o}: {} bytes held, above the limit of {l}: allocations are refused until enough is freed",
                        u.used
                    ));
                }
            }
            (o, u.limit, u.used)
        })
        .collect()
}

/// While alive, the node daemon's limit is lifted on every device (a resume or restore
/// bringing back what the process held, its gate closed); in force again when dropped,
/// even by a panic. Nested ones count.
pub(crate) struct NodeLimitLifted(());

impl NodeLimitLifted {
    pub(crate) fn new() -> NodeLimitLifted {
        let mut w = NODE_WANTED.lock();
        w.1 += 1;
        NODE_LIMIT.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
        NodeLimitLifted(())
    }
}

impl Drop for NodeLimitLifted {
    fn drop(&mut self) {
        let mut w = NODE_WANTED.lock();
        w.1 = w.1.saturating_sub(1);
        if w.1 == 0 {
            NODE_LIMIT.store(w.0, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Every device with a budget, with its ordinal.
pub fn budgets() -> impl Iterator<Item = (i32, &'static DeviceBudget)> {
    BUDGETS
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s.get() {
            Some(Ok(b)) => Some((i as i32, &**b)),
            _ => None,
        })
}

extern "C" fn leave_ledgers_at_exit() {
    crate::boundary::guard("leaving the node ledgers", (), || {
        for (_, b) in budgets() {
            b.leave();
        }
    })
}

fn leave_ledgers_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a function with no arguments that never unwinds (it runs inside
        // the panic boundary).
        unsafe { libc::atexit(leave_ledgers_at_exit) };
    });
}

/// Managed memory is counted in units of this (the GPU's large page).
pub const MANAGED_GRANULE: u64 = 2 << 20;

/// Managed allocations (`cudaMallocManaged`, `cuMemAllocManaged`): pointer → (device,
/// bytes charged to its budget).
static MANAGED: Mutex<BTreeMap<u64, (i32, u64)>> = Mutex::new(BTreeMap::new());

/// Charges a managed allocation of `size` bytes to device `ordinal`'s budget (rounded up to
/// [`MANAGED_GRANULE`]); the bytes charged, or `cudaErrorMemoryAllocation`.
pub fn charge_managed(ordinal: i32, size: u64) -> Result<u64, cudaError_t> {
    let bytes = size
        .checked_next_multiple_of(MANAGED_GRANULE)
        .ok_or(ERROR_MEMORY_ALLOCATION)?;
    budget(ordinal)?
        .try_acquire(bytes)
        .map_err(|_| ERROR_MEMORY_ALLOCATION)?;
    Ok(bytes)
}

/// Records a managed allocation charged with [`charge_managed`].
pub fn record_managed(ptr: u64, ordinal: i32, bytes: u64) {
    MANAGED.lock().insert(ptr, (ordinal, bytes));
}

/// Gives back a charge that [`charge_managed`] took for an allocation that then failed.
pub fn uncharge(ordinal: i32, bytes: u64) {
    if let Ok(b) = budget(ordinal) {
        b.give_back(bytes);
    }
}

/// After the real runtime freed `ptr`: gives its managed charge back, if it had one.
pub fn freed_managed(ptr: u64) {
    let charge = MANAGED.lock().remove(&ptr);
    if let Some((ordinal, bytes)) = charge {
        uncharge(ordinal, bytes);
    }
}

/// Every device whose memory cudaw manages, with its ordinal.
pub fn managed_devices() -> impl Iterator<Item = (i32, &'static DeviceMemory)> {
    DEVICES
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s.get() {
            Some(Ok(m)) => Some((i as i32, m)),
            _ => None,
        })
}

/// Before reporting device `ordinal`'s memory: releases the stream-ordered frees its
/// streams have passed, so that memory freed with `cudaFreeAsync` and synchronised shows
/// as free.
pub fn reap_completed(ordinal: i32) {
    if let Some((_, m)) = managed_devices().find(|(o, _)| *o == ordinal) {
        m.reap(false);
    }
}

/// `(free, total)` as the program must see them on device `ordinal`, from the card's
/// figures: see [`DeviceBudget::memory_info`].
pub fn reported_memory(ordinal: i32, card_free: u64, card_total: u64) -> (u64, u64) {
    match budget(ordinal) {
        Ok(b) => b.memory_info(card_free, card_total),
        Err(_) => (card_free, card_total),
    }
}

/// The allocation containing `ptr`, on whichever device owns it.
pub fn lookup(ptr: u64) -> Option<(&'static DeviceMemory, Allocation)> {
    managed_devices().find_map(|(_, m)| m.vmm.lookup(ptr).map(|a| (m, a)))
}

/// `ptr` as the real runtime must see it: translated when it is one of cudaw's translated
/// pointers, unchanged otherwise.
pub fn to_real(ptr: *const c_void) -> *const c_void {
    let p = ptr as u64;
    for (_, m) in managed_devices() {
        if m.vmm.in_translated_range(p) {
            if let Some(t) = m.vmm.translate(p) {
                return t as *const c_void;
            }
        }
    }
    ptr
}

/// Whether translated addressing is on.
pub fn translated() -> bool {
    crate::config::get().addressing == Addressing::Translated
}

fn vmm_error(e: &VmmError, what: &str) -> cudaError_t {
    log::debug(format_args!("{what}: {e}"));
    e.cuda_error_code()
}

impl DeviceMemory {
    /// Allocates `size` bytes, retrying once after completed stream-ordered frees when out
    /// of memory.
    pub fn alloc(&self, size: u64, tag: u32) -> Result<Allocation, cudaError_t> {
        let a = self.alloc_inner(size, tag)?;
        log::debug(format_args!(
            "allocated {} bytes at {:#x} (backing {:#x}, tag {tag})",
            a.size, a.base, a.backing
        ));
        host().trace_alloc(a.base, a.size, tag::api(tag));
        Ok(a)
    }

    fn alloc_inner(&self, size: u64, tag: u32) -> Result<Allocation, cudaError_t> {
        self.reap(false);
        let first = match self.vmm.alloc(size, tag) {
            Ok(a) => return Ok(a),
            Err(e) if e.cuda_error_code() == ERROR_MEMORY_ALLOCATION => {
                if self.reap(true) > 0 {
                    self.vmm
                        .alloc(size, tag)
                        .map_err(|e| vmm_error(&e, "allocation"))
                } else {
                    Err(vmm_error(&e, "allocation"))
                }
            }
            Err(e) => Err(vmm_error(&e, "allocation")),
        };
        let Err(e) = first else { return first };
        // Out of memory: with a node daemon, wait for it to make room.
        let ordinal = managed_devices()
            .find(|(_, m)| std::ptr::eq(*m, self))
            .map_or(-1, |(o, _)| o);
        // Over the process's own limit no one can make room: fail at once.
        let own_limit = budget(ordinal).ok().and_then(|b| {
            let u = b.usage();
            u.limit.map(|l| u.used.saturating_add(size) > l)
        });
        if own_limit == Some(true) {
            return Err(e);
        }
        crate::room::retry(
            ordinal,
            size,
            e,
            |e| *e == ERROR_MEMORY_ALLOCATION,
            || {
                self.reap(false);
                self.vmm
                    .alloc(size, tag)
                    .map_err(|e| vmm_error(&e, "allocation"))
            },
        )
    }

    /// Releases deferred frees whose stream has passed them (all of them, waiting, when
    /// `wait`). Returns how many were released.
    pub fn reap(&self, wait: bool) -> usize {
        let spent = std::mem::take(&mut *self.spent_events.lock());
        for ev in spent {
            host().destroy_event(ev);
        }
        let ready: Vec<(usize, u64)> = {
            let mut d = self.deferred.lock();
            if d.is_empty() {
                return 0;
            }
            let mut ready = Vec::new();
            d.retain(|&(ev, ptr)| {
                let done = host().event_done(ev, wait);
                if done {
                    ready.push((ev, ptr));
                }
                !done
            });
            ready
        };
        for &(ev, ptr) in &ready {
            host().destroy_event(ev);
            if let Err(e) = self.vmm.free(ptr) {
                log::warn(format_args!("deferred free of {ptr:#x}: {e}"));
            }
        }
        ready.len()
    }

    /// What `cudaFree` and `cuMemFree` do before the memory goes: they synchronise (no
    /// kernel may still use memory once it is unmapped): the calling thread's device, as
    /// the real runtime would, and the memory's own device when that is another one (its
    /// primary context, the thread's context left as it was; a `CUdevice` is its ordinal).
    pub fn synchronise_before_free(&self, what: &str) {
        if let Err(rc) = host().synchronize_device() {
            log::debug(format_args!("{what}: synchronisation reported {rc}"));
        }
        let owner = self.vmm.backend();
        if current_device().ok() != Some(owner.device()) {
            if let Err(e) = owner.synchronize() {
                log::debug(format_args!(
                    "{what}: synchronising the memory's device: {e}"
                ));
            }
        }
    }

    /// For a pause, once the device is synchronised (every recorded event has
    /// completed): releases every deferred free without calling the real runtime, whose
    /// locks a thread held at the driver layer's gate may hold; their events are
    /// destroyed by the next [`DeviceMemory::reap`]. Returns how many were released.
    pub fn reap_synchronised(&self) -> usize {
        let ready = std::mem::take(&mut *self.deferred.lock());
        self.spent_events
            .lock()
            .extend(ready.iter().map(|&(ev, _)| ev));
        for &(_, ptr) in &ready {
            if let Err(e) = self.vmm.free(ptr) {
                log::warn(format_args!("deferred free of {ptr:#x}: {e}"));
            }
        }
        ready.len()
    }

    /// Frees `ptr` once `stream` reaches this point.
    pub fn free_on_stream(&self, ptr: u64, stream: cudaStream_t) -> cudaError_t {
        match host().record_event(stream as usize) {
            Ok(ev) => {
                self.deferred.lock().push((ev, ptr));
                SUCCESS
            }
            Err(rc) => rc,
        }
    }
}

/// Writes `value` through `out` if it is not null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> cudaError_t {
    if out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, and valid per the caller's contract (the application's out-pointer).
    unsafe { out.write(value) };
    SUCCESS
}

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: usize, a: usize) -> Option<usize> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_hand_out_translated_pointers_from_their_own_slices() {
        let slices: Vec<(u64, u64)> = (0..MAX_DEVICES as i32)
            .map(translated_config)
            .map(|c| (c.translated_base, c.translated_base + c.translated_size))
            .collect();
        assert_eq!(slices[0].0, vmm::config::DEFAULT_TRANSLATED_BASE);
        for w in slices.windows(2) {
            assert_eq!(w[0].1, w[1].0, "slices follow each other without overlap");
        }
        // The last one ends below the top of the address space.
        assert!(slices[MAX_DEVICES - 1].1 > slices[MAX_DEVICES - 1].0);
    }

    #[test]
    fn alignment() {
        assert_eq!(align_up(1, 512), Some(512));
        assert_eq!(align_up(512, 512), Some(512));
        assert_eq!(align_up(0, 512), Some(0));
        assert_eq!(align_up(usize::MAX, 512), None);
    }
}
