//! The hook table the driver shim (cudaw's `libcuda.so.1`) finds with
//! `dlsym(RTLD_DEFAULT, "cudaw_runtime_hooks_v1")` to share this library's state: the pause
//! gate, who may pass it while paused, the pause machinery, and the memory budgets (the
//! contract: `driver::hooks`).

use crate::{gate, memory, pause};
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
        pause::install_once()
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
    gate: &gate::GATE,
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
    &HOOKS
}

mod handle_hooks {
    use crate::boundary::guard;
    use crate::handles;
    use driver::hooks::HandleHooks;
    use std::ffi::c_void;

    /// `CUDA_ERROR_UNKNOWN`, for a panic.
    const UNKNOWN: u32 = 999;

    extern "C" fn mem_create(
        out: *mut u64,
        size: usize,
        prop: *const c_void,
        flags: u64,
        charge: bool,
    ) -> u32 {
        // SAFETY: the program's pointers, passed on by the driver shim.
        guard("cuMemCreate (driver layer)", UNKNOWN, || unsafe {
            handles::create(out, size, prop, flags, charge)
        })
    }
    extern "C" fn mem_release(h: u64) -> u32 {
        guard("cuMemRelease (driver layer)", UNKNOWN, || {
            handles::release(h)
        })
    }
    extern "C" fn mem_map(ptr: u64, size: usize, offset: usize, h: u64, flags: u64) -> u32 {
        guard("cuMemMap (driver layer)", UNKNOWN, || {
            handles::map(ptr, size, offset, h, flags)
        })
    }
    extern "C" fn mem_unmap(ptr: u64, size: usize) -> u32 {
        guard("cuMemUnmap (driver layer)", UNKNOWN, || {
            handles::unmap(ptr, size)
        })
    }
    extern "C" fn mem_set_access(ptr: u64, size: usize, desc: *const c_void, count: usize) -> u32 {
        // SAFETY: the program's descriptors, passed on by the driver shim.
        guard("cuMemSetAccess (driver layer)", UNKNOWN, || unsafe {
            handles::set_access(ptr, size, desc, count)
        })
    }
    extern "C" fn mem_properties(prop: *mut c_void, h: u64) -> u32 {
        // SAFETY: the program's out-pointer, passed on by the driver shim.
        guard(
            "cuMemGetAllocationPropertiesFromHandle (driver layer)",
            UNKNOWN,
            || unsafe { handles::properties(prop, h) },
        )
    }
    extern "C" fn mem_export(out: *mut c_void, h: u64, kind: u32, flags: u64) -> u32 {
        guard(
            "cuMemExportToShareableHandle (driver layer)",
            UNKNOWN,
            || handles::export(out, h, kind, flags),
        )
    }
    extern "C" fn mem_import(out: *mut u64, os: *mut c_void, kind: u32) -> u32 {
        // SAFETY: the program's out-pointer, passed on by the driver shim.
        guard(
            "cuMemImportFromShareableHandle (driver layer)",
            UNKNOWN,
            || unsafe { handles::import(out, os, kind) },
        )
    }
    extern "C" fn mem_retain(out: *mut u64, addr: *mut c_void) -> u32 {
        // SAFETY: the program's out-pointer, passed on by the driver shim.
        guard(
            "cuMemRetainAllocationHandle (driver layer)",
            UNKNOWN,
            || unsafe { handles::retain(out, addr) },
        )
    }
    extern "C" fn bind(mc: u64, mco: usize, h: u64, off: usize, size: usize, flags: u64) -> u32 {
        guard("cuMulticastBindMem (driver layer)", UNKNOWN, || {
            handles::bind(mc, mco, h, off, size, flags)
        })
    }
    extern "C" fn bind_v2(
        mc: u64,
        dev: i32,
        mco: usize,
        h: u64,
        off: usize,
        size: usize,
        flags: u64,
    ) -> u32 {
        guard("cuMulticastBindMem_v2 (driver layer)", UNKNOWN, || {
            handles::bind_v2(mc, dev, mco, h, off, size, flags)
        })
    }

    static HANDLES: HandleHooks = HandleHooks {
        size: std::mem::size_of::<HandleHooks>(),
        mem_create,
        mem_release,
        mem_map,
        mem_unmap,
        mem_set_access,
        mem_properties,
        mem_export,
        mem_import,
        mem_retain,
        multicast_bind_mem: bind,
        multicast_bind_mem_v2: bind_v2,
    };

    /// The handle table for the driver shim (`driver::hooks::RUNTIME_HANDLES_SYMBOL`).
    #[no_mangle]
    pub extern "C" fn cudaw_runtime_handles_v1() -> *const HandleHooks {
        &HANDLES
    }
}
