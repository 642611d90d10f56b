//! The runtime's state: what the program registered (fatbins, host stubs → kernel names,
//! kernel handles), the per-thread launch configuration stack and last error, each
//! device's sticky error, and the pinned host memory the runtime handed out.
//!
//! Runtime handles are the driver's: a `cudaStream_t` is the `CUstream` value, a
//! `cudaEvent_t` the `CUevent` value, so work the runtime enqueues and work enqueued
//! through the driver API order on the same streams.

pub mod error;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::device::{self, Device, Machine};
pub use error::{RtError, RtResult};

/// `dim3`, passed by value as C passes it (12 bytes in two integer registers).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    /// x.
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

impl Dim3 {
    /// `dim3(x, 1, 1)`.
    pub const fn x(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }

    /// x · y · z.
    pub fn count(self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
}

/// One `<<<grid, block, shared, stream>>>` configuration pushed by a launch stub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallConfig {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads in a block.
    pub block: Dim3,
    /// Dynamic shared memory in bytes.
    pub shared_mem: usize,
    /// The `cudaStream_t` value.
    pub stream: u64,
}

thread_local! {
    static LAST_ERROR: Cell<u32> = const { Cell::new(0) };
    static CALL_CONFIGS: RefCell<Vec<CallConfig>> = const { RefCell::new(Vec::new()) };
}

/// Each device's sticky error: set by a fault in a kernel on it, never cleared (0: none).
static STICKY: [AtomicU32; crate::config::MAX_DEVICES] =
    [const { AtomicU32::new(0) }; crate::config::MAX_DEVICES];

/// The device runtime calls on this thread act on: the current context's (0 when none).
fn current_device() -> usize {
    device::context_device(device::current()).unwrap_or(0)
}
static PANICKED: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs an export's body; a panic is logged once and becomes `on_panic`.
pub fn guard<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    // A process the driver's checkpoint API locked holds every call here until unlock.
    let _inside = crate::checkpoint::enter();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            if !PANICKED.swap(true, Ordering::Relaxed) {
                say!("simgpu: internal panic in a runtime call (reported as cudaErrorUnknown)");
            }
            on_panic
        }
    }
}

/// Runs a `cudaError_t` export's body inside [`guard`] and records a failure as this
/// thread's last error (as the real runtime does; `cudaErrorNotReady` from a query is a
/// status, not an error, and is not recorded).
pub fn entry(body: impl FnOnce() -> RtResult<()>) -> u32 {
    let result = guard(Err(RtError::cudaErrorUnknown), body);
    if let Err(e) = result {
        record(e);
    }
    RtError::to_code(result)
}

/// Records `e` as this thread's last error (and as the sticky error if it is one).
pub fn record(e: RtError) {
    if e == RtError::cudaErrorNotReady {
        return;
    }
    if e.is_sticky() {
        set_sticky_on(current_device(), e);
    }
    LAST_ERROR.with(|l| l.set(e.code()));
}

/// `cudaGetLastError` (`clear`) / `cudaPeekAtLastError`: this thread's last error, or
/// the current device's sticky error, which no call clears.
pub fn last_error(clear: bool) -> u32 {
    let sticky = STICKY[current_device()].load(Ordering::Acquire);
    let last = LAST_ERROR.with(|l| {
        let v = l.get();
        if clear {
            l.set(0);
        }
        v
    });
    if sticky != 0 {
        sticky
    } else {
        last
    }
}

/// The current device's sticky error, if a kernel on it has faulted.
pub fn sticky() -> RtResult<()> {
    sticky_on(current_device())
}

/// Device `device`'s sticky error, if a kernel on it has faulted.
pub fn sticky_on(device: usize) -> RtResult<()> {
    match STICKY.get(device).map_or(0, |s| s.load(Ordering::Acquire)) {
        0 => Ok(()),
        code => Err(RtError::from_code(code)),
    }
}

/// Marks device `device`'s context corrupt with a sticky error (a kernel's fault, seen
/// on one of its streams).
pub fn set_sticky_on(device: usize, e: RtError) {
    if let Some(s) = STICKY.get(device) {
        let _ = s.compare_exchange(0, e.code(), Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The runtime's error for a failed `cuInit`: no device is `cudaErrorNoDevice`, anything
/// else `cudaErrorInitializationError`.
fn init_error(e: crate::error::CuError) -> RtError {
    if e == crate::error::CuError::CUDA_ERROR_NO_DEVICE {
        RtError::cudaErrorNoDevice
    } else {
        RtError::cudaErrorInitializationError
    }
}

/// The machine, initialised on first use.
pub fn machine() -> RtResult<&'static Machine> {
    Machine::init().map_err(init_error)
}

/// The device for a runtime call: the machine initialised on first use, with device 0's
/// primary context made current on the calling thread when none is (as the real runtime
/// does); fails with the device's sticky error once a kernel on it has faulted.
pub fn context() -> RtResult<&'static Device> {
    let machine = machine()?;
    if device::current() == 0 {
        make_current(&machine.devices()[0]);
    }
    sticky()?;
    Ok(Device::with_context()?)
}

/// `cudaSetDevice`: `device`'s primary context becomes current on this thread.
pub fn make_current(device: &Device) {
    device.mark_runtime_active();
    // A visible device's primary context is always valid.
    let _ = device::set_current(device.primary_context());
}

/// The device and stream a `cudaStream_t` names (`cudaErrorInvalidResourceHandle` if
/// none): the current device's NULL stream, or a created stream on its device.
pub fn stream(handle: u64) -> RtResult<(&'static Device, crate::stream::StreamId)> {
    Ok(machine()?.stream(handle)?)
}

/// Pushes a launch configuration (`__cudaPushCallConfiguration`).
pub fn push_config(config: CallConfig) {
    CALL_CONFIGS.with(|c| c.borrow_mut().push(config));
}

/// Pops the last launch configuration (`__cudaPopCallConfiguration`).
pub fn pop_config() -> Option<CallConfig> {
    CALL_CONFIGS.with(|c| c.borrow_mut().pop())
}

/// A registered kernel: its mangled device name and the fatbin it came from.
#[derive(Debug, Clone)]
pub struct Function {
    /// The mangled device name.
    pub name: Arc<str>,
    /// The registration handle of its fatbin.
    pub fatbin: usize,
}

#[derive(Default)]
struct Registry {
    /// Fatbin handle → the wrapper it was registered with.
    fatbins: HashMap<usize, usize>,
    /// Host stub → kernel.
    functions: HashMap<usize, Function>,
    /// Kernel handle → host stub, and back.
    kernels: HashMap<usize, usize>,
    handles: HashMap<usize, usize>,
    next_kernel: usize,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

/// Records a fatbin registration; returns its handle (a `void**` the program keeps).
pub fn register_fatbin(wrapper: usize) -> usize {
    // The handle is a pointer to a word, as the real runtime's is; it is never freed,
    // since a program may hold it until exit.
    let handle = Box::leak(Box::new(wrapper)) as *mut usize as usize;
    lock(&REGISTRY).fatbins.insert(handle, wrapper);
    handle
}

/// Forgets a fatbin and its kernels.
pub fn unregister_fatbin(handle: usize) {
    let mut r = lock(&REGISTRY);
    r.fatbins.remove(&handle);
    r.functions.retain(|_, f| f.fatbin != handle);
    let Registry {
        functions,
        kernels,
        handles,
        ..
    } = &mut *r;
    kernels.retain(|_, host| functions.contains_key(host));
    handles.retain(|host, _| functions.contains_key(host));
}

/// Records host stub `host_fun` → kernel `name` in fatbin `handle`.
pub fn register_function(handle: usize, host_fun: usize, name: &str) {
    lock(&REGISTRY).functions.insert(
        host_fun,
        Function {
            name: name.into(),
            fatbin: handle,
        },
    );
}

/// The kernel registered for a host stub.
pub fn function(host_fun: usize) -> RtResult<Function> {
    lock(&REGISTRY)
        .functions
        .get(&host_fun)
        .cloned()
        .ok_or(RtError::cudaErrorInvalidDeviceFunction)
}

/// `__cudaGetKernel`: the kernel handle of a registered host stub (the same one each time).
pub fn kernel_handle(host_fun: usize) -> RtResult<usize> {
    let mut r = lock(&REGISTRY);
    if !r.functions.contains_key(&host_fun) {
        return Err(RtError::cudaErrorInvalidDeviceFunction);
    }
    if let Some(&k) = r.handles.get(&host_fun) {
        return Ok(k);
    }
    r.next_kernel += 1;
    // Non-null and 16-aligned; never dereferenced.
    let k = 0x7e57_0000_0000 + (r.next_kernel << 4);
    r.kernels.insert(k, host_fun);
    r.handles.insert(host_fun, k);
    Ok(k)
}

/// The kernel behind a handle from [`kernel_handle`].
pub fn function_of_kernel(kernel: usize) -> RtResult<Function> {
    let r = lock(&REGISTRY);
    r.kernels
        .get(&kernel)
        .and_then(|host| r.functions.get(host))
        .cloned()
        .ok_or(RtError::cudaErrorInvalidResourceHandle)
}

static PINNED: LazyLock<Mutex<BTreeMap<u64, u64>>> = LazyLock::new(Default::default);

/// Records pinned host memory the runtime allocated or registered.
pub fn add_pinned(addr: u64, size: u64) {
    lock(&PINNED).insert(addr, size);
}

/// Forgets pinned host memory.
pub fn remove_pinned(addr: u64) {
    lock(&PINNED).remove(&addr);
}

/// Whether `addr` lies in pinned host memory the runtime handed out.
pub fn is_pinned(addr: u64) -> bool {
    lock(&PINNED)
        .range(..=addr)
        .next_back()
        .is_some_and(|(&a, &s)| addr < a + s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_is_per_thread_and_cleared_by_get() {
        std::thread::spawn(|| {
            assert_eq!(last_error(true), 0);
            assert_eq!(entry(|| Err(RtError::cudaErrorInvalidValue)), 1);
            assert_eq!(entry(|| Ok(())), 0);
            assert_eq!(last_error(false), 1, "peek keeps it");
            assert_eq!(last_error(true), 1);
            assert_eq!(last_error(true), 0, "get cleared it");
            assert_eq!(entry(|| Err(RtError::cudaErrorNotReady)), 600);
            assert_eq!(last_error(true), 0, "not-ready is a status");
            assert_eq!(entry(|| panic!("a bug")), 999);
            assert_eq!(last_error(true), 999);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn registration_maps_stubs_to_names_and_handles() {
        let h = register_fatbin(0x1000);
        register_function(h, 0xabc0, "_Z3fooPf");
        assert_eq!(&*function(0xabc0).unwrap().name, "_Z3fooPf");
        let k = kernel_handle(0xabc0).unwrap();
        assert_eq!(kernel_handle(0xabc0), Ok(k));
        assert_eq!(&*function_of_kernel(k).unwrap().name, "_Z3fooPf");
        assert_eq!(
            kernel_handle(0xdead0),
            Err(RtError::cudaErrorInvalidDeviceFunction)
        );
        unregister_fatbin(h);
        assert!(function(0xabc0).is_err());
        assert!(function_of_kernel(k).is_err());
    }

    #[test]
    fn call_configurations_stack() {
        let c = CallConfig {
            grid: Dim3::x(4),
            block: Dim3::x(256),
            shared_mem: 0,
            stream: 0,
        };
        push_config(c);
        push_config(CallConfig { shared_mem: 8, ..c });
        assert_eq!(pop_config().map(|c| c.shared_mem), Some(8));
        assert_eq!(pop_config(), Some(c));
        assert_eq!(pop_config(), None);
    }
}
