//! The engine's host ([`cudaw_engine::Host`]): what the engine gets from this library —
//! the pause gate ([`crate::gate`]), the calls marked in flight ([`crate::inflight`]), the
//! real runtime's calls ([`crate::call_real!`]), the tracer ([`crate::tracing`]) and the
//! driver-level reservations ([`crate::entry_points`]). Installed by the load-time
//! constructor ([`crate::lifecycle`]) before anything else runs.

use crate::types::*;
use crate::{call_real, gate, tracing};
use cudaw_control::Reply;
use cudaw_engine::host::{Code, TracerRequest};
use cudaw_engine::trace;
use std::ffi::c_void;

/// This library, as the engine's host.
pub struct Shim;

static SHIM: Shim = Shim;

/// Installs this library as the engine's host (once).
pub fn install() {
    cudaw_engine::install(&SHIM);
}

fn ok(rc: cudaError_t) -> Result<(), Code> {
    if rc == SUCCESS {
        Ok(())
    } else {
        Err(rc)
    }
}

impl cudaw_engine::Host for Shim {
    fn close_gate(&self) {
        gate::close();
    }

    fn open_gate(&self) {
        gate::open();
    }

    fn open_gate_after_fork(&self) {
        gate::GATE.fetch_and(!gate::PAUSED, std::sync::atomic::Ordering::SeqCst);
    }

    fn gate_closed(&self) -> bool {
        gate::is_paused()
    }

    fn wait_while_closed(&self) {
        gate::wait_while_paused();
    }

    fn gate_waiters(&self) -> usize {
        gate::waiters()
    }

    fn in_marked_call(&self) -> bool {
        crate::inflight::active()
    }

    fn marked_calls_in_flight(&self) -> usize {
        crate::inflight::REGISTRY.busy()
    }

    fn runtime_loaded(&self) -> bool {
        crate::dispatch::initialised()
    }

    fn runtime_soname(&self) -> &'static str {
        crate::dispatch::SONAME
    }

    fn current_device(&self) -> Result<i32, Code> {
        let mut dev: i32 = 0;
        ok(call_real!(cudaGetDevice: fn(*mut i32) -> cudaError_t, &mut dev))?;
        Ok(dev)
    }

    fn initialise_runtime(&self) -> Result<(), Code> {
        ok(call_real!(cudaFree: fn(*mut c_void) -> cudaError_t, std::ptr::null_mut()))
    }

    fn device_properties(&self, ordinal: i32, prop: &mut [u64]) -> Result<(), Code> {
        let p = prop.as_mut_ptr() as *mut c_void;
        let mut rc =
            call_real!(cudaGetDeviceProperties_v2: fn(*mut c_void, i32) -> cudaError_t, p, ordinal);
        if rc == ERROR_NOT_SUPPORTED {
            rc = call_real!(cudaGetDeviceProperties: fn(*mut c_void, i32) -> cudaError_t, p, ordinal);
        }
        ok(rc)
    }

    fn synchronize_device(&self) -> Result<(), Code> {
        ok(call_real!(cudaDeviceSynchronize: fn() -> cudaError_t,))
    }

    fn record_event(&self, stream: usize) -> Result<usize, Code> {
        let mut ev: cudaEvent_t = std::ptr::null_mut();
        ok(call_real!(
            cudaEventCreateWithFlags: fn(*mut cudaEvent_t, u32) -> cudaError_t,
            &mut ev,
            EVENT_DISABLE_TIMING
        ))?;
        let stream = stream as cudaStream_t;
        let rc =
            call_real!(cudaEventRecord: fn(cudaEvent_t, cudaStream_t) -> cudaError_t, ev, stream);
        if rc != SUCCESS {
            call_real!(cudaEventDestroy: fn(cudaEvent_t) -> cudaError_t, ev);
            return Err(rc);
        }
        Ok(ev as usize)
    }

    fn event_done(&self, event: usize, wait: bool) -> bool {
        let ev = event as cudaEvent_t;
        let rc = if wait {
            call_real!(cudaEventSynchronize: fn(cudaEvent_t) -> cudaError_t, ev)
        } else {
            call_real!(cudaEventQuery: fn(cudaEvent_t) -> cudaError_t, ev)
        };
        rc != ERROR_NOT_READY
    }

    fn destroy_event(&self, event: usize) {
        call_real!(cudaEventDestroy: fn(cudaEvent_t) -> cudaError_t, event as cudaEvent_t);
    }

    fn trace_now(&self) -> u64 {
        tracing::now()
    }

    fn trace_pause(&self, resume: bool, start: u64, allocations: u64, bytes: u64) {
        tracing::pause(resume, start, allocations, bytes);
    }

    fn trace_alloc(&self, base: u64, size: u64, api: &'static str) {
        tracing::alloc(base, size, api);
    }

    fn tracer_request(&self, req: TracerRequest<'_>) -> Reply {
        let switch = |on| tracing::set_active(on, crate::wrappers::switch_launch_entries);
        trace::reply(req, switch, tracing::pending_calls)
    }

    fn driver_reservations(&self) -> usize {
        cudaw_engine::memory_calls::reservations().len()
    }
}
