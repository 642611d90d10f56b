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
