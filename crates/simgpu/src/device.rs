//! The one simulated device: configuration, memory, streams, events, the primary context,
//! and the attributes an H100 reports.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::config::Config;
use crate::error::{CuError, CuResult};
use crate::memory::Memory;
use crate::stream::{Event, StreamId, Streams};

/// The name `cuDeviceGetName` reports.
pub const NAME: &str = "simgpu (simulated H100)";
/// `cuDriverGetVersion`: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;

/// The simulated device.
pub struct Device {
    /// What the environment configured.
    pub config: Config,
    memory: Mutex<Memory>,
    /// Its streams.
    pub streams: Streams,
    events: Mutex<HashMap<u64, Arc<Event>>>,
    next_event: Mutex<u64>,
}

static DEVICE: OnceLock<CuResult<Device>> = OnceLock::new();

/// The primary context's handle: the address of this static (any non-null unique value).
static PRIMARY_CONTEXT: u8 = 0;
static OWN_CONTEXT: u8 = 0;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Device {
    /// `cuInit`: creates the device on first call (reading the configuration).
    pub fn init() -> CuResult<&'static Device> {
        DEVICE
            .get_or_init(|| {
                let config = Config::from_env();
                Ok(Device {
                    memory: Mutex::new(Memory::new(config.mem_bytes)?),
                    config,
                    streams: Streams::new(),
                    events: Mutex::new(HashMap::new()),
                    next_event: Mutex::new(1),
                })
            })
            .as_ref()
            .map_err(|e| *e)
    }

    /// The device, once `cuInit` has run; CUDA_ERROR_NOT_INITIALIZED before.
    pub fn get() -> CuResult<&'static Device> {
        match DEVICE.get() {
            Some(Ok(d)) => Ok(d),
            Some(Err(e)) => Err(*e),
            None => Err(CuError::CUDA_ERROR_NOT_INITIALIZED),
        }
    }

    /// The device, when initialised and a context is current on this thread.
    pub fn with_context() -> CuResult<&'static Device> {
        let device = Self::get()?;
        if CURRENT.with(Cell::get) == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
        }
        Ok(device)
    }

    /// The device's memory, locked.
    pub fn memory(&self) -> MutexGuard<'_, Memory> {
        lock(&self.memory)
    }

    /// Registers an event; returns its handle (non-zero, 16-aligned).
    pub fn add_event(&self, event: Arc<Event>) -> u64 {
        let id = {
            let mut next = lock(&self.next_event);
            let id = *next;
            *next += 1;
            id
        };
        lock(&self.events).insert(id, event);
        handle_of(id)
    }

    /// The event behind a handle.
    pub fn event(&self, handle: u64) -> CuResult<Arc<Event>> {
        id_of(handle)
            .and_then(|id| lock(&self.events).get(&id).cloned())
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Forgets an event (`cuEventDestroy`); a pending record still completes.
    pub fn remove_event(&self, handle: u64) -> CuResult<()> {
        id_of(handle)
            .and_then(|id| lock(&self.events).remove(&id))
            .map(drop)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
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

/// The primary context's handle.
pub fn primary_context() -> usize {
    &PRIMARY_CONTEXT as *const u8 as usize
}

/// The one context of its own a program can make (`cuCtxCreate`): it shares the device's
/// memory with the primary context, but it is another handle, as on a GPU — so that code
/// which must leave a program's own context current can be checked.
pub fn own_context() -> usize {
    &OWN_CONTEXT as *const u8 as usize
}

/// `cuCtxSetCurrent`: the primary context, the program's own, or none.
pub fn set_current(ctx: usize) -> CuResult<()> {
    if ctx != 0 && ctx != primary_context() && ctx != own_context() {
        return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
    }
    CURRENT.with(|c| c.set(ctx));
    Ok(())
}

/// `cuCtxGetCurrent`.
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

/// Checks a device ordinal: simgpu has one device, 0.
pub fn check_ordinal(dev: i32) -> CuResult<()> {
    if dev == 0 {
        Ok(())
    } else {
        Err(CuError::CUDA_ERROR_INVALID_DEVICE)
    }
}

/// `cuDeviceGetAttribute`: what an H100 SXM reports; 0 for other valid attributes.
pub fn attribute(attr: i32) -> CuResult<i32> {
    let value = match attr {
        1 => 1024,       // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,   // MAX_BLOCK_DIM_X, Y
        4 => 64,         // MAX_BLOCK_DIM_Z
        5 => i32::MAX,   // MAX_GRID_DIM_X
        6 | 7 => 65535,  // MAX_GRID_DIM_Y, Z
        8 => 49152,      // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,      // TOTAL_CONSTANT_MEMORY
        10 => 32,        // WARP_SIZE
        11 => i32::MAX,  // MAX_PITCH
        12 => 65536,     // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000, // CLOCK_RATE (kHz)
        14 => 512,       // TEXTURE_ALIGNMENT
        15 => 1,         // GPU_OVERLAP
        16 => 132,       // MULTIPROCESSOR_COUNT
        19 => 1,         // CAN_MAP_HOST_MEMORY
        31 => 1,         // CONCURRENT_KERNELS
        32 => 1,         // ECC_ENABLED
        36 => 2_619_000, // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,      // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,  // L2_CACHE_SIZE
        39 => 2048,      // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,         // ASYNC_ENGINE_COUNT
        41 => 1,         // UNIFIED_ADDRESSING
        75 => 9,         // COMPUTE_CAPABILITY_MAJOR
        76 => 0,         // COMPUTE_CAPABILITY_MINOR
        81 => 233_472,   // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,     // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,         // MANAGED_MEMORY
        88 => 1,         // CONCURRENT_MANAGED_ACCESS
        95 => 1,         // COOPERATIVE_LAUNCH
        97 => 232_448,   // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        102 => 1,        // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1,        // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        106 => 32,       // MAX_BLOCKS_PER_MULTIPROCESSOR
        111 => 1024,     // RESERVED_SHARED_MEMORY_PER_BLOCK
        115 => 1,        // MEMORY_POOLS_SUPPORTED
        _ if (1..=200).contains(&attr) => 0,
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_attributes() {
        assert_eq!(stream_of(0), Ok(StreamId::Null));
        assert_eq!(stream_of(1), Ok(StreamId::Null));
        assert_eq!(stream_of(handle_of(5)), Ok(StreamId::Created(5)));
        assert_eq!(stream_of(7), Err(CuError::CUDA_ERROR_INVALID_HANDLE));
        assert_eq!(attribute(75), Ok(9));
        assert_eq!(attribute(16), Ok(132));
        assert_eq!(attribute(0), Err(CuError::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(set_current(12), Err(CuError::CUDA_ERROR_INVALID_CONTEXT));
        set_current(primary_context()).unwrap();
        assert_eq!(current(), primary_context());
        set_current(0).unwrap();
    }
}
