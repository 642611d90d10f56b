//! The pause gate. Every export's trampoline loads one word, [`GATE`]; zero means "go
//! straight to the target". Any other value sends the call to the slow path, which
//! initialises the shim on the first call (bit [`UNINITIALISED`]) and holds the calling
//! thread while the process is paused (bit [`PAUSED`]), and times every call when tracing
//! is on (bit [`TRACING`]).

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The shim has not loaded the real runtime yet.
pub const UNINITIALISED: u32 = 1;
/// The process is paused: calls wait.
pub const PAUSED: u32 = 2;

/// Tracing is on (`CUDAW_TRACE`): every call takes the slow path, which times it
/// ([`crate::tracing`]). When the gate word is exactly this bit, the slow path is the
/// assembly fast path of tracing (`shim-build`'s `trace_fast_path`).
pub const TRACING: u32 = 4;

/// The gate word the trampolines load, first in a cache line of its own.
pub static GATE: Gate = Gate {
    word: AtomicU32::new(UNINITIALISED),
    trace_tls: AtomicUsize::new(0),
};

/// The gate word and what the assembly fast path of tracing reads beside it, in the one
/// cache line every call loads anyway (`shim-build`'s `trace_fast_path`): it reaches the
/// thread's counters through the thread's own words alone, with no GOT load.
#[repr(C, align(64))]
pub struct Gate {
    /// The gate word: a plain `u32`-sized atomic, at the symbol's address.
    pub(crate) word: AtomicU32,
    /// The thread-pointer offset of the trace's thread-local words (`cudaw_rt_trace_tls`,
    /// at `shim-build`'s `GATE_TRACE_TLS`): set before tracing can first turn the gate to
    /// exactly [`TRACING`] ([`set_trace_tls`]).
    trace_tls: AtomicUsize,
}

const _: () = assert!(std::mem::offset_of!(Gate, trace_tls) == 8);

impl std::ops::Deref for Gate {
    type Target = AtomicU32;
    fn deref(&self) -> &AtomicU32 {
        &self.word
    }
}

/// Records the thread-pointer offset of the trace's thread-local words beside the gate
/// word, for the fast path of tracing (before the gate can be exactly [`TRACING`]).
pub fn set_trace_tls(offset: usize) {
    GATE.trace_tls.store(offset, Ordering::SeqCst);
}

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

/// Threads waiting at the closed gate now (counted only once the gate is found closed:
/// the open path costs nothing).
static WAITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many threads wait at the closed gate now (the node scheduler's sign that a held
/// process wants its GPU).
pub fn waiters() -> usize {
    WAITERS.load(Ordering::SeqCst)
}

/// Blocks the calling thread while the gate is closed for pause.
pub fn wait_while_paused() {
    if !is_paused() {
        return;
    }
    WAITERS.fetch_add(1, Ordering::SeqCst);
    let mut g = LOCK.lock();
    while is_paused() {
        OPENED.wait(&mut g);
    }
    drop(g);
    WAITERS.fetch_sub(1, Ordering::SeqCst);
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
