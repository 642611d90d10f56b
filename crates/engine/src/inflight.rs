//! Calls in flight: the engine's count of the library's wrapped calls ([`enter`]), the
//! threads that are cudaw's own, and the wait a pause makes, gate closed, for every call
//! that can put work on the device to leave ([`wait_for_calls_in_flight`]): the wrapped
//! calls counted here and the host's calls marked in flight
//! ([`crate::host::Host::marked_calls_in_flight`]: the exports with in-flight trampolines
//! of both the runtime shim and the driver shim). A thread that tested the gate just
//! before it closed is inside such a call, and is waited for; one that tests it after sees
//! it closed. So no work reaches the device after the pause's synchronisation.

use crate::host::host;
use crate::log;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// cudaw's wrapped calls running now (threads inside at least one).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// How deep the calling thread is in wrapped calls (a wrapper may call another).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Set on cudaw's own threads (the control thread).
    static CUDAW_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as inside a wrapped call until the guard drops. Waits while
/// the process is paused (before entering, never once inside).
pub struct InFlight(());

/// Enters a wrapped call: waits while paused, then counts the thread in flight. Nested
/// calls on one thread count once and never wait (the outer call is already counted).
pub fn enter() -> InFlight {
    // The host first: a panic here (none installed) must leave the depth as it was.
    let h = host();
    let depth = DEPTH.with(|d| {
        let v = d.get();
        d.set(v + 1);
        v
    });
    if depth == 0 {
        loop {
            IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
            // Either pause sees our count, or we see its closed gate (both SeqCst). A
            // wrapped call reached through an in-flight trampoline is waited for already.
            if !h.gate_closed() || h.in_marked_call() {
                break;
            }
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            h.wait_while_closed();
        }
    }
    InFlight(())
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            let v = d.get().saturating_sub(1);
            d.set(v);
            v
        });
        if depth == 0 {
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Runs `f` with the calling thread out of its wrapped call's count (it waits for
/// something outside cudaw — room for an allocation — and holds nothing a pause needs),
/// then counts it in again, waiting at the gate first if it closed meanwhile (so a hold
/// or a pause does not wait for it, and it touches nothing while the process is held or
/// paused). Outside a wrapped call (or nested in another thread's sense: the outer call
/// is the one counted), `f` just runs.
/// Returns `f`'s result and the time spent waiting at the gate after it.
pub fn step_out<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    if DEPTH.with(|d| d.get()) == 0 || is_cudaw_thread() {
        return (f(), Duration::ZERO);
    }
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    let out = f();
    let h = host();
    let mut gated = Duration::ZERO;
    loop {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        if !h.gate_closed() || h.in_marked_call() {
            break;
        }
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        let t = Instant::now();
        h.wait_while_closed();
        gated += t.elapsed();
    }
    (out, gated)
}

/// Whether the calling thread is inside one of cudaw's wrapped calls.
pub fn in_wrapped_call() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Whether the calling thread is one of cudaw's own (it pauses; it never waits at the gate).
pub fn is_cudaw_thread() -> bool {
    CUDAW_THREAD.with(Cell::get)
}

/// Marks the calling thread as one of cudaw's own (the control thread, as it starts).
pub fn mark_cudaw_thread() {
    CUDAW_THREAD.with(|c| c.set(true));
}

/// Wrapped calls in flight now.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// Waits, the gate closed, until no thread is inside a wrapped call or a call in flight;
/// `Err(calls still in flight)` at `deadline`.
pub(crate) fn wait_for_calls_in_flight(
    started: Instant,
    deadline: Option<Instant>,
) -> Result<(), usize> {
    // Every thread's "in flight" store before its gate test is visible from here on.
    driver::inflight::barrier();
    let mut warned = false;
    loop {
        let (wrapped, marked) = (in_flight(), host().marked_calls_in_flight());
        if wrapped == 0 && marked == 0 {
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(wrapped + marked);
        }
        if !warned && started.elapsed() > Duration::from_secs(1) {
            log::warn(format_args!(
                "pause: still waiting for {} call(s) in flight after 1 s",
                wrapped + marked
            ));
            warned = true;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}
