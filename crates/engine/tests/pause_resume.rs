//! Pause and resume as functions, in this process, on simgpu: through the control module
//! (the request handler's only caller), with the test's own host.

mod common;
use common::*;
use cudaw_engine::{handles, inflight, state, Host};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vmm::Residency;

/// Sizes around the granule (2 MiB on simgpu) and odd ones.
const SIZES: [u64; 6] = [1, 4095, 65_537, 2 << 20, (2 << 20) + 17, 5 << 20];

#[test]
fn pause_then_resume_keeps_every_byte_at_the_same_address() {
    let _turn = setup();
    let allocs = fill(&SIZES, 1);
    let m = device();
    let mapped_before = m.vmm.stats().mapped;
    assert!(mapped_before > 0);

    let r = pause();
    ok(&r, "pause");
    let moved = r.pause.expect("a pause's figures");
    assert_eq!(moved.allocations, SIZES.len() as u64);
    assert_eq!(moved.bytes, SIZES.iter().sum::<u64>());
    assert!(state::is_paused() && HOST.gate_closed());
    for a in &allocs {
        assert_eq!(
            m.vmm.allocation(a.id).unwrap().residency,
            Residency::EvictedToHost,
            "allocation at {:#x} after the pause",
            a.base
        );
    }
    assert_eq!(
        m.vmm.stats().mapped,
        0,
        "device memory still mapped while paused"
    );

    let r = resume();
    ok(&r, "resume");
    assert_eq!(r.resume.expect("a resume's figures").bytes, moved.bytes);
    assert!(!state::is_paused() && !HOST.gate_closed());
    for a in &allocs {
        let now = m.vmm.allocation(a.id).unwrap();
        assert_eq!((now.residency, now.base), (Residency::Resident, a.base));
    }
    assert_filled(&allocs, 1);
    free(allocs);
}

#[test]
fn a_pause_while_paused_and_a_resume_while_running_change_nothing() {
    let _turn = setup();
    let allocs = fill(&[3 << 20], 7);

    let r = resume();
    ok(&r, "resume while running");
    assert!(
        !r.resume.unwrap().changed,
        "a resume while running moved memory"
    );
    assert!(!state::is_paused());

    ok(&pause(), "pause");
    let r = pause();
    ok(&r, "pause while paused");
    assert!(
        !r.pause.unwrap().changed,
        "a pause while paused moved memory"
    );
    assert!(state::is_paused() && HOST.gate_closed());

    ok(&resume(), "resume");
    assert_filled(&allocs, 7);
    free(allocs);
}

#[test]
fn a_wrapped_call_waits_at_the_closed_gate_until_the_resume() {
    let _turn = setup();
    let allocs = fill(&[1 << 20], 3);
    ok(&pause(), "pause");
    let entered = Arc::new(AtomicBool::new(false));
    let e = entered.clone();
    let caller = std::thread::spawn(move || {
        let _call = inflight::enter();
        e.store(true, Ordering::SeqCst);
    });
    // The caller reaches the closed gate and waits there (an event, waited for with a
    // bound); it has not entered.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while HOST.waiting() == 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(
        HOST.waiting(),
        1,
        "the caller never waited at the closed gate"
    );
    assert!(
        !entered.load(Ordering::SeqCst),
        "a wrapped call entered while paused"
    );
    ok(&resume(), "resume");
    caller.join().unwrap();
    assert!(entered.load(Ordering::SeqCst));
    assert_eq!(inflight::in_flight(), 0);
    free(allocs);
}

#[test]
fn nested_wrapped_calls_count_once() {
    let _turn = setup();
    let before = inflight::in_flight();
    {
        let _a = inflight::enter();
        let _b = inflight::enter();
        assert!(inflight::in_wrapped_call());
        assert_eq!(inflight::in_flight(), before + 1);
    }
    assert!(!inflight::in_wrapped_call());
    assert_eq!(inflight::in_flight(), before);
}

#[test]
fn a_status_shows_the_pause() {
    let _turn = setup();
    let allocs = fill(&[2 << 20, 1 << 20], 11);
    ok(&pause(), "pause");
    let s = cudaw_engine::control::status();
    assert_eq!(s.state, cudaw_control::State::Paused);
    let d = s.devices.iter().find(|d| d.ordinal == 0).expect("device 0");
    assert_eq!((d.resident, d.evicted), (0, 3 << 20));
    assert_eq!(handles::counts(0).resident, 0);
    ok(&resume(), "resume");
    let s = cudaw_engine::control::status();
    assert_eq!(s.state, cudaw_control::State::Running);
    free(allocs);
}
