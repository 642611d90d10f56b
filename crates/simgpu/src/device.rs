//! The simulated machine: its devices (`SIMGPU_DEVICES`, seen through
//! `CUDA_VISIBLE_DEVICES`), their memory (one address space, see [`crate::memory`]), each
//! device's streams, events and contexts, and the attributes an H100 reports.
//!
//! Visible device `i` is physical device `config.visible[i]` and keeps that device's
//! identity: its UUID ([`crate::config::uuid_of`]), name (`simgpu (simulated H100) #P`),
//! PCI bus (`0000:BB:00.0`, bus `0x18 + P`) and memory size. Each device has a primary
//! context and one context a program can create (`cuCtxCreate`); a context's device is
//! what a call made while it is current acts on. Peer access is kept per pair of devices
//! (not per pair of contexts).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::config::{self, Config, MAX_DEVICES};
use crate::error::{CuError, CuResult};
use crate::memory::Memory;
use crate::stream::{Event, StreamId, Streams};

/// The name `cuDeviceGetName` reports, before the device's ` #P` suffix.
pub const NAME: &str = "simgpu (simulated H100)";
/// `cuDriverGetVersion`: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;

/// One visible device.
pub struct Device {
    ordinal: usize,
    /// The physical device it is; a restore onto another GPU changes it
    /// ([`Device::become_physical`]).
    physical: AtomicUsize,
    mem_bytes: AtomicU64,
    memory: Arc<Mutex<Memory>>,
    /// Its streams.
    pub streams: Streams,
    events: Mutex<HashMap<u64, Arc<Event>>>,
    primary_refs: AtomicU32,
    primary_flags: AtomicU32,
    runtime_active: AtomicBool,
}

/// The machine: every visible device, and the memory they share.
pub struct Machine {
    /// What the environment configured.
    pub config: Config,
    devices: Vec<Device>,
    memory: Arc<Mutex<Memory>>,
}

static MACHINE: OnceLock<CuResult<Machine>> = OnceLock::new();
static NEXT_EVENT: AtomicU64 = AtomicU64::new(1);

/// Context handles: the addresses of these bytes, `[device][0]` the primary context,
/// `[device][1]` the program's own.
static CONTEXTS: [[u8; 2]; MAX_DEVICES] = [[0; 2]; MAX_DEVICES];

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Machine {
    /// `cuInit`: creates the machine on first call, reading the configuration.
    /// `CUDA_ERROR_INVALID_VALUE` for a configuration simgpu refuses (said on standard
    /// error), `CUDA_ERROR_NO_DEVICE` when no device is visible.
    pub fn init() -> CuResult<&'static Machine> {
        MACHINE
            .get_or_init(|| {
                let config = Config::from_env().map_err(|e| {
                    say!("simgpu: {e}");
                    CuError::CUDA_ERROR_INVALID_VALUE
                })?;
                let machine = Machine::new(config)?;
                crate::checkpoint::serve_once();
                Ok(machine)
            })
            .as_ref()
            .map_err(|e| *e)
    }

    /// A machine of `config`'s visible devices.
    pub fn new(config: Config) -> CuResult<Machine> {
        if config.visible.is_empty() {
            return Err(CuError::CUDA_ERROR_NO_DEVICE);
        }
        let sizes: Vec<u64> = config
            .visible
            .iter()
            .map(|&p| config.mem_bytes[p])
            .collect();
        let memory = Arc::new(Mutex::new(Memory::with_physical_devices(
            &sizes,
            &config.visible,
        )?));
        let devices = config
            .visible
            .iter()
            .enumerate()
            .map(|(ordinal, &physical)| Device {
                ordinal,
                physical: AtomicUsize::new(physical),
                mem_bytes: AtomicU64::new(config.mem_bytes[physical]),
                memory: memory.clone(),
                streams: Streams::new(),
                events: Mutex::new(HashMap::new()),
                primary_refs: AtomicU32::new(0),
                primary_flags: AtomicU32::new(0),
                runtime_active: AtomicBool::new(false),
            })
            .collect();
        Ok(Machine {
            config,
            devices,
            memory,
        })
    }

    /// The machine, once `cuInit` has run: CUDA_ERROR_NOT_INITIALIZED before, and
    /// `cuInit`'s error after it failed.
    pub fn get() -> CuResult<&'static Machine> {
        match MACHINE.get() {
            Some(Ok(m)) => Ok(m),
            Some(Err(e)) => Err(*e),
            None => Err(CuError::CUDA_ERROR_NOT_INITIALIZED),
        }
    }

    /// How many devices are visible.
    pub fn count(&self) -> usize {
        self.devices.len()
    }

    /// Every visible device, by ordinal.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Device `ordinal`; CUDA_ERROR_INVALID_DEVICE when there is none.
    pub fn device(&self, ordinal: i32) -> CuResult<&Device> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)
    }

    /// The device of a context handle; CUDA_ERROR_INVALID_CONTEXT if it is none of ours.
    pub fn device_of_context(&self, ctx: usize) -> CuResult<&Device> {
        context_device(ctx)
            .and_then(|d| self.devices.get(d))
            .ok_or(CuError::CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The memory every device shares, locked.
    pub fn memory(&self) -> MutexGuard<'_, Memory> {
        lock(&self.memory)
    }

    /// Waits for all work enqueued so far on every device.
    pub fn synchronize_all(&self) {
        for d in &self.devices {
            d.streams.synchronize_all();
        }
    }

    /// The device and stream a `CUstream` value names: NULL, `CU_STREAM_LEGACY` and
    /// `CU_STREAM_PER_THREAD` name the current context's device's NULL stream; a created
    /// stream belongs to the device it was created on.
    pub fn stream(&self, handle: u64) -> CuResult<(&Device, StreamId)> {
        match stream_of(handle)? {
            StreamId::Null => Ok((Device::with_context()?, StreamId::Null)),
            StreamId::Created(id) => self
                .devices
                .iter()
                .find(|d| d.streams.contains(id))
                .map(|d| (d, StreamId::Created(id)))
                .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// The device an event was created on, and the event.
    pub fn event(&self, handle: u64) -> CuResult<(&Device, Arc<Event>)> {
        let id = id_of(handle).ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        self.devices
            .iter()
            .find_map(|d| lock(&d.events).get(&id).cloned().map(|e| (d, e)))
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Forgets an event (`cuEventDestroy`); a pending record still completes.
    pub fn remove_event(&self, handle: u64) -> CuResult<()> {
        let id = id_of(handle).ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        self.devices
            .iter()
            .find_map(|d| lock(&d.events).remove(&id))
            .map(drop)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }
}

impl Device {
    /// `cuInit`, for callers that want a device: the machine's device 0.
    pub fn init() -> CuResult<&'static Device> {
        Ok(&Machine::init()?.devices[0])
    }

    /// The current context's device, when the machine is initialised and a context is
    /// current on this thread.
    pub fn with_context() -> CuResult<&'static Device> {
        let machine = Machine::get()?;
        match current() {
            0 => Err(CuError::CUDA_ERROR_INVALID_CONTEXT),
            ctx => machine.device_of_context(ctx),
        }
    }

    /// Its ordinal among the visible devices.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The physical device it is (its ordinal when `CUDA_VISIBLE_DEVICES` is unset).
    pub fn physical(&self) -> usize {
        self.physical.load(Ordering::Acquire)
    }

    /// Its UUID (`cuDeviceGetUuid`).
    pub fn uuid(&self) -> [u8; 16] {
        config::uuid_of(self.physical())
    }

    /// Its name (`cuDeviceGetName`).
    pub fn name(&self) -> String {
        format!("{NAME} #{}", self.physical())
    }

    /// Its memory in bytes (`cuDeviceTotalMem`).
    pub fn total_mem(&self) -> u64 {
        self.mem_bytes.load(Ordering::Acquire)
    }

    /// Its PCI bus number.
    pub fn pci_bus(&self) -> u32 {
        0x18 + self.physical() as u32
    }

    /// The driver's restore onto another GPU: this ordinal is physical device `physical`
    /// (of `mem_bytes`) from now on, for the program as for its memory (whose accounting
    /// the caller moves, [`crate::memory::Memory::restore`]).
    pub fn become_physical(&self, physical: usize, mem_bytes: u64) {
        self.physical.store(physical, Ordering::Release);
        self.mem_bytes.store(mem_bytes, Ordering::Release);
    }

    /// Its PCI location as `cuDeviceGetPCIBusId` writes it: `0000:BB:00.0`.
    pub fn pci_bus_id(&self) -> String {
        format!("0000:{:02x}:00.0", self.pci_bus())
    }

    /// Its primary context's handle.
    pub fn primary_context(&self) -> usize {
        primary_context(self.ordinal)
    }

    /// The memory every device shares, locked.
    pub fn memory(&self) -> MutexGuard<'_, Memory> {
        lock(&self.memory)
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn retain_primary(&self) {
        self.primary_refs.fetch_add(1, Ordering::AcqRel);
    }

    /// `cuDevicePrimaryCtxRelease`: a release without a retain is not an error here.
    pub fn release_primary(&self) {
        let _ = self
            .primary_refs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// The runtime made the primary context current on some thread (it holds it, as the
    /// real runtime retains it).
    pub fn mark_runtime_active(&self) {
        self.runtime_active.store(true, Ordering::Release);
    }

    /// `cuDevicePrimaryCtxGetState`: its flags, and whether it is active (retained).
    pub fn primary_state(&self) -> (u32, bool) {
        (
            self.primary_flags.load(Ordering::Acquire),
            self.primary_refs.load(Ordering::Acquire) > 0
                || self.runtime_active.load(Ordering::Acquire),
        )
    }

    /// `cuDevicePrimaryCtxSetFlags`.
    pub fn set_primary_flags(&self, flags: u32) {
        self.primary_flags.store(flags, Ordering::Release);
    }

    /// Registers an event created on this device; returns its handle (non-zero,
    /// 16-aligned, unique across devices).
    pub fn add_event(&self, event: Arc<Event>) -> u64 {
        let id = NEXT_EVENT.fetch_add(1, Ordering::Relaxed);
        lock(&self.events).insert(id, event);
        handle_of(id)
    }
}

/// The handle a stream or event id is known by (`CUstream`/`CUevent` pointer value):
/// 16-aligned, so never one of the special streams 0, 1 (legacy), 2 (per-thread).
pub fn handle_of(id: u64) -> u64 {
    id << 4
}

fn id_of(handle: u64) -> Option<u64> {
    (handle != 0 && handle & 0xf == 0).then_some(handle >> 4)
}

/// The stream a `CUstream` value names: NULL, `CU_STREAM_LEGACY` and
/// `CU_STREAM_PER_THREAD` all go to the NULL stream.
pub fn stream_of(handle: u64) -> CuResult<StreamId> {
    match handle {
        0..=2 => Ok(StreamId::Null),
        h => id_of(h)
            .map(StreamId::Created)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Device `device`'s primary context's handle.
///
/// # Panics
/// When `device` is not below [`MAX_DEVICES`] (callers pass checked ordinals).
pub fn primary_context(device: usize) -> usize {
    &CONTEXTS[device][0] as *const u8 as usize
}

/// The one context of its own a program can make on `device` (`cuCtxCreate`): it shares
/// the device's memory with the primary context, but it is another handle, as on a GPU —
/// so that code which must leave a program's own context current can be checked.
///
/// # Panics
/// As [`primary_context`].
pub fn own_context(device: usize) -> usize {
    &CONTEXTS[device][1] as *const u8 as usize
}

/// The device ordinal a context handle belongs to, if it is one of simgpu's.
pub fn context_device(ctx: usize) -> Option<usize> {
    let base = CONTEXTS.as_ptr() as usize;
    let offset = ctx.checked_sub(base)?;
    (offset < 2 * MAX_DEVICES).then_some(offset / 2)
}

/// `cuCtxSetCurrent`: a context of a visible device, or none.
pub fn set_current(ctx: usize) -> CuResult<()> {
    if ctx != 0 {
        Machine::get()
            .map_err(|_| CuError::CUDA_ERROR_INVALID_CONTEXT)?
            .device_of_context(ctx)?;
    }
    CURRENT.with(|c| c.set(ctx));
    Ok(())
}

/// `cuCtxGetCurrent`.
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

/// `cuCtxPushCurrent`: `ctx` becomes current; the one it replaces waits on this thread's
/// stack.
pub fn push_current(ctx: usize) -> CuResult<()> {
    let previous = current();
    set_current(ctx)?;
    STACK.with(|s| s.borrow_mut().push(previous));
    Ok(())
}

/// `cuCtxPopCurrent`: returns the current context; the one below it becomes current.
pub fn pop_current() -> CuResult<usize> {
    let ctx = current();
    if ctx == 0 {
        return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
    }
    let below = STACK.with(|s| s.borrow_mut().pop()).unwrap_or(0);
    CURRENT.with(|c| c.set(below));
    Ok(ctx)
}

/// Checks a device ordinal against the visible devices; returns it as an index.
pub fn check_ordinal(dev: i32) -> CuResult<usize> {
    Machine::get()?.device(dev).map(Device::ordinal)
}

/// `cuDeviceGetAttribute` of `device`: what an H100 SXM reports (its PCI location its
/// own); 0 for other valid attributes.
pub fn attribute(attr: i32, device: &Device) -> CuResult<i32> {
    let value = match attr {
        1 => 1024,                     // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                 // MAX_BLOCK_DIM_X, Y
        4 => 64,                       // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                 // MAX_GRID_DIM_X
        6 | 7 => 65535,                // MAX_GRID_DIM_Y, Z
        8 => 49152,                    // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                    // TOTAL_CONSTANT_MEMORY
        10 => 32,                      // WARP_SIZE
        11 => i32::MAX,                // MAX_PITCH
        12 => 65536,                   // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,               // CLOCK_RATE (kHz)
        14 => 512,                     // TEXTURE_ALIGNMENT
        15 => 1,                       // GPU_OVERLAP
        16 => 132,                     // MULTIPROCESSOR_COUNT
        19 => 1,                       // CAN_MAP_HOST_MEMORY
        31 => 1,                       // CONCURRENT_KERNELS
        32 => 1,                       // ECC_ENABLED
        33 => device.pci_bus() as i32, // PCI_BUS_ID
        34 | 50 => 0,                  // PCI_DEVICE_ID, PCI_DOMAIN_ID
        36 => 2_619_000,               // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                    // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,                // L2_CACHE_SIZE
        39 => 2048,                    // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                       // ASYNC_ENGINE_COUNT
        41 => 1,                       // UNIFIED_ADDRESSING
        75 => 9,                       // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                       // COMPUTE_CAPABILITY_MINOR
        81 => 233_472,                 // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,                   // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                       // MANAGED_MEMORY
        88 => 1,                       // CONCURRENT_MANAGED_ACCESS
        95 => 1,                       // COOPERATIVE_LAUNCH
        97 => 232_448,                 // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        102 => 1,                      // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1,                      // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        106 => 32,                     // MAX_BLOCKS_PER_MULTIPROCESSOR
        111 => 1024,                   // RESERVED_SHARED_MEMORY_PER_BLOCK
        115 => 1,                      // MEMORY_POOLS_SUPPORTED
        _ if (1..=200).contains(&attr) => 0,
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_contexts_and_attributes() {
        assert_eq!(stream_of(0), Ok(StreamId::Null));
        assert_eq!(stream_of(1), Ok(StreamId::Null));
        assert_eq!(stream_of(handle_of(5)), Ok(StreamId::Created(5)));
        assert_eq!(stream_of(7), Err(CuError::CUDA_ERROR_INVALID_HANDLE));
        assert_eq!(context_device(primary_context(3)), Some(3));
        assert_eq!(context_device(own_context(3)), Some(3));
        assert_ne!(primary_context(0), own_context(0));
        assert_eq!(
            context_device(own_context(MAX_DEVICES - 1)),
            Some(MAX_DEVICES - 1)
        );
        assert_eq!(context_device(12), None);
        assert_eq!(context_device(own_context(MAX_DEVICES - 1) + 1), None);
        let (config, _) = Config::from_vars(Some("3"), Some("2G,1G"), Some("2,0")).unwrap();
        let m = Machine::new(config).unwrap();
        assert_eq!(m.count(), 2);
        let d0 = m.device(0).unwrap();
        assert_eq!((d0.ordinal(), d0.physical()), (0, 2));
        assert_eq!(d0.name(), "simgpu (simulated H100) #2");
        assert_eq!(d0.uuid(), config::uuid_of(2));
        assert_eq!(d0.total_mem(), 1 << 30);
        assert_eq!(d0.pci_bus_id(), "0000:1a:00.0");
        assert_eq!(m.device(1).unwrap().total_mem(), 2 << 30);
        assert_eq!(m.memory().info(0), Ok((1 << 30, 1 << 30)));
        assert_eq!(m.device(2).err(), Some(CuError::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(m.device(-1).err(), Some(CuError::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(m.device_of_context(own_context(1)).unwrap().ordinal(), 1);
        assert_eq!(
            m.device_of_context(primary_context(2)).err(),
            Some(CuError::CUDA_ERROR_INVALID_CONTEXT)
        );
        assert_eq!(attribute(75, d0), Ok(9));
        assert_eq!(attribute(16, d0), Ok(132));
        assert_eq!(attribute(33, d0), Ok(0x1a));
        assert_eq!(attribute(0, d0), Err(CuError::CUDA_ERROR_INVALID_VALUE));
        d0.retain_primary();
        assert_eq!(d0.primary_state(), (0, true));
        d0.release_primary();
        d0.release_primary();
        assert_eq!(d0.primary_state(), (0, false));
        let (config, _) = Config::from_vars(Some("2"), None, Some("")).unwrap();
        assert_eq!(
            Machine::new(config).err(),
            Some(CuError::CUDA_ERROR_NO_DEVICE)
        );
    }
}
