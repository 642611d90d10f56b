//! A pause refused once the process is exiting (one scenario in its own process: exiting
//! cannot be undone).

mod common;
use common::*;
use cudaw_engine::{lifecycle, state, Host};

#[test]
fn a_pause_is_refused_once_the_process_is_exiting() {
    let _turn = setup();
    let allocs = fill(&[2 << 20], 5);
    lifecycle::mark_exiting("the test says so");
    assert!(lifecycle::is_exiting());

    let r = pause();
    let e = error_of(&r, "a pause while exiting");
    assert_eq!(e, "the process is exiting: pause refused");
    let dir = tempfile::tempdir().unwrap();
    let r = dump(&dir.path().join("late.img"), true);
    assert_eq!(
        error_of(&r, "a dump while exiting"),
        "the process is exiting: pause refused"
    );
    // Nothing was touched.
    assert!(!state::is_paused() && !HOST.gate_closed());
    assert_filled(&allocs, 5);
}
