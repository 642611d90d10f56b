//! The hook table the driver shim (cudaw's `libcuda.so.1`) finds with
//! `dlsym(RTLD_DEFAULT, "cudaw_runtime_hooks_v1")` to share this library's state: the pause
//! gate, who may pass it while paused, the pause machinery, and the memory budgets (the
//! contract: `driver::hooks`).

use crate::{gate, memory};
use cudaw_engine::{control::install_once, inflight as pause};
use driver::hooks::{RuntimeHooks, CHARGED, NOT_CHARGED, REFUSED};

extern "C" fn wait_while_paused() {
    crate::boundary::guard("the driver shim's gate", (), gate::wait_while_paused)
}

extern "C" fn may_pass() -> bool {
    crate::boundary::guard("the driver shim's gate", true, || {
        pause::in_wrapped_call() || pause::is_cudaw_thread() || crate::inflight::active()
    })
}

extern "C" fn inflight_register(block: *const driver::inflight::Block) {
    crate::boundary::guard("registering a driver call in flight", (), || {
        crate::inflight::register_foreign(block)
    })
}

extern "C" fn inflight_unregister(block: *const driver::inflight::Block) {
    crate::boundary::guard("unregistering a driver call in flight", (), || {
        crate::inflight::REGISTRY.unregister(block)
    })
}

extern "C" fn install_pause() {
    crate::boundary::guard("installing pause for the driver shim", (), || {
        for w in &crate::config::get().warnings {
            crate::log::warn(format_args!("{w}"));
        }
        install_once()
    })
}

extern "C" fn charge(ordinal: i32, bytes: u64) -> i32 {
    crate::boundary::guard(
        "charging a driver allocation",
        NOT_CHARGED,
        || match memory::budget(ordinal) {
            Ok(b) => match b.try_acquire(bytes) {
                Ok(()) => CHARGED,
                Err(_) => REFUSED,
            },
            Err(_) => NOT_CHARGED,
        },
    )
}

extern "C" fn uncharge(ordinal: i32, bytes: u64) {
    crate::boundary::guard("giving back a driver allocation", (), || {
        memory::uncharge(ordinal, bytes)
    })
}

static HOOKS: RuntimeHooks = RuntimeHooks {
    size: std::mem::size_of::<RuntimeHooks>(),
    gate: &gate::GATE.word,
    wait_while_paused,
    may_pass,
    install_pause,
    charge,
    uncharge,
    inflight_register,
    inflight_unregister,
};

/// The hook table (exported; see the module docs).
#[no_mangle]
pub extern "C" fn cudaw_runtime_hooks_v1() -> *const RuntimeHooks {
    // The driver layer may ask before this library's constructor ran (its own
    // constructor first): the engine gets its host before any hook runs.
    crate::host::install();
    &HOOKS
}

/// One `extern "C"` function per field of [`driver::hooks::HandleHooks`], each the driver
/// layer's call (named for the log, `(driver layer)` added) of a [`crate::handles`]
/// function inside the panic boundary, and the table of them. `unsafe`: the handles
/// function reads or writes the program's pointers, which the driver shim passes on.
macro_rules! handle_hooks {
    ($($field:ident: $call:literal => $(#$unsafe:ident)? $f:ident($($a:ident: $t:ty),*);)+) => {
        mod handle_hooks {
            use crate::boundary::guard;
            use crate::handles;
            use driver::hooks::HandleHooks;
            use std::ffi::c_void;

            /// `CUDA_ERROR_UNKNOWN`, for a panic.
            const UNKNOWN: u32 = 999;

            $(
            extern "C" fn $field($($a: $t),*) -> u32 {
                guard(concat!($call, " (driver layer)"), UNKNOWN, || {
                    handle_hooks!(@call $($unsafe)? handles::$f($($a),*))
                })
            }
            )+

            static HANDLES: HandleHooks = HandleHooks {
                size: std::mem::size_of::<HandleHooks>(),
                $($field),+
            };

            /// The handle table for the driver shim (`driver::hooks::RUNTIME_HANDLES_SYMBOL`).
            #[no_mangle]
            pub extern "C" fn cudaw_runtime_handles_v1() -> *const HandleHooks {
                // The driver layer may ask before this library's constructor ran (its
                // own constructor first): the engine gets its host before any hook runs.
                crate::host::install();
                &HANDLES
            }
        }
    };
    (@call unsafe $e:expr) => {
        // SAFETY: the program's pointers, passed on by the driver shim.
        unsafe { $e }
    };
    (@call $e:expr) => {
        $e
    };
}

handle_hooks! {
    mem_create: "cuMemCreate" => #unsafe create(
        out: *mut u64, size: usize, prop: *const c_void, flags: u64, charge: bool);
    mem_release: "cuMemRelease" => release(h: u64);
    mem_map: "cuMemMap" => map(ptr: u64, size: usize, offset: usize, h: u64, flags: u64);
    mem_unmap: "cuMemUnmap" => unmap(ptr: u64, size: usize);
    mem_set_access: "cuMemSetAccess" => #unsafe set_access(
        ptr: u64, size: usize, desc: *const c_void, count: usize);
    mem_properties: "cuMemGetAllocationPropertiesFromHandle" => #unsafe properties(
        prop: *mut c_void, h: u64);
    mem_export: "cuMemExportToShareableHandle" => export(
        out: *mut c_void, h: u64, kind: u32, flags: u64);
    mem_import: "cuMemImportFromShareableHandle" => #unsafe import(
        out: *mut u64, os: *mut c_void, kind: u32);
    mem_retain: "cuMemRetainAllocationHandle" => #unsafe retain(out: *mut u64, addr: *mut c_void);
    multicast_bind_mem: "cuMulticastBindMem" => bind(
        mc: u64, mco: usize, h: u64, off: usize, size: usize, flags: u64);
    multicast_bind_mem_v2: "cuMulticastBindMem_v2" => bind_v2(
        mc: u64, dev: i32, mco: usize, h: u64, off: usize, size: usize, flags: u64);
}

mod memory_hooks {
    //! `cuMemAlloc*` / `cuMemFree*` of the driver shim's callers, from the VMM (mapped
    //! addressing only: in translated addressing the program would get a pointer the real
    //! driver does not know, so the driver shim keeps forwarding those): the work is
    //! [`cudaw_engine::memory_calls`]' `driver_*` functions.
    use crate::boundary::guard;
    use crate::memory::tag;
    use cudaw_engine::memory_calls as calls;
    use driver::hooks::{MemoryHooks, HOST_CUT, HOST_PINNED, HOST_PLAIN};
    use std::ffi::c_void;

    /// `CUDA_ERROR_UNKNOWN`, for a panic.
    const UNKNOWN: u32 = 999;

    extern "C" fn mem_alloc(out: *mut u64, size: usize, ordinal: i32) -> u32 {
        guard("cuMemAlloc (driver layer)", UNKNOWN, || {
            calls::driver_alloc(out, size as u64, ordinal, tag::DRIVER)
        })
    }

    extern "C" fn mem_alloc_pitch(
        out: *mut u64,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element: u32,
        ordinal: i32,
    ) -> u32 {
        guard("cuMemAllocPitch (driver layer)", UNKNOWN, || {
            calls::driver_alloc_pitch(out, pitch, width, height, element, ordinal)
        })
    }

    extern "C" fn mem_free(ptr: u64) -> u32 {
        guard("cuMemFree (driver layer)", UNKNOWN, || {
            calls::driver_free(ptr, crate::tracing::free)
        })
    }

    extern "C" fn mem_free_async(ptr: u64, stream: *mut c_void) -> u32 {
        guard("cuMemFreeAsync (driver layer)", UNKNOWN, || {
            calls::driver_free_async(ptr, stream)
        })
    }

    extern "C" fn allocation(ptr: u64, base: *mut u64, size: *mut u64) -> bool {
        guard("a pointer query (driver layer)", false, || {
            calls::driver_allocation(ptr, base, size)
        })
    }

    extern "C" fn peer_access(accessor: i32, owner: i32, enabled: bool) {
        guard("peer access (driver layer)", (), || {
            if enabled {
                cudaw_engine::peer::enabled(accessor, owner);
            } else {
                cudaw_engine::peer::disabled(accessor, owner);
            }
        })
    }

    extern "C" fn host_register(ptr: u64, size: u64) {
        guard("cuMemHostRegister (driver layer)", (), || {
            cudaw_engine::pinning::release(ptr, size, true)
        })
    }

    extern "C" fn host_copy(host: u64, len: u64, asynchronous: bool, cuts: *mut [u64; 2]) -> u32 {
        guard("a copy's host side (driver layer)", HOST_PLAIN, || {
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            let mut flags = HOST_PLAIN;
            if asynchronous && cudaw_engine::pinning::touching(host, len) {
                flags |= HOST_PINNED;
            }
            if let Some(c) = cudaw_engine::pinning::crossing(host, len) {
                if !cuts.is_null() {
                    // SAFETY: the driver shim passes its own array (or null, checked).
                    unsafe { cuts.write(c.offsets()) };
                    flags |= HOST_CUT;
                }
            }
            flags
        })
    }

    static MEMORY: MemoryHooks = MemoryHooks {
        size: std::mem::size_of::<MemoryHooks>(),
        mem_alloc,
        mem_alloc_pitch,
        mem_free,
        mem_free_async,
        allocation,
        peer_access,
        host_register,
        host_copy,
    };

    /// The memory table for the driver shim (`driver::hooks::RUNTIME_MEMORY_SYMBOL`).
    #[no_mangle]
    pub extern "C" fn cudaw_runtime_memory_v1() -> *const MemoryHooks {
        // The driver layer may ask before this library's constructor ran (its own
        // constructor first): the engine gets its host before any hook runs.
        crate::host::install();
        &MEMORY
    }
}

mod trace_hooks {
    //! The tracing store for the driver shim: launches and copies made through the driver
    //! by callers other than this library (cuBLAS, cuDNN, Triton) join the same counters,
    //! memory history and timeline as the runtime's (`crate::tracing`).
    use crate::boundary::guard;
    use crate::tracing;
    use cudaw_engine::trace;
    use cudaw_trace::{Direction, Tracer};
    use driver::hooks::{TraceHooks, TraceLaunch, TRACE_OFF};

    /// The tracer, set up on the driver shim's first traced call if the runtime has not
    /// initialised yet (a program that calls only the driver).
    fn tracer() -> Option<&'static Tracer> {
        if !tracing::enabled() {
            return None;
        }
        crate::wrappers::init_tracing();
        tracing::tracer()
    }

    extern "C" fn mode() -> u32 {
        guard("the tracing mode (driver layer)", TRACE_OFF, || {
            trace::trace_mode_word(trace::driver_mode(tracing::mode()))
        })
    }

    extern "C" fn now() -> u64 {
        guard("the tracing clock (driver layer)", 0, || {
            tracer().map_or(0, |t| t.now())
        })
    }

    extern "C" fn kernel_id(name: *const u8, len: usize) -> u32 {
        guard("naming a kernel (driver layer)", u32::MAX, || {
            let Some(t) = tracer() else { return u32::MAX };
            if name.is_null() {
                return u32::MAX;
            }
            // SAFETY: the driver shim passes `len` bytes of a name it owns.
            let bytes = unsafe { std::slice::from_raw_parts(name, len) };
            t.kernel_id(&String::from_utf8_lossy(bytes))
        })
    }

    extern "C" fn record_launch(l: *const TraceLaunch) {
        guard("tracing a launch (driver layer)", (), || {
            record(l, |t, kernel| t.count_launch(kernel))
        })
    }

    extern "C" fn count_launch(kernel: u32) -> u32 {
        guard("counting a launch (driver layer)", 0, || match tracer() {
            Some(t) if kernel != u32::MAX => t.count_launch(kernel),
            _ => 0,
        })
    }

    extern "C" fn record_counted_launch(l: *const TraceLaunch, weight: u32) {
        guard("tracing a launch (driver layer)", (), || {
            record(l, |_, _| weight)
        })
    }

    extern "C" fn record_named_launch(
        l: *const TraceLaunch,
        name: *const u8,
        len: usize,
        params: *mut *mut std::ffi::c_void,
        weight: u32,
    ) -> u32 {
        guard("tracing a launch by name (driver layer)", 0, || {
            let Some(t) = tracer() else { return 0 };
            // SAFETY: the driver shim passes a launch record valid for this call.
            let Some(l) = (unsafe { l.as_ref() }) else {
                return 0;
            };
            if name.is_null() {
                return 0;
            }
            // SAFETY: the driver shim passes `len` bytes of a name it owns.
            let bytes = unsafe { std::slice::from_raw_parts(name, len) };
            let Ok(name) = std::str::from_utf8(bytes) else {
                return 0;
            };
            let sm = crate::wrappers::device_sm;
            // SAFETY: the driver shim passes the launch's argument array.
            u32::from(unsafe { trace::record_named_launch(t, l, name, params, weight, sm) })
        })
    }

    extern "C" fn thread_flags() -> *const std::sync::atomic::AtomicUsize {
        crate::inflight::thread_flags()
    }

    extern "C" fn buffer_sample() -> u32 {
        guard("the buffer sample (driver layer)", 1, || {
            crate::config::get().trace_buffer_sample.max(1)
        })
    }

    /// Records launch `l`, counted (or counted now) by `count`, which gives its weight.
    fn record(l: *const TraceLaunch, count: impl FnOnce(&Tracer, u32) -> u32) {
        let Some(t) = tracer() else { return };
        // SAFETY: the driver shim passes a launch record valid for this call.
        if let Some(l) = unsafe { l.as_ref() } {
            trace::record_driver_launch(t, l, count);
        }
    }

    extern "C" fn record_copy(
        direction: i32,
        bytes: u64,
        dst: u64,
        src: u64,
        start: u64,
        end: u64,
    ) {
        guard("tracing a copy (driver layer)", (), || {
            if let Some(t) = tracer() {
                t.record_copy(Direction::from_kind(direction), bytes, dst, src, start, end);
            }
        })
    }

    extern "C" fn memory_span(lo: *mut u64, hi: *mut u64) {
        guard("the memory span (driver layer)", (), || {
            let (l, h) = tracer().map_or((0, 0), |t| t.memory_span());
            // SAFETY: the driver shim passes two writable words of its own.
            unsafe {
                if let Some(lo) = lo.as_mut() {
                    *lo = l;
                }
                if let Some(hi) = hi.as_mut() {
                    *hi = h;
                }
            }
        })
    }

    static TRACE: TraceHooks = TraceHooks {
        size: std::mem::size_of::<TraceHooks>(),
        mode,
        now,
        kernel_id,
        record_launch,
        record_copy,
        memory_span,
        count_launch,
        record_counted_launch,
        buffer_sample,
        record_named_launch,
        thread_flags,
    };

    /// The tracing table for the driver shim (`driver::hooks::RUNTIME_TRACE_SYMBOL`).
    #[no_mangle]
    pub extern "C" fn cudaw_runtime_trace_v1() -> *const TraceHooks {
        // The driver layer may ask before this library's constructor ran (its own
        // constructor first): the engine gets its host before any hook runs.
        crate::host::install();
        &TRACE
    }
}
