//! The contract between cudaw's two libraries in one process: the runtime shim
//! (`libcudart.so.*`, which owns the pause gate, the memory and the control socket) and
//! the driver shim (`libcuda.so.1`, which sees what libraries that bypass the runtime ask
//! of the driver).
//!
//! The runtime shim exports [`RUNTIME_HOOKS_SYMBOL`], a function returning a pointer to a
//! static [`RuntimeHooks`]; the driver shim looks it up once with
//! `dlsym(RTLD_DEFAULT, ...)` and, when found, tests the runtime's gate word instead of its
//! own and charges allocations to the runtime's budgets. The driver shim in turn exports
//! [`DRIVER_SHIM_REAL_PATH_SYMBOL`], which [`crate::LibCuda`] asks so that cudaw's own
//! driver calls (the VMM, pause copies, staging) reach the real driver, never the shim.
//! The struct only grows: fields are appended, and `size` says how many a library has.

use std::sync::atomic::AtomicU32;

/// The runtime shim's export: `extern "C" fn() -> *const RuntimeHooks`.
pub const RUNTIME_HOOKS_SYMBOL: &std::ffi::CStr = c"cudaw_runtime_hooks_v1";

/// The driver shim's export: `extern "C" fn() -> *const c_char`, the path of the real
/// driver it forwards to (NUL-terminated, static; null when it found none).
pub const DRIVER_SHIM_REAL_PATH_SYMBOL: &std::ffi::CStr = c"cudaw_driver_shim_real_path";

/// The gate word's bit that means "paused: calls wait" (the runtime shim's `gate::PAUSED`).
pub const GATE_PAUSED: u32 = 2;

/// [`RuntimeHooks::charge`]: charged; give it back with `uncharge`.
pub const CHARGED: i32 = 1;
/// [`RuntimeHooks::charge`]: nothing charged (no budget for the device).
pub const NOT_CHARGED: i32 = 0;
/// [`RuntimeHooks::charge`]: the limit refuses it.
pub const REFUSED: i32 = -1;

/// What the runtime shim offers the driver shim.
#[repr(C)]
#[derive(Debug)]
pub struct RuntimeHooks {
    /// `size_of::<RuntimeHooks>()` of the library that filled it in.
    pub size: usize,
    /// The pause gate word; bit [`GATE_PAUSED`] set while paused.
    pub gate: *const AtomicU32,
    /// Blocks the calling thread while the gate is closed for pause.
    pub wait_while_paused: extern "C" fn(),
    /// Whether the calling thread must not wait at a closed gate: it is inside one of the
    /// runtime shim's wrapped calls or of its calls in flight (which pause waits for), or
    /// is one of cudaw's own threads (the control thread, which pauses). Such a thread's allocations are the
    /// runtime shim's to account, never the driver shim's.
    pub may_pass: extern "C" fn() -> bool,
    /// Installs the pause signals and the control socket if not yet done (a program that
    /// calls only the driver never initialises the runtime shim otherwise).
    pub install_pause: extern "C" fn(),
    /// Charges `bytes` of device memory on device `ordinal` to the process's budget:
    /// [`CHARGED`], [`NOT_CHARGED`] (the device has no budget; nothing to give back) or
    /// [`REFUSED`] (over the limit).
    pub charge: extern "C" fn(ordinal: i32, bytes: u64) -> i32,
    /// Gives back a charge made with `charge`.
    pub uncharge: extern "C" fn(ordinal: i32, bytes: u64),
    /// Registers a thread's in-flight block of the driver shim ([`crate::inflight`]) where
    /// pause reads it; the block stays alive until `inflight_unregister`.
    pub inflight_register: extern "C" fn(block: *const crate::inflight::Block),
    /// Unregisters a block (its thread is ending).
    pub inflight_unregister: extern "C" fn(block: *const crate::inflight::Block),
}

// SAFETY: the gate pointer is to a static atomic, and the functions are thread safe.
unsafe impl Sync for RuntimeHooks {}
// SAFETY: as for `Sync`.
unsafe impl Send for RuntimeHooks {}

/// The runtime shim's export for its handle table: `extern "C" fn() -> *const HandleHooks`.
/// A table of its own (beside [`RuntimeHooks`]), so that either grows alone.
pub const RUNTIME_HANDLES_SYMBOL: &std::ffi::CStr = c"cudaw_runtime_handles_v1";

/// The runtime shim's handle table (`crates/engine/src/handles.rs`): the driver shim's
/// `cuMemCreate` and every call that takes such a handle go through it, so that the
/// handles the program sees are virtual and a pause can evict the memory behind them.
/// Each function has the driver function's C signature (cuda.h) and returns its
/// `CUresult`; `mem_create`'s last argument says whether to charge the memory to the
/// device's budget. The struct only grows; `size` says how many fields a library has.
#[repr(C)]
#[derive(Debug)]
pub struct HandleHooks {
    /// `size_of::<HandleHooks>()` of the library that filled it in.
    pub size: usize,
    /// `cuMemCreate(handle, size, prop, flags)`, charged when the last argument is true.
    pub mem_create: extern "C" fn(*mut u64, usize, *const std::ffi::c_void, u64, bool) -> u32,
    /// `cuMemRelease(handle)`.
    pub mem_release: extern "C" fn(u64) -> u32,
    /// `cuMemMap(ptr, size, offset, handle, flags)`.
    pub mem_map: extern "C" fn(u64, usize, usize, u64, u64) -> u32,
    /// `cuMemUnmap(ptr, size)`.
    pub mem_unmap: extern "C" fn(u64, usize) -> u32,
    /// `cuMemSetAccess(ptr, size, desc, count)`.
    pub mem_set_access: extern "C" fn(u64, usize, *const std::ffi::c_void, usize) -> u32,
    /// `cuMemGetAllocationPropertiesFromHandle(prop, handle)`.
    pub mem_properties: extern "C" fn(*mut std::ffi::c_void, u64) -> u32,
    /// `cuMemExportToShareableHandle(out, handle, type, flags)`.
    pub mem_export: extern "C" fn(*mut std::ffi::c_void, u64, u32, u64) -> u32,
    /// `cuMemImportFromShareableHandle(handle, os_handle, type)`.
    pub mem_import: extern "C" fn(*mut u64, *mut std::ffi::c_void, u32) -> u32,
    /// `cuMemRetainAllocationHandle(handle, addr)`.
    pub mem_retain: extern "C" fn(*mut u64, *mut std::ffi::c_void) -> u32,
    /// `cuMulticastBindMem(mc, mc_offset, handle, offset, size, flags)`.
    pub multicast_bind_mem: extern "C" fn(u64, usize, u64, usize, usize, u64) -> u32,
    /// `cuMulticastBindMem_v2(mc, dev, mc_offset, handle, offset, size, flags)`.
    pub multicast_bind_mem_v2: extern "C" fn(u64, i32, usize, u64, usize, usize, u64) -> u32,
}

// SAFETY: a table of thread-safe functions.
unsafe impl Sync for HandleHooks {}
// SAFETY: as for `Sync`.
unsafe impl Send for HandleHooks {}

/// The runtime shim's export for its memory table: `extern "C" fn() -> *const MemoryHooks`.
/// A table of its own (beside [`RuntimeHooks`] and [`HandleHooks`]), so that each grows alone.
pub const RUNTIME_MEMORY_SYMBOL: &std::ffi::CStr = c"cudaw_runtime_memory_v1";

/// What a [`MemoryHooks`] function returns when the call is not the runtime's to serve: the
/// driver shim then does what it does without a runtime shim (forward and count). An
/// allocation gets it in translated addressing (the program must get a real device
/// address) or when the runtime has no VMM for the device; a free or query of a pointer
/// the VMM does not own gets it.
pub const NOT_MINE: u32 = u32::MAX;

/// The runtime shim's device memory for the driver shim's `cuMemAlloc*` / `cuMemFree*` and
/// pointer queries (`crates/cudart-shim/src/hooks.rs`): in mapped addressing the memory comes from
/// cudaw's VMM, as `cudaMalloc`'s does, so a pause evicts it and a checkpoint holds it.
/// The allocations take the device ordinal of the caller's current context; each function
/// returns a `CUresult` or [`NOT_MINE`]. The struct only grows; `size` says how many fields a
/// library has.
#[repr(C)]
#[derive(Debug)]
pub struct MemoryHooks {
    /// `size_of::<MemoryHooks>()` of the library that filled it in.
    pub size: usize,
    /// `cuMemAlloc(out, size)` on device `ordinal` (also serves `cuMemAllocAsync` and
    /// `cuMemAllocFromPoolAsync`: the memory is usable at once, on every stream).
    pub mem_alloc: extern "C" fn(out: *mut u64, size: usize, ordinal: i32) -> u32,
    /// `cuMemAllocPitch(out, pitch, width, height, element_size)` on device `ordinal`.
    pub mem_alloc_pitch:
        extern "C" fn(out: *mut u64, pitch: *mut usize, usize, usize, u32, ordinal: i32) -> u32,
    /// `cuMemFree(ptr)`: synchronous, as the driver's.
    pub mem_free: extern "C" fn(ptr: u64) -> u32,
    /// `cuMemFreeAsync(ptr, stream)`: released once `stream` reaches it.
    pub mem_free_async: extern "C" fn(ptr: u64, stream: *mut std::ffi::c_void) -> u32,
    /// The VMM allocation holding `ptr` (interior pointers included): writes its base and
    /// size and returns true, or returns false.
    pub allocation: extern "C" fn(ptr: u64, base: *mut u64, size: *mut u64) -> bool,
    /// After the driver enabled (`enabled`) or disabled peer access of device `accessor` to
    /// device `owner`'s memory (`cuCtxEnablePeerAccess` / `cuCtxDisablePeerAccess`): the
    /// runtime grants it on, or takes it from, the mappings of its memory on `owner`.
    pub peer_access: extern "C" fn(accessor: i32, owner: i32, enabled: bool),
    /// Before the program page-locks `[ptr, ptr + size)` itself (`cuMemHostRegister`):
    /// what smart pinning registered there is unregistered first (the driver would answer
    /// "already registered", which the program never sees natively).
    pub host_register: extern "C" fn(ptr: u64, size: u64),
    /// A copy through the driver's API whose host side is `[host, host + len)`, made by a
    /// caller other than the runtime shim: how smart pinning's registrations touch it, as
    /// flags. [`HOST_CUT`]: it crosses a border of them (the driver refuses a copy that
    /// starts inside a registration and runs past it), the first two cuts written to `cuts`
    /// (offsets into the copy, 0: none); [`HOST_PINNED`] (asked for an asynchronous copy):
    /// one touches it, so the driver would copy it truly asynchronously, where the
    /// pageable memory the program passed promises the source read, or the bytes there,
    /// when the call returns. [`HOST_PLAIN`] (no flag): neither.
    pub host_copy:
        extern "C" fn(host: u64, len: u64, asynchronous: bool, cuts: *mut [u64; 2]) -> u32,
}

/// [`MemoryHooks::host_copy`]: nothing of smart pinning's touches the host side.
pub const HOST_PLAIN: u32 = 0;
/// [`MemoryHooks::host_copy`]'s flag: the copy crosses a border; `cuts` written.
pub const HOST_CUT: u32 = 1;
/// [`MemoryHooks::host_copy`]'s flag: an asynchronous copy touching a registration of
/// cudaw's.
pub const HOST_PINNED: u32 = 2;

// SAFETY: a table of thread-safe functions.
unsafe impl Sync for MemoryHooks {}
// SAFETY: as for `Sync`.
unsafe impl Send for MemoryHooks {}

/// The runtime shim's export for its tracing table: `extern "C" fn() -> *const TraceHooks`.
/// A table of its own (beside the others), so that each grows alone.
pub const RUNTIME_TRACE_SYMBOL: &std::ffi::CStr = c"cudaw_runtime_trace_v1";
/// The name the driver shim exports its tracing switch under: `extern "C" fn(mode: u32)`
/// (one of the `TRACE_*` words), which the runtime shim calls when tracing is switched on
/// or off in a running process (`cudaw-ckpt tracing PID on|off`).
pub const TRACE_MODE_SYMBOL: &std::ffi::CStr = c"cudaw_driver_trace_mode_v1";

/// [`TraceHooks::mode`]: tracing is off.
pub const TRACE_OFF: u32 = 0;
/// [`TraceHooks::mode`]: counters and the memory history (`CUDAW_TRACE=metrics`).
pub const TRACE_METRICS: u32 = 1;
/// [`TraceHooks::mode`]: also the timeline (`CUDAW_TRACE=timeline`).
pub const TRACE_TIMELINE: u32 = 2;

/// One 8-byte word of a launch's arguments that may be a pointer, read through the
/// kernel's parameter layout, with the parameter it came from.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TraceWord {
    /// The parameter's ordinal.
    pub param: u16,
    /// The word.
    pub value: u64,
}

/// A launch made through the driver, as [`TraceHooks::record_launch`] takes it.
#[repr(C)]
#[derive(Debug)]
pub struct TraceLaunch {
    /// The kernel's id, from [`TraceHooks::kernel_id`].
    pub kernel: u32,
    /// Grid and block dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared: u32,
    /// The stream (a `CUstream`, 0 for the legacy default stream).
    pub stream: u64,
    /// Ticks ([`TraceHooks::now`]) before and after the launch (0 when not kept: metrics
    /// without pointer arguments).
    pub start: u64,
    /// As `start`.
    pub end: u64,
    /// The argument words that may be pointers (`words_len` of them; null when the
    /// kernel's layout is unknown).
    pub words: *const TraceWord,
    /// How many `words`.
    pub words_len: usize,
}

/// The runtime shim's tracing store (`crates/cudart-shim/src/hooks.rs`, `crates/trace`), for the
/// launches and copies made through the driver by callers other than cudaw's runtime
/// (cuBLAS, cuDNN, Triton). The struct only grows; `size` says how many fields a library has.
#[repr(C)]
#[derive(Debug)]
pub struct TraceHooks {
    /// `size_of::<TraceHooks>()` of the library that filled it in.
    pub size: usize,
    /// `CUDAW_TRACE`: [`TRACE_OFF`], [`TRACE_METRICS`] or [`TRACE_TIMELINE`] (fixed for the
    /// life of the process; reading it sets nothing up).
    pub mode: extern "C" fn() -> u32,
    /// The tracer's clock, in ticks (0 when tracing is off).
    pub now: extern "C" fn() -> u64,
    /// The tracer's id for the kernel of (mangled) name `name` (`len` bytes, UTF-8),
    /// `u32::MAX` when tracing is off.
    pub kernel_id: extern "C" fn(name: *const u8, len: usize) -> u32,
    /// Records a launch that succeeded.
    pub record_launch: extern "C" fn(launch: *const TraceLaunch),
    /// Records a copy that succeeded: `direction` a `cudaMemcpyKind` (0 HtoH, 1 HtoD, 2
    /// DtoH, 3 DtoD, 4 inferred from the addresses), `bytes` from `src` to `dst`, between
    /// ticks `start` and `end`.
    pub record_copy:
        extern "C" fn(direction: i32, bytes: u64, dst: u64, src: u64, start: u64, end: u64),
    /// Where the live allocations lie: the lowest base into `lo`, an end none passes into
    /// `hi` (both 0 with none, or with tracing off). A launch's argument words outside are
    /// no pointers into device memory the history knows, and are not handed over.
    pub memory_span: extern "C" fn(lo: *mut u64, hi: *mut u64),
    /// Counts a launch of kernel `kernel` (an id from `kernel_id`) on the calling thread and
    /// says whether to read its argument words: the weight to pass to
    /// `record_counted_launch`, 0 when they are not to be read (`CUDAW_TRACE_BUFFER_SAMPLE`).
    pub count_launch: extern "C" fn(kernel: u32) -> u32,
    /// Records a launch that succeeded and was counted with `count_launch`, which returned
    /// `weight` (its words are attributed only when it is not 0).
    pub record_counted_launch: extern "C" fn(launch: *const TraceLaunch, weight: u32),
    /// `CUDAW_TRACE_BUFFER_SAMPLE` (a power of two): with `metrics`, the driver shim counts
    /// launches itself (its per-thread counters, read with [`TRACED_LAUNCHES_SYMBOL`]) and
    /// hands over one launch in this many of each thread's launches of a handle (the first
    /// included), with this weight, to `record_counted_launch`.
    pub buffer_sample: extern "C" fn() -> u32,
    /// Records a launch that succeeded and was counted with weight `weight` (not 0) whose
    /// argument words the driver shim cannot read (no layout for its handle: the real
    /// runtime's own kernels on a driver without the module's image): the runtime shim
    /// reads them (`params`, the launch's kernel parameters) through the layout of the
    /// kernel of mangled name `name` (`len` bytes) that the program registered with it, if
    /// any. Returns 1 when recorded, 0 when the runtime knows no such kernel (nothing is
    /// recorded then).
    pub record_named_launch: extern "C" fn(
        launch: *const TraceLaunch,
        name: *const u8,
        len: usize,
        params: *mut *mut std::ffi::c_void,
        weight: u32,
    ) -> u32,
    /// The calling thread's flags word in the runtime shim (its in-flight block's
    /// `flags`, static TLS: valid for the thread's life, read by that thread only; null
    /// when there is none). Bit [`RECORDING_LAUNCH`] is set while the thread is inside a
    /// launch the runtime shim records itself (its launch wrappers' traced path), which
    /// the driver shim must then not record. The driver shim asks once per thread and
    /// keeps the address.
    pub thread_flags: extern "C" fn() -> *const std::sync::atomic::AtomicUsize,
}

/// [`TraceHooks::thread_flags`]: a launch the runtime shim records is under way.
pub const RECORDING_LAUNCH: usize = 1;

/// The name the driver shim exports its count of traced launches under:
/// `extern "C" fn(each: TracedLaunches, ctx: *mut c_void)`, which calls `each(ctx, name,
/// len, launches)` once per kernel (its mangled name, UTF-8, `len` bytes) with the launches
/// it counted with `metrics` on and did not hand to [`TraceHooks::count_launch`]. The
/// runtime shim adds them to its per-kernel counts when they are read.
pub const TRACED_LAUNCHES_SYMBOL: &std::ffi::CStr = c"cudaw_driver_traced_launches_v1";

/// The name the driver shim exports the process's kernel launches so far under:
/// `extern "C" fn() -> u64` (every kernel's, counted whether tracing is on or not).
pub const TOTAL_LAUNCHES_SYMBOL: &std::ffi::CStr = c"cudaw_driver_total_launches_v1";

/// The callback of [`TRACED_LAUNCHES_SYMBOL`].
pub type TracedLaunches =
    extern "C" fn(ctx: *mut std::ffi::c_void, name: *const u8, len: usize, launches: u64);

// SAFETY: a table of thread-safe functions.
unsafe impl Sync for TraceHooks {}
// SAFETY: as for `Sync`.
unsafe impl Send for TraceHooks {}
