//! A wrapped call entered before any host is installed (a library constructor calling
//! CUDA before cudaw's own ran): the call fails inside its panic boundary and leaves the
//! thread as it was, not counted as inside a wrapped call for ever. Its own file: the
//! host, once installed, stays for the process.

use cudaw_engine::inflight;

#[test]
fn entering_without_a_host_leaves_the_thread_outside_any_wrapped_call() {
    let r = std::panic::catch_unwind(inflight::enter);
    assert!(r.is_err(), "entering without a host must fail");
    assert!(
        !inflight::in_wrapped_call(),
        "a failed entry left the thread marked inside a wrapped call"
    );
    assert_eq!(inflight::in_flight(), 0);
}
