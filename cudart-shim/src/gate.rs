//! The pause gate. Every export's trampoline loads one word, [`GATE`]; zero means "go
//! straight to the target". Any other value sends the call to the slow path, which
//! initialises the shim on the first call (bit [`UNINITIALISED`]) and holds the calling
//! thread while the process is paused (bit [`PAUSED`]), and times every call when tracing
//! is on (bit [`TRACING`]).

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU32, Ordering};

/// The shim has not loaded the real runtime yet.
pub const UNINITIALISED: u32 = 1;
/// The process is paused: calls wait.
pub const PAUSED: u32 = 2;

/// Tracing is on (`CUDAW_TRACE`): every call takes the slow path, which times it
/// ([`crate::tracing`]). When the gate word is exactly this bit, the slow path is the
/// assembly fast path of tracing (`shim-build`'s `trace_fast_path`).
pub const TRACING: u32 = 4;

/// The gate word the trampolines load. Read by assembly: keep it a plain `u32`-sized atomic.
pub static GATE: AtomicU32 = AtomicU32::new(UNINITIALISED);

static LOCK: Mutex<()> = Mutex::new(());
static OPENED: Condvar = Condvar::new();

/// Whether the gate is closed for pause.
pub fn is_paused() -> bool {
    GATE.load(Ordering::Acquire) & PAUSED != 0
}

/// Closes the gate: calls entering the shim from now on wait in [`wait_while_paused`].
pub fn close() {
    let _g = LOCK.lock();
    GATE.fetch_or(PAUSED, Ordering::SeqCst);
}

/// Opens the gate and wakes every waiting thread.
pub fn open() {
    let _g = LOCK.lock();
    GATE.fetch_and(!PAUSED, Ordering::SeqCst);
    OPENED.notify_all();
}

/// Marks the shim initialised (the real runtime's table is filled).
pub fn mark_initialised() {
    GATE.fetch_and(!UNINITIALISED, Ordering::SeqCst);
}

/// Blocks the calling thread while the gate is closed for pause.
pub fn wait_while_paused() {
    if !is_paused() {
        return;
    }
    let mut g = LOCK.lock();
    while is_paused() {
        OPENED.wait(&mut g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn waiters_are_held_until_open() {
        close();
        let passed = Arc::new(AtomicBool::new(false));
        let p = passed.clone();
        let t = std::thread::spawn(move || {
            wait_while_paused();
            p.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !passed.load(Ordering::SeqCst),
            "a thread passed a closed gate"
        );
        open();
        t.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
        // A second open, or a close/open pair, is harmless.
        open();
        close();
        close();
        open();
        assert!(!is_paused());
    }
}
