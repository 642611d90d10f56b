//! Shared by the engine's in-process tests: simgpu's driver loaded in this process, and a
//! host over it ([`TestHost`]): a gate of its own (an `AtomicBool`), no calls marked in
//! flight, and a runtime that is the driver alone. The engine's state is the process's, so
//! the tests of one file take turns ([`setup`] returns the turn) and leave no allocation
//! behind.
#![allow(dead_code)]

use cudaw_control::{Reply, Request};
use cudaw_engine::host::{Code, TracerRequest};
use cudaw_engine::{control, memory, Host};
use driver::{Driver, Event, Stream};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

pub use simgpu::testing::library_path as simgpu_path;

/// The test's host: its own gate, simgpu's driver as the runtime.
pub struct TestHost {
    closed: AtomicBool,
    lock: Mutex<()>,
    opened: Condvar,
    /// Threads waiting at the closed gate now.
    waiting: AtomicUsize,
}

pub static HOST: TestHost = TestHost {
    closed: AtomicBool::new(false),
    lock: Mutex::new(()),
    opened: Condvar::new(),
    waiting: AtomicUsize::new(0),
};

impl TestHost {
    /// Threads waiting at the closed gate now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

fn driver() -> std::sync::Arc<driver::LibCuda> {
    memory::driver().expect("simgpu's driver")
}

/// `cudaErrorNotReady`.
const NOT_READY: Code = 600;

impl Host for TestHost {
    fn close_gate(&self) {
        let _g = self.lock.lock();
        self.closed.store(true, Ordering::SeqCst);
    }
    fn open_gate(&self) {
        let _g = self.lock.lock();
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_all();
    }
    fn open_gate_after_fork(&self) {
        self.closed.store(false, Ordering::SeqCst);
    }
    fn gate_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
    fn wait_while_closed(&self) {
        let mut g = self.lock.lock();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while self.closed.load(Ordering::SeqCst) {
            self.opened.wait(&mut g);
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
    fn in_marked_call(&self) -> bool {
        false
    }
    fn marked_calls_in_flight(&self) -> usize {
        0
    }
    fn runtime_loaded(&self) -> bool {
        true
    }
    fn runtime_soname(&self) -> &'static str {
        "libcudart.so.13"
    }
    fn current_device(&self) -> Result<i32, Code> {
        Ok(0)
    }
    fn initialise_runtime(&self) -> Result<(), Code> {
        let d = driver();
        d.init().map_err(|e| e.code)?;
        let dev = d.device_get(0).map_err(|e| e.code)?;
        let ctx = d.primary_ctx_retain(dev).map_err(|e| e.code)?;
        d.ctx_set_current(ctx).map_err(|e| e.code)
    }
    fn device_properties(&self, ordinal: i32, prop: &mut [u64]) -> Result<(), Code> {
        let d = driver();
        d.init().map_err(|e| e.code)?;
        let dev = d.device_get(ordinal).map_err(|e| e.code)?;
        let total = d.device_total_mem(dev).map_err(|e| e.code)?;
        prop[memory::PROP_TOTAL_GLOBAL_MEM / 8] = total;
        Ok(())
    }
    fn synchronize_device(&self) -> Result<(), Code> {
        driver().ctx_synchronize().map_err(|e| e.code)
    }
    fn record_event(&self, stream: usize) -> Result<usize, Code> {
        let d = driver();
        let ev = d.event_create(2).map_err(|e| e.code)?;
        if let Err(e) = d.event_record(ev, Stream(stream)) {
            let _ = d.event_destroy(ev);
            return Err(e.code);
        }
        Ok(ev.0)
    }
    fn event_done(&self, event: usize, wait: bool) -> bool {
        let d = driver();
        if wait {
            d.event_synchronize(Event(event)).map_or(true, |()| true)
        } else {
            !matches!(d.event_query(Event(event)), Ok(false))
        }
    }
    fn destroy_event(&self, event: usize) {
        let _ = driver().event_destroy(Event(event));
    }
    fn trace_now(&self) -> u64 {
        0
    }
    fn trace_pause(&self, _: bool, _: u64, _: u64, _: u64) {}
    fn trace_alloc(&self, _: u64, _: u64, _: &'static str) {}
    fn tracer_request(&self, _: TracerRequest<'_>) -> Reply {
        Reply::error(cudaw_control::ErrorKind::Failed, "no tracer in this test")
    }
    fn driver_reservations(&self) -> usize {
        0
    }
}

static TURN: Mutex<()> = Mutex::new(());

/// Points cudaw at simgpu (before its configuration is first read), installs the test
/// host, and takes this test's turn.
pub fn setup() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("CUDAW_LIBCUDA", simgpu_path());
        std::env::set_var("CUDAW_LEDGER", "off");
        std::env::set_var("CUDAW_CONTROL_SOCKET", "off");
        std::env::remove_var("CUDAW_MEM_LIMIT");
        std::env::remove_var("CUDAW_ADDRESSING");
        std::env::remove_var("CUDAW_HOST_ARENA");
        assert!(cudaw_engine::install(&HOST), "another host is installed");
    });
    // A test that failed while holding the turn must not fail every later one.
    let turn = TURN.lock();
    assert!(
        !HOST.gate_closed() && !cudaw_engine::state::is_paused(),
        "an earlier test left the process paused"
    );
    turn
}

/// Device 0's memory, through the engine.
pub fn device() -> &'static memory::DeviceMemory {
    memory::device(0).expect("device 0 through the engine")
}

pub use simgpu::testing::pattern;

/// Allocations of these sizes through the engine, each filled with its pattern.
pub fn fill(sizes: &[u64], seed: u64) -> Vec<vmm::Allocation> {
    let m = device();
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let a = m.alloc(s, memory::tag::MALLOC).expect("allocation");
            write(a.base, &pattern(s as usize, seed + i as u64));
            a
        })
        .collect()
}

/// Writes `bytes` at device address `addr`.
pub fn write(addr: u64, bytes: &[u8]) {
    driver()
        .memcpy_htod(addr, bytes)
        .expect("copy to the device");
}

/// The `len` bytes at device address `addr`.
pub fn read(addr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    driver()
        .memcpy_dtoh(&mut out, addr)
        .expect("copy from the device");
    out
}

/// Whether every allocation holds the pattern [`fill`] wrote with `seed`.
pub fn assert_filled(allocs: &[vmm::Allocation], seed: u64) {
    for (i, a) in allocs.iter().enumerate() {
        let want = pattern(a.size as usize, seed + i as u64);
        assert!(
            read(a.base, a.size as usize) == want,
            "allocation {i} ({} bytes at {:#x}) does not hold its bytes",
            a.size,
            a.base
        );
    }
}

/// Frees the allocations (a test leaves none behind).
pub fn free(allocs: Vec<vmm::Allocation>) {
    for a in allocs {
        device().vmm.free(a.base).expect("free");
    }
}

/// Carries out `req` through the control module, as the socket does.
pub fn request(req: Request) -> Reply {
    control::execute(req, &mut |_| {})
}

pub fn pause() -> Reply {
    request(Request::PAUSE)
}

pub fn resume() -> Reply {
    request(Request::RESUME)
}

pub fn dump(path: &Path, leave_running: bool) -> Reply {
    request(Request::Dump {
        path: path.to_string_lossy().into_owned(),
        leave_running,
        keep_shared: false,
        fd: false,
        progress: false,
    })
}

pub fn restore(path: &Path, force: bool) -> Reply {
    request(Request::Restore {
        path: path.to_string_lossy().into_owned(),
        force,
        fd: false,
        progress: false,
    })
}

/// The reply's error message, or a panic naming the request when it succeeded.
pub fn error_of(r: &Reply, what: &str) -> String {
    assert!(!r.ok, "{what} succeeded, expected a refusal");
    r.error.clone().unwrap_or_default()
}

/// Asserts the reply is a success, showing its error otherwise.
pub fn ok(r: &Reply, what: &str) {
    assert!(r.ok, "{what} failed: {:?}", r.error);
}
