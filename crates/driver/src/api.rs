//! The [`Driver`] trait: the CUDA driver calls cudaw needs, with Rust types at the edges.

use crate::error::Result;
use crate::sys;

/// A device ordinal handle (`CUdevice`).
pub type Device = sys::CUdevice;

/// A context (`CUcontext`), as an address so it can cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Context(pub usize);

impl Context {
    /// No context (`cuCtxSetCurrent(NULL)` detaches the thread).
    pub const NONE: Context = Context(0);
}

/// A stream (`CUstream`), as an address so it can cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(pub usize);

impl Stream {
    /// The NULL (legacy default) stream.
    pub const NULL: Stream = Stream(0);
}

/// An event (`CUevent`), as an address so it can cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event(pub usize);

/// A physical memory allocation (`CUmemGenericAllocationHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PhysicalHandle(pub u64);

/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: u32 = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_MEMHOSTALLOC_PORTABLE`.
pub const MEMHOSTALLOC_PORTABLE: u32 = 0x1;
/// `CU_LIMIT_STACK_SIZE`: per-thread stack bytes; a context reserves local memory for it
/// on every resident thread of the GPU (about 260 MiB on an H100 at the default 1 KiB).
pub const LIMIT_STACK_SIZE: u32 = 0;

impl Stream {
    /// `CU_STREAM_LEGACY`: the legacy default stream of the current context, whatever the
    /// caller was compiled with.
    pub const LEGACY: Stream = Stream(0x1);
    /// `CU_STREAM_PER_THREAD`: the calling thread's default stream in the current context.
    pub const PER_THREAD: Stream = Stream(0x2);
}

/// What the driver knows of a host or device address (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryType {
    /// Unknown to CUDA: ordinary pageable host memory (`CUDA_ERROR_INVALID_VALUE`).
    Pageable,
    /// Page-locked host memory (`cuMemHostAlloc`, `cuMemHostRegister`).
    Host,
    /// Device memory, managed memory or an array: any other `CUmemorytype` value.
    Other(u32),
}

/// The CUDA driver API subset cudaw uses. Object safe; implementations are shared between
/// threads. Each method names the driver function it calls. Device addresses are `u64`.
///
/// As in the driver, most calls need a context current on the calling thread
/// ([`Driver::ctx_set_current`]).
pub trait Driver: Send + Sync {
    /// `cuInit(0)`.
    fn init(&self) -> Result<()>;
    /// `cuDriverGetVersion` (13000 for CUDA 13.0).
    fn driver_version(&self) -> Result<i32>;
    /// `cuGetErrorName`, when the driver knows the code.
    fn error_name(&self, code: u32) -> Option<String>;

    /// `cuDeviceGetCount`.
    fn device_count(&self) -> Result<i32>;
    /// `cuDeviceGet`.
    fn device_get(&self, ordinal: i32) -> Result<Device>;
    /// `cuDeviceGetAttribute`.
    fn device_attribute(&self, device: Device, attribute: sys::CUdevice_attribute) -> Result<i32>;
    /// `cuDeviceGetName`.
    fn device_name(&self, device: Device) -> Result<String>;
    /// `cuDeviceTotalMem_v2`.
    fn device_total_mem(&self, device: Device) -> Result<u64>;
    /// `cuDeviceGetUuid_v2` (else `cuDeviceGetUuid`): the 16 bytes of the GPU's UUID.
    fn device_uuid(&self, device: Device) -> Result<[u8; 16]>;

    /// `cuDevicePrimaryCtxRetain`.
    fn primary_ctx_retain(&self, device: Device) -> Result<Context>;
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn primary_ctx_release(&self, device: Device) -> Result<()>;
    /// `cuCtxSetCurrent`.
    fn ctx_set_current(&self, context: Context) -> Result<()>;
    /// `cuCtxGetCurrent` ([`Context::NONE`] when the thread has none).
    fn ctx_get_current(&self) -> Result<Context>;
    /// `cuCtxSynchronize`.
    fn ctx_synchronize(&self) -> Result<()>;
    /// `cuCtxGetLimit` of the current context ([`LIMIT_STACK_SIZE`], ...).
    fn ctx_get_limit(&self, limit: u32) -> Result<usize>;
    /// `cuCtxSetLimit` of the current context.
    fn ctx_set_limit(&self, limit: u32, value: usize) -> Result<()>;
    /// `cuMemGetInfo_v2`: (free, total) bytes.
    fn mem_get_info(&self) -> Result<(u64, u64)>;

    /// `cuMemAddressReserve(size, alignment, hint, 0)`.
    fn mem_address_reserve(&self, size: u64, alignment: u64, hint: u64) -> Result<u64>;
    /// `cuMemAddressFree`.
    fn mem_address_free(&self, addr: u64, size: u64) -> Result<()>;
    /// `cuMemCreate(size, prop, 0)`.
    fn mem_create(&self, size: u64, prop: &sys::CUmemAllocationProp) -> Result<PhysicalHandle>;
    /// `cuMemRelease`.
    fn mem_release(&self, handle: PhysicalHandle) -> Result<()>;
    /// `cuMemMap(addr, size, 0, handle, 0)`.
    fn mem_map(&self, addr: u64, size: u64, handle: PhysicalHandle) -> Result<()>;
    /// `cuMemUnmap`.
    fn mem_unmap(&self, addr: u64, size: u64) -> Result<()>;
    /// `cuMemSetAccess`.
    fn mem_set_access(&self, addr: u64, size: u64, access: &[sys::CUmemAccessDesc]) -> Result<()>;
    /// `cuMemGetAllocationGranularity`.
    fn mem_allocation_granularity(
        &self,
        prop: &sys::CUmemAllocationProp,
        option: sys::CUmemAllocationGranularity_flags,
    ) -> Result<u64>;

    /// `cuMemAlloc_v2`.
    fn mem_alloc(&self, size: u64) -> Result<u64>;
    /// `cuMemFree_v2`.
    fn mem_free(&self, addr: u64) -> Result<()>;
    /// `cuMemHostAlloc`: page-locked host memory.
    fn mem_host_alloc(&self, size: usize, flags: u32) -> Result<*mut u8>;
    /// `cuMemFreeHost`.
    ///
    /// # Safety
    /// `ptr` came from [`Driver::mem_host_alloc`] and nothing uses it any more.
    unsafe fn mem_free_host(&self, ptr: *mut u8) -> Result<()>;
    /// `cuMemHostRegister_v2`.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` is host memory that stays allocated until unregistered.
    unsafe fn mem_host_register(&self, ptr: *mut u8, size: usize, flags: u32) -> Result<()>;
    /// `cuMemHostUnregister`.
    ///
    /// # Safety
    /// `ptr` was registered with [`Driver::mem_host_register`].
    unsafe fn mem_host_unregister(&self, ptr: *mut u8) -> Result<()>;

    /// `cuMemcpyHtoD_v2`.
    fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// `cuMemcpyDtoH_v2`.
    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// `cuMemcpyDtoD_v2`.
    fn memcpy_dtod(&self, dst: u64, src: u64, len: usize) -> Result<()>;
    /// `cuMemcpyHtoDAsync_v2`.
    ///
    /// # Safety
    /// `[src, src + len)` stays valid and unchanged until the stream has done the copy.
    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> Result<()>;
    /// `cuMemcpyDtoHAsync_v2`.
    ///
    /// # Safety
    /// `[dst, dst + len)` stays valid, and is neither read nor written by anyone else,
    /// until the stream has done the copy.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Stream,
    ) -> Result<()>;
    /// `cuMemcpyDtoDAsync_v2`.
    fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, stream: Stream) -> Result<()>;
    /// `cuMemsetD8_v2`.
    fn memset_d8(&self, dst: u64, value: u8, len: usize) -> Result<()>;
    /// `cuMemsetD8Async`.
    fn memset_d8_async(&self, dst: u64, value: u8, len: usize, stream: Stream) -> Result<()>;

    /// `cuStreamCreate`.
    fn stream_create(&self, flags: u32) -> Result<Stream>;
    /// `cuStreamDestroy_v2`.
    fn stream_destroy(&self, stream: Stream) -> Result<()>;
    /// `cuStreamSynchronize`.
    fn stream_synchronize(&self, stream: Stream) -> Result<()>;
    /// `cuStreamQuery`: `true` when all its work is done, `false` on `CUDA_ERROR_NOT_READY`.
    fn stream_query(&self, stream: Stream) -> Result<bool>;
    /// `cuStreamWaitEvent(stream, event, 0)`: the stream's later work waits until the
    /// event's last record is reached (the event may belong to another context).
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()>;
    /// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)` of `ptr`:
    /// [`MemoryType::Pageable`] where the driver answers `CUDA_ERROR_INVALID_VALUE` (host
    /// memory it does not know).
    fn pointer_memory_type(&self, ptr: u64) -> Result<MemoryType>;

    /// `cuEventCreate`.
    fn event_create(&self, flags: u32) -> Result<Event>;
    /// `cuEventRecord`.
    fn event_record(&self, event: Event, stream: Stream) -> Result<()>;
    /// `cuEventSynchronize`.
    fn event_synchronize(&self, event: Event) -> Result<()>;
    /// `cuEventQuery`: `true` when reached, `false` on `CUDA_ERROR_NOT_READY`.
    fn event_query(&self, event: Event) -> Result<bool>;
    /// `cuEventElapsedTime_v2` (or `cuEventElapsedTime`): milliseconds.
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32>;
    /// `cuEventDestroy_v2`.
    fn event_destroy(&self, event: Event) -> Result<()>;
}

/// The allocation properties cudaw uses: pinned device memory on `device`, no shareable
/// handle type.
pub fn pinned_device_prop(device: Device) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// No access for `device` (what takes a peer's access away).
pub fn no_access(device: Device) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
    }
}

/// Read/write access for `device`.
pub fn read_write_access(device: Device) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}
