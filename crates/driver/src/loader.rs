//! [`LibCuda`]: the real backend. Loads `libcuda.so.1` (or `$CUDAW_LIBCUDA`) at run time
//! and resolves each driver function on its first use, remembering a missing one: a
//! missing symbol is an error code, never a panic.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::api::{Context, Device, Driver, Event, MemoryType, PhysicalHandle, Stream};
use crate::error::{
    known_name, DriverError, Result, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
};
use crate::sys;

/// The environment variable naming the driver library to load instead of `libcuda.so.1`.
pub const LIBCUDA_ENV: &str = "CUDAW_LIBCUDA";
/// The library loaded by default.
pub const DEFAULT_LIBCUDA: &str = "libcuda.so.1";

type Raw = *mut c_void;

/// Checks that each symbol has the signature `fn $args -> CUresult` in cuda.h.
macro_rules! check_symbols {
    ($args:tt $($symbol:ident)+) => {
        $( crate::check_signature!(driver, $symbol, unsafe extern "C" fn $args -> c_uint); )+
    };
}

/// One list of the driver functions used: field, signature, symbol names to try in order.
/// It expands into the lazily resolved function table; each symbol's signature is checked
/// against cuda.h's at compile time ([`crate::check_signature!`], `scripts/gen-signatures.py`).
macro_rules! driver_functions {
    ($( $field:ident ( $($ty:ty),* ) = [$($symbol:ident),+]; )*) => {
        $( check_symbols!(($($ty),*) $($symbol)+); )*

        /// The resolved functions: `None` inside the cell means "looked for, not there".
        #[allow(non_snake_case)]
        #[derive(Default)]
        struct Functions {
            $( $field: OnceLock<Option<unsafe extern "C" fn($($ty),*) -> c_uint>>, )*
        }

        #[allow(non_snake_case)]
        impl LibCuda {
            $(
                fn $field(&self) -> Result<unsafe extern "C" fn($($ty),*) -> c_uint> {
                    let resolved = self.functions.$field.get_or_init(|| {
                        [$(stringify!($symbol)),+].into_iter().find_map(|symbol| {
                            // SAFETY: the symbol is the driver function of this signature
                            // (from the CUDA headers); the library stays loaded as long as
                            // `self`, which owns every copy of the pointer.
                            unsafe {
                                self.library
                                    .get::<unsafe extern "C" fn($($ty),*) -> c_uint>(symbol.as_bytes())
                                    .ok()
                                    .map(|s| *s)
                            }
                        })
                    });
                    resolved.ok_or_else(|| DriverError {
                        code: CUDA_ERROR_NOT_FOUND,
                        name: "CUDA_ERROR_NOT_FOUND".into(),
                        call: [$(stringify!($symbol)),+][0],
                    })
                }
            )*
        }
    };
}

driver_functions! {
    cuInit(c_uint) = [cuInit];
    cuDriverGetVersion(*mut c_int) = [cuDriverGetVersion];
    cuGetErrorName(c_uint, *mut *const c_char) = [cuGetErrorName];
    cuDeviceGetCount(*mut c_int) = [cuDeviceGetCount];
    cuDeviceGet(*mut sys::CUdevice, c_int) = [cuDeviceGet];
    cuDeviceGetAttribute(*mut c_int, sys::CUdevice_attribute, sys::CUdevice) = [cuDeviceGetAttribute];
    cuDeviceGetName(*mut c_char, c_int, sys::CUdevice) = [cuDeviceGetName];
    cuDeviceTotalMem(*mut usize, sys::CUdevice) = [cuDeviceTotalMem_v2];
    cuDeviceGetUuid(*mut [u8; 16], sys::CUdevice) = [cuDeviceGetUuid_v2, cuDeviceGetUuid];
    cuDevicePrimaryCtxRetain(*mut Raw, sys::CUdevice) = [cuDevicePrimaryCtxRetain];
    cuDevicePrimaryCtxRelease(sys::CUdevice) = [cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease];
    cuCtxSetCurrent(Raw) = [cuCtxSetCurrent];
    cuCtxGetCurrent(*mut Raw) = [cuCtxGetCurrent];
    cuCtxSynchronize() = [cuCtxSynchronize];
    cuCtxGetLimit(*mut usize, c_uint) = [cuCtxGetLimit];
    cuCtxSetLimit(c_uint, usize) = [cuCtxSetLimit];
    cuMemGetInfo(*mut usize, *mut usize) = [cuMemGetInfo_v2];
    cuMemAddressReserve(*mut u64, usize, usize, u64, u64) = [cuMemAddressReserve];
    cuMemAddressFree(u64, usize) = [cuMemAddressFree];
    cuMemCreate(*mut u64, usize, *const sys::CUmemAllocationProp, u64) = [cuMemCreate];
    cuMemRelease(u64) = [cuMemRelease];
    cuMemMap(u64, usize, usize, u64, u64) = [cuMemMap];
    cuMemUnmap(u64, usize) = [cuMemUnmap];
    cuMemSetAccess(u64, usize, *const sys::CUmemAccessDesc, usize) = [cuMemSetAccess];
    cuMemGetAllocationGranularity(*mut usize, *const sys::CUmemAllocationProp, sys::CUmemAllocationGranularity_flags) = [cuMemGetAllocationGranularity];
    cuMemAlloc(*mut u64, usize) = [cuMemAlloc_v2];
    cuMemFree(u64) = [cuMemFree_v2];
    cuMemHostAlloc(*mut Raw, usize, c_uint) = [cuMemHostAlloc];
    cuMemFreeHost(Raw) = [cuMemFreeHost];
    cuMemHostRegister(Raw, usize, c_uint) = [cuMemHostRegister_v2, cuMemHostRegister];
    cuMemHostUnregister(Raw) = [cuMemHostUnregister];
    cuMemcpyHtoD(u64, *const c_void, usize) = [cuMemcpyHtoD_v2];
    cuMemcpyDtoH(Raw, u64, usize) = [cuMemcpyDtoH_v2];
    cuMemcpyDtoD(u64, u64, usize) = [cuMemcpyDtoD_v2];
    cuMemcpyHtoDAsync(u64, *const c_void, usize, Raw) = [cuMemcpyHtoDAsync_v2];
    cuMemcpyDtoHAsync(Raw, u64, usize, Raw) = [cuMemcpyDtoHAsync_v2];
    cuMemcpyDtoDAsync(u64, u64, usize, Raw) = [cuMemcpyDtoDAsync_v2];
    cuMemsetD8(u64, u8, usize) = [cuMemsetD8_v2];
    cuMemsetD8Async(u64, u8, usize, Raw) = [cuMemsetD8Async];
    cuStreamCreate(*mut Raw, c_uint) = [cuStreamCreate];
    cuStreamDestroy(Raw) = [cuStreamDestroy_v2];
    cuStreamSynchronize(Raw) = [cuStreamSynchronize];
    cuStreamQuery(Raw) = [cuStreamQuery];
    cuStreamWaitEvent(Raw, Raw, c_uint) = [cuStreamWaitEvent];
    cuPointerGetAttribute(*mut c_void, c_uint, u64) = [cuPointerGetAttribute];
    cuEventCreate(*mut Raw, c_uint) = [cuEventCreate];
    cuEventRecord(Raw, Raw) = [cuEventRecord];
    cuEventSynchronize(Raw) = [cuEventSynchronize];
    cuEventQuery(Raw) = [cuEventQuery];
    cuEventElapsedTime(*mut f32, Raw, Raw) = [cuEventElapsedTime_v2, cuEventElapsedTime];
    cuEventDestroy(Raw) = [cuEventDestroy_v2];
}

/// The driver, loaded from a shared library.
pub struct LibCuda {
    functions: Functions,
    path: String,
    // Declared last: dropped after nothing can call into it.
    library: libloading::Library,
}

// SAFETY: the function table is `OnceLock`s of plain function pointers, and the driver
// library is thread safe (every CUDA driver function may be called from any thread).
unsafe impl Send for LibCuda {}
// SAFETY: as for `Send`.
unsafe impl Sync for LibCuda {}

impl std::fmt::Debug for LibCuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibCuda")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LibCuda {
    /// Loads `$CUDAW_LIBCUDA`, or `libcuda.so.1`.
    pub fn open() -> Result<LibCuda> {
        let path = std::env::var(LIBCUDA_ENV).unwrap_or_else(|_| DEFAULT_LIBCUDA.to_owned());
        Self::open_path(&path)
    }

    /// Loads the driver library at `path` (a file name is looked up by the dynamic loader).
    /// When that library is cudaw's driver shim (it is `libcuda.so.1` in a process run
    /// under cudaw), loads the real driver the shim forwards to instead: cudaw's own driver
    /// calls never pass its own gate nor count as the program's.
    pub fn open_path(path: &str) -> Result<LibCuda> {
        let library = load(path)?;
        let real = shim_real_path(&library);
        let (library, path) = match real {
            Some(Ok(real)) => (load(&real)?, real),
            Some(Err(())) => {
                return Err(DriverError {
                    code: CUDA_ERROR_NOT_FOUND,
                    name: format!("{path} is cudaw's driver shim, and it found no real driver"),
                    call: "dlopen",
                })
            }
            None => (library, path.to_owned()),
        };
        Ok(LibCuda {
            functions: Functions::default(),
            path,
            library,
        })
    }

    /// The address of the driver function `name` in the loaded library, for callers that
    /// forward a program's own arguments with the C signature of `cuda.h` (cudaw's handle
    /// table calls `cuMemMap` with an offset, `cuMemExportToShareableHandle`, ...).
    pub fn raw_symbol(&self, name: &CStr) -> Option<usize> {
        // SAFETY: looks the symbol up only, as an untyped address; the library stays loaded
        // as long as `self`, and callers call it with its cuda.h signature.
        unsafe {
            self.library
                .get::<*mut c_void>(name.to_bytes_with_nul())
                .ok()
                .map(|s| *s as usize)
        }
        .filter(|&p| p != 0)
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Turns a `CUresult` into a result, naming the error the way the driver does.
    fn check(&self, code: c_uint, call: &'static str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let name = self
            .error_name(code)
            .unwrap_or_else(|| format!("CUDA_ERROR_{code}"));
        Err(DriverError { code, name, call })
    }
}

/// Loads one library.
fn load(path: &str) -> Result<libloading::Library> {
    // SAFETY: loading a CUDA driver library runs its initialisers, which is what any
    // CUDA program does; the path is the user's choice of driver.
    unsafe { libloading::Library::new(path) }.map_err(|e| DriverError {
        code: CUDA_ERROR_NOT_FOUND,
        name: format!("cannot load {path}: {e}"),
        call: "dlopen",
    })
}

/// `None` when `library` is not cudaw's driver shim; else the real driver's path it
/// reports (`Err` when it found none).
fn shim_real_path(library: &libloading::Library) -> Option<std::result::Result<String, ()>> {
    let symbol = crate::hooks::DRIVER_SHIM_REAL_PATH_SYMBOL.to_bytes_with_nul();
    // SAFETY: the driver shim exports this name with exactly this signature; no other
    // library exports it.
    let f = unsafe { library.get::<extern "C" fn() -> *const c_char>(symbol) }.ok()?;
    let p = f();
    if p.is_null() {
        return Some(Err(()));
    }
    // SAFETY: a static NUL-terminated string owned by the driver shim.
    Some(Ok(unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()))
}

fn handle(p: Raw) -> usize {
    p as usize
}

fn raw(h: usize) -> Raw {
    h as Raw
}

impl Driver for LibCuda {
    fn init(&self) -> Result<()> {
        let f = self.cuInit()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(0) };
        self.check(code, "cuInit")
    }

    fn driver_version(&self) -> Result<i32> {
        let f = self.cuDriverGetVersion()?;
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut v) };
        self.check(code, "cuDriverGetVersion")?;
        Ok(v)
    }

    fn error_name(&self, code: u32) -> Option<String> {
        let from_driver = self.cuGetErrorName().ok().and_then(|f| {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: a valid out-pointer; the driver returns a static string.
            let ok = unsafe { f(code, &mut name) } == 0 && !name.is_null();
            ok.then(|| {
                // SAFETY: non-null, NUL-terminated static string from the driver.
                let text = unsafe { CStr::from_ptr(name) };
                text.to_string_lossy().into_owned()
            })
        });
        from_driver.or_else(|| known_name(code).map(str::to_owned))
    }

    fn device_count(&self) -> Result<i32> {
        let f = self.cuDeviceGetCount()?;
        let mut n = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut n) };
        self.check(code, "cuDeviceGetCount")?;
        Ok(n)
    }

    fn device_get(&self, ordinal: i32) -> Result<Device> {
        let f = self.cuDeviceGet()?;
        let mut d = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut d, ordinal) };
        self.check(code, "cuDeviceGet")?;
        Ok(d)
    }

    fn device_attribute(&self, device: Device, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let f = self.cuDeviceGetAttribute()?;
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut v, attribute, device) };
        self.check(code, "cuDeviceGetAttribute")?;
        Ok(v)
    }

    fn device_name(&self, device: Device) -> Result<String> {
        let f = self.cuDeviceGetName()?;
        let mut buf = [0u8; 256];
        // SAFETY: the buffer holds the length passed.
        let code = unsafe { f(buf.as_mut_ptr().cast(), buf.len() as c_int, device) };
        self.check(code, "cuDeviceGetName")?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    fn device_total_mem(&self, device: Device) -> Result<u64> {
        let f = self.cuDeviceTotalMem()?;
        let mut v = 0usize;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut v, device) };
        self.check(code, "cuDeviceTotalMem_v2")?;
        Ok(v as u64)
    }

    fn device_uuid(&self, device: Device) -> Result<[u8; 16]> {
        let f = self.cuDeviceGetUuid()?;
        let mut v = [0u8; 16];
        // SAFETY: a valid out-pointer to 16 bytes (a CUuuid).
        let code = unsafe { f(&mut v, device) };
        self.check(code, "cuDeviceGetUuid_v2")?;
        Ok(v)
    }

    fn primary_ctx_retain(&self, device: Device) -> Result<Context> {
        let f = self.cuDevicePrimaryCtxRetain()?;
        let mut c: Raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut c, device) };
        self.check(code, "cuDevicePrimaryCtxRetain")?;
        Ok(Context(handle(c)))
    }

    fn primary_ctx_release(&self, device: Device) -> Result<()> {
        let f = self.cuDevicePrimaryCtxRelease()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(device) };
        self.check(code, "cuDevicePrimaryCtxRelease_v2")
    }

    fn ctx_set_current(&self, context: Context) -> Result<()> {
        let f = self.cuCtxSetCurrent()?;
        // SAFETY: a context handle the driver gave out, or null.
        let code = unsafe { f(raw(context.0)) };
        self.check(code, "cuCtxSetCurrent")
    }

    fn ctx_get_current(&self) -> Result<Context> {
        let f = self.cuCtxGetCurrent()?;
        let mut c: Raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut c) };
        self.check(code, "cuCtxGetCurrent")?;
        Ok(Context(c as usize))
    }

    fn ctx_synchronize(&self) -> Result<()> {
        let f = self.cuCtxSynchronize()?;
        // SAFETY: no arguments.
        let code = unsafe { f() };
        self.check(code, "cuCtxSynchronize")
    }

    fn ctx_get_limit(&self, limit: u32) -> Result<usize> {
        let f = self.cuCtxGetLimit()?;
        let mut v = 0usize;
        // SAFETY: a valid out-pointer and a plain value.
        let code = unsafe { f(&mut v, limit) };
        self.check(code, "cuCtxGetLimit")?;
        Ok(v)
    }

    fn ctx_set_limit(&self, limit: u32, value: usize) -> Result<()> {
        let f = self.cuCtxSetLimit()?;
        // SAFETY: plain values.
        let code = unsafe { f(limit, value) };
        self.check(code, "cuCtxSetLimit")
    }

    fn mem_get_info(&self) -> Result<(u64, u64)> {
        let f = self.cuMemGetInfo()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        let code = unsafe { f(&mut free, &mut total) };
        self.check(code, "cuMemGetInfo_v2")?;
        Ok((free as u64, total as u64))
    }

    fn mem_address_reserve(&self, size: u64, alignment: u64, hint: u64) -> Result<u64> {
        let f = self.cuMemAddressReserve()?;
        let mut p = 0u64;
        // SAFETY: a valid out-pointer; the rest are values.
        let code = unsafe { f(&mut p, size as usize, alignment as usize, hint, 0) };
        self.check(code, "cuMemAddressReserve")?;
        Ok(p)
    }

    fn mem_address_free(&self, addr: u64, size: u64) -> Result<()> {
        let f = self.cuMemAddressFree()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(addr, size as usize) };
        self.check(code, "cuMemAddressFree")
    }

    fn mem_create(&self, size: u64, prop: &sys::CUmemAllocationProp) -> Result<PhysicalHandle> {
        let f = self.cuMemCreate()?;
        let mut h = 0u64;
        // SAFETY: a valid out-pointer and a valid property struct.
        let code = unsafe { f(&mut h, size as usize, prop, 0) };
        self.check(code, "cuMemCreate")?;
        Ok(PhysicalHandle(h))
    }

    fn mem_release(&self, handle: PhysicalHandle) -> Result<()> {
        let f = self.cuMemRelease()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(handle.0) };
        self.check(code, "cuMemRelease")
    }

    fn mem_map(&self, addr: u64, size: u64, handle: PhysicalHandle) -> Result<()> {
        let f = self.cuMemMap()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(addr, size as usize, 0, handle.0, 0) };
        self.check(code, "cuMemMap")
    }

    fn mem_unmap(&self, addr: u64, size: u64) -> Result<()> {
        let f = self.cuMemUnmap()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(addr, size as usize) };
        self.check(code, "cuMemUnmap")
    }

    fn mem_set_access(&self, addr: u64, size: u64, access: &[sys::CUmemAccessDesc]) -> Result<()> {
        let f = self.cuMemSetAccess()?;
        // SAFETY: the slice's pointer and length describe valid descriptors.
        let code = unsafe { f(addr, size as usize, access.as_ptr(), access.len()) };
        self.check(code, "cuMemSetAccess")
    }

    fn mem_allocation_granularity(
        &self,
        prop: &sys::CUmemAllocationProp,
        option: sys::CUmemAllocationGranularity_flags,
    ) -> Result<u64> {
        let f = self.cuMemGetAllocationGranularity()?;
        let mut g = 0usize;
        // SAFETY: a valid out-pointer and a valid property struct.
        let code = unsafe { f(&mut g, prop, option) };
        self.check(code, "cuMemGetAllocationGranularity")?;
        Ok(g as u64)
    }

    fn mem_alloc(&self, size: u64) -> Result<u64> {
        let f = self.cuMemAlloc()?;
        let mut p = 0u64;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut p, size as usize) };
        self.check(code, "cuMemAlloc_v2")?;
        Ok(p)
    }

    fn mem_free(&self, addr: u64) -> Result<()> {
        let f = self.cuMemFree()?;
        // SAFETY: plain value arguments.
        let code = unsafe { f(addr) };
        self.check(code, "cuMemFree_v2")
    }

    fn mem_host_alloc(&self, size: usize, flags: u32) -> Result<*mut u8> {
        let f = self.cuMemHostAlloc()?;
        let mut p: Raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut p, size, flags) };
        self.check(code, "cuMemHostAlloc")?;
        Ok(p.cast())
    }

    unsafe fn mem_free_host(&self, ptr: *mut u8) -> Result<()> {
        let f = self.cuMemFreeHost()?;
        // SAFETY: the caller's contract.
        let code = unsafe { f(ptr.cast()) };
        self.check(code, "cuMemFreeHost")
    }

    unsafe fn mem_host_register(&self, ptr: *mut u8, size: usize, flags: u32) -> Result<()> {
        let f = self.cuMemHostRegister()?;
        // SAFETY: the caller's contract.
        let code = unsafe { f(ptr.cast(), size, flags) };
        self.check(code, "cuMemHostRegister_v2")
    }

    unsafe fn mem_host_unregister(&self, ptr: *mut u8) -> Result<()> {
        let f = self.cuMemHostUnregister()?;
        // SAFETY: the caller's contract.
        let code = unsafe { f(ptr.cast()) };
        self.check(code, "cuMemHostUnregister")
    }

    fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        let f = self.cuMemcpyHtoD()?;
        // SAFETY: a synchronous copy from a live slice.
        let code = unsafe { f(dst, src.as_ptr().cast(), src.len()) };
        self.check(code, "cuMemcpyHtoD_v2")
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let f = self.cuMemcpyDtoH()?;
        // SAFETY: a synchronous copy into a live, exclusively borrowed slice.
        let code = unsafe { f(dst.as_mut_ptr().cast(), src, dst.len()) };
        self.check(code, "cuMemcpyDtoH_v2")
    }

    fn memcpy_dtod(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        let f = self.cuMemcpyDtoD()?;
        // SAFETY: device addresses only; the driver validates them.
        let code = unsafe { f(dst, src, len) };
        self.check(code, "cuMemcpyDtoD_v2")
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        let f = self.cuMemcpyHtoDAsync()?;
        // SAFETY: the caller keeps the host range valid until the copy is done.
        let code = unsafe { f(dst, src.cast(), len, raw(stream.0)) };
        self.check(code, "cuMemcpyHtoDAsync_v2")
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        let f = self.cuMemcpyDtoHAsync()?;
        // SAFETY: the caller keeps the host range valid until the copy is done.
        let code = unsafe { f(dst.cast(), src, len, raw(stream.0)) };
        self.check(code, "cuMemcpyDtoHAsync_v2")
    }

    fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, stream: Stream) -> Result<()> {
        let f = self.cuMemcpyDtoDAsync()?;
        // SAFETY: device addresses only; the driver validates them.
        let code = unsafe { f(dst, src, len, raw(stream.0)) };
        self.check(code, "cuMemcpyDtoDAsync_v2")
    }

    fn memset_d8(&self, dst: u64, value: u8, len: usize) -> Result<()> {
        let f = self.cuMemsetD8()?;
        // SAFETY: device addresses only; the driver validates them.
        let code = unsafe { f(dst, value, len) };
        self.check(code, "cuMemsetD8_v2")
    }

    fn memset_d8_async(&self, dst: u64, value: u8, len: usize, stream: Stream) -> Result<()> {
        let f = self.cuMemsetD8Async()?;
        // SAFETY: device addresses only; the driver validates them.
        let code = unsafe { f(dst, value, len, raw(stream.0)) };
        self.check(code, "cuMemsetD8Async")
    }

    fn stream_create(&self, flags: u32) -> Result<Stream> {
        let f = self.cuStreamCreate()?;
        let mut s: Raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut s, flags) };
        self.check(code, "cuStreamCreate")?;
        Ok(Stream(handle(s)))
    }

    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        let f = self.cuStreamDestroy()?;
        // SAFETY: a handle the driver gave out; the driver validates it.
        let code = unsafe { f(raw(stream.0)) };
        self.check(code, "cuStreamDestroy_v2")
    }

    fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        let f = self.cuStreamSynchronize()?;
        // SAFETY: a handle the driver gave out; the driver validates it.
        let code = unsafe { f(raw(stream.0)) };
        self.check(code, "cuStreamSynchronize")
    }

    fn stream_query(&self, stream: Stream) -> Result<bool> {
        let f = self.cuStreamQuery()?;
        // SAFETY: a handle the driver gave out; the driver validates it.
        match unsafe { f(raw(stream.0)) } {
            CUDA_ERROR_NOT_READY => Ok(false),
            code => self.check(code, "cuStreamQuery").map(|()| true),
        }
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let f = self.cuStreamWaitEvent()?;
        // SAFETY: handles the driver gave out (or a program's stream); the driver validates
        // them.
        let code = unsafe { f(raw(stream.0), raw(event.0), 0) };
        self.check(code, "cuStreamWaitEvent")
    }

    fn pointer_memory_type(&self, ptr: u64) -> Result<MemoryType> {
        /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
        const MEMORY_TYPE: c_uint = 2;
        /// `CU_MEMORYTYPE_HOST`.
        const HOST: u32 = 1;
        let f = self.cuPointerGetAttribute()?;
        let mut kind: u32 = 0;
        // SAFETY: the attribute is a `CUmemorytype` (an unsigned int) written through a
        // valid out-pointer; the driver only looks the address up.
        let code = unsafe { f((&mut kind as *mut u32).cast(), MEMORY_TYPE, ptr) };
        match code {
            CUDA_ERROR_INVALID_VALUE => Ok(MemoryType::Pageable),
            code => self
                .check(code, "cuPointerGetAttribute")
                .map(|()| match kind {
                    HOST => MemoryType::Host,
                    other => MemoryType::Other(other),
                }),
        }
    }

    fn event_create(&self, flags: u32) -> Result<Event> {
        let f = self.cuEventCreate()?;
        let mut e: Raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut e, flags) };
        self.check(code, "cuEventCreate")?;
        Ok(Event(handle(e)))
    }

    fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        let f = self.cuEventRecord()?;
        // SAFETY: handles the driver gave out; the driver validates them.
        let code = unsafe { f(raw(event.0), raw(stream.0)) };
        self.check(code, "cuEventRecord")
    }

    fn event_synchronize(&self, event: Event) -> Result<()> {
        let f = self.cuEventSynchronize()?;
        // SAFETY: a handle the driver gave out; the driver validates it.
        let code = unsafe { f(raw(event.0)) };
        self.check(code, "cuEventSynchronize")
    }

    fn event_query(&self, event: Event) -> Result<bool> {
        let f = self.cuEventQuery()?;
        // SAFETY: a handle the driver gave out; the driver validates it.
        match unsafe { f(raw(event.0)) } {
            CUDA_ERROR_NOT_READY => Ok(false),
            code => self.check(code, "cuEventQuery").map(|()| true),
        }
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        let f = self.cuEventElapsedTime()?;
        let mut ms = 0f32;
        // SAFETY: a valid out-pointer; handles the driver validates.
        let code = unsafe { f(&mut ms, raw(start.0), raw(end.0)) };
        self.check(code, "cuEventElapsedTime")?;
        Ok(ms)
    }

    fn event_destroy(&self, event: Event) -> Result<()> {
        let f = self.cuEventDestroy()?;
        // SAFETY: a handle the driver gave out; the driver validates it.
        let code = unsafe { f(raw(event.0)) };
        self.check(code, "cuEventDestroy_v2")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let e = LibCuda::open_path("/nonexistent/libcuda.so.1").unwrap_err();
        assert_eq!(e.code, CUDA_ERROR_NOT_FOUND);
        assert_eq!(e.call, "dlopen");
    }

    #[test]
    fn a_missing_symbol_is_remembered_as_not_found() {
        // libc is loaded in every process and has none of the driver's symbols.
        let lib = LibCuda::open_path("libc.so.6").unwrap();
        for _ in 0..2 {
            let e = lib.init().unwrap_err();
            assert_eq!((e.code, e.call), (CUDA_ERROR_NOT_FOUND, "cuInit"));
        }
        assert!(lib.functions.cuInit.get().is_some_and(Option::is_none));
        assert_eq!(
            lib.error_name(2).as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY")
        );
    }
}
