//! A job pause's first step: the gate closed, the devices drained, nothing evicted yet.
//!
//! The ranks of a job wait for each other inside their collectives, so a job is paused in
//! two steps (the protocol's "Jobs: hold, then pause"): [`hold`] on every process at once,
//! then — when every one reported idle — a pause on each, which only evicts. A hold whose
//! window closes with a device still busy keeps the gate closed; the coordinator then
//! holds again, or releases every process ([`release`]) and tries another instant. A hold
//! that no request follows ends at its lease ([`expire`]).

use crate::drain::{Drain, Drained};
use crate::failure::Failure;
use crate::host::host;
use crate::{inflight, lifecycle, log};
use cudaw_control::{ErrorKind, Held};
use std::time::{Duration, Instant};

/// Holds so far. The node scheduler (`cudaw node`) holds a process many times a second:
/// the first holds and releases are logged at info level, then one in a thousand (with
/// the count), the rest at debug level.
static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn say(n: u64, what: std::fmt::Arguments<'_>) {
    if n < 3 {
        log::info(what);
    } else if n.is_multiple_of(1000) {
        log::info(format_args!(
            "{what} ({n} holds so far; the others are logged at debug level)"
        ));
    } else {
        log::debug(what);
    }
}

/// A hold in force.
pub struct Hold {
    /// When the process opens its gate by itself.
    lease_until: Instant,
    /// The devices' work being waited for, once the calls in flight have left.
    drain: Option<Drain>,
    /// Every device was found idle.
    idle: bool,
}

/// Holds the process (closing its gate if it was not held) and waits up to `window` for
/// it to be idle; renews the lease. A paused process is idle already. On failure the gate
/// opens again.
pub fn hold(
    slot: &mut Option<Hold>,
    paused: bool,
    window: Duration,
    lease: Duration,
) -> Result<Held, Failure> {
    let started = Instant::now();
    let until = started + window;
    if paused {
        return Ok(Held {
            idle: true,
            ms: ms(started),
            ..Held::default()
        });
    }
    let changed = slot.is_none();
    if changed {
        host().close_gate();
        let n = HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        say(n, format_args!(
            "hold: calls wait at the gate (a job pause's first step, or the node scheduler's turn; the lease is {:.1} s)",
            lease.as_secs_f64()
        ));
    }
    let h = slot.get_or_insert_with(|| Hold {
        lease_until: started,
        drain: None,
        idle: false,
    });
    let mut held = Held {
        changed,
        ..Held::default()
    };
    let waited = wait(h, started, until, &mut held);
    // The lease runs from the reply: a lease shorter than the window still gives the
    // coordinator its time.
    h.lease_until = Instant::now() + lease;
    if let Err(mut e) = waited {
        release(slot, paused);
        e.message
            .push_str("; the hold was given up and the program runs on");
        log::error(format_args!("hold: {}", e.message));
        return Err(e);
    }
    held.ms = ms(started);
    Ok(held)
}

/// Waits for the calls in flight, then for the devices, until `until`; fills `held`.
fn wait(h: &mut Hold, started: Instant, until: Instant, held: &mut Held) -> Result<(), Failure> {
    if !h.idle {
        if h.drain.is_none() {
            if let Err(n) = inflight::wait_for_calls_in_flight(started, Some(until)) {
                held.calls_in_flight = n as u64;
                return Ok(());
            }
            h.drain = Some(Drain::start()?);
        }
        if let Some(d) = &mut h.drain {
            match d.wait(until)? {
                Drained::Done => h.idle = true,
                Drained::Busy(busy) => held.busy_devices = busy,
            }
        }
    }
    if lifecycle::is_exiting() {
        return Err(Failure::new(
            ErrorKind::Failed,
            "the process began to exit during the hold",
        ));
    }
    held.idle = h.idle;
    Ok(())
}

/// Ends a hold: the gate opens (unless the process is paused, which a resume undoes).
pub fn release(slot: &mut Option<Hold>, paused: bool) -> Held {
    let started = Instant::now();
    let changed = slot.take().is_some() && !paused;
    if changed {
        host().open_gate();
        let n = HOLDS
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(1);
        say(n, format_args!("release: the hold ends, calls go on"));
    }
    Held {
        changed,
        ms: ms(started),
        ..Held::default()
    }
}

/// Ends a hold whose lease has passed (the coordinator never followed it up).
pub fn expire(slot: &mut Option<Hold>, paused: bool) {
    if slot
        .as_ref()
        .is_some_and(|h| Instant::now() >= h.lease_until)
    {
        release(slot, paused);
        log::warn(format_args!(
            "hold: its lease ended without a pause, release or resume (the coordinator gave up or died): calls go on"
        ));
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
