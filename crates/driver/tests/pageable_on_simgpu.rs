//! [`PinnedStaging::copy_pageable`] on simgpu (whose streams run on worker threads, so the
//! copies really are asynchronous): a program's copies with pageable host memory are
//! byte-exact at odd sizes and offsets, in both directions, ordered after the work queued
//! before them on the program's stream and before the work queued after; the source may
//! be reused as soon as an asynchronous copy to the device returns; a copy that cannot be
//! ordered or fails under way says so, and the pool stays usable.

use std::sync::Arc;

use driver::api::STREAM_NON_BLOCKING;
use driver::{
    Completion, Driver, DriverBackend, LibCuda, PageableCopy, PageableCopyError, PinnedStaging,
    StagingConfig, Stream,
};
use simgpu::testing::pattern;
use vmm::{Backend, Config, Vmm};

mod common;
use common::simgpu_path;

fn new_vmm() -> Vmm<DriverBackend> {
    let lib: Arc<dyn Driver> =
        Arc::new(LibCuda::open_path(simgpu_path().to_str().unwrap()).unwrap());
    Vmm::new(DriverBackend::new(lib, 0).unwrap(), Config::mapped()).unwrap()
}

const BUFFER: usize = 64 << 10;

/// Holds `stream` until a large memset on another stream is done: work queued on `stream`
/// meanwhile runs late, so a copy not ordered after it would land first.
fn hold(d: &dyn Driver, stream: Stream, other: Stream, big: (u64, usize)) {
    d.memset_d8_async(big.0, 0, big.1, other).unwrap();
    let e = d.event_create(0).unwrap();
    d.event_record(e, other).unwrap();
    d.stream_wait_event(stream, e).unwrap();
    d.event_destroy(e).unwrap();
}

#[test]
fn pageable_copies_are_exact_and_follow_the_stream() {
    let vmm = new_vmm();
    let b = vmm.backend();
    let d = b.driver().clone();
    let dev = vmm.alloc(8 << 20, 0).unwrap().base;
    let big = vmm.alloc(256 << 20, 0).unwrap().base;
    let stream = d.stream_create(STREAM_NON_BLOCKING).unwrap();
    let other = d.stream_create(STREAM_NON_BLOCKING).unwrap();
    let before = d.ctx_get_current().unwrap();
    for (threads, streams) in [(3, 2), (1, 1)] {
        let mut staging = PinnedStaging::new(StagingConfig::new(streams, BUFFER, threads));
        for (case, &(len, dev_off, host_off)) in [
            (1usize, 0u64, 0usize),
            (3, 7, 1),
            (4095, 1, 3),
            (65537, 4096, 5),
            (3 * BUFFER + 5, 3, 2),
            ((5 << 20) + 3, 11, 7),
        ]
        .iter()
        .enumerate()
        {
            let at = dev + dev_off;
            let want = pattern(len, case as u64 + 1);
            let mut src = vec![0u8; len + host_off];
            src[host_off..].copy_from_slice(&want);
            hold(&*d, stream, other, (big, 256 << 20));
            d.memset_d8_async(at, 0xEE, len, stream).unwrap();
            let to_device = PageableCopy::ToDevice {
                dst: at,
                // SAFETY: inside `src`.
                src: unsafe { src.as_ptr().add(host_off) },
                len,
            };
            // SAFETY: `src` outlives the call; the device range is inside `dev`.
            unsafe { staging.copy_pageable(b, to_device, Stream(stream.0), Completion::Staged) }
                .unwrap();
            // The source may be reused at once: the bytes are staged.
            src.fill(0x55);
            // Later work on the stream comes after the copy.
            d.memset_d8_async(at, 0x99, 1, stream).unwrap();
            let mut out = vec![0x11u8; len + 2];
            let to_host = PageableCopy::ToHost {
                // SAFETY: inside `out`.
                dst: unsafe { out.as_mut_ptr().add(1) },
                src: at,
                len,
            };
            // SAFETY: `out` is ours for the call; the device range is inside `dev`.
            unsafe { staging.copy_pageable(b, to_host, stream, Completion::Done) }.unwrap();
            let what = format!("case {case} ({len} bytes, {threads} threads)");
            assert_eq!(out[0], 0x11, "{what}: wrote before the range");
            assert_eq!(out[len + 1], 0x11, "{what}: wrote after the range");
            assert_eq!(out[1], 0x99, "{what}: the later memset ran before the copy");
            assert!(
                out[2..=len] == want[1..],
                "{what}: bytes differ (first at {:?})",
                out[2..=len]
                    .iter()
                    .zip(&want[1..])
                    .position(|(a, b)| a != b)
            );
            assert_eq!(
                d.ctx_get_current().unwrap(),
                before,
                "{what}: context changed"
            );
        }
        staging.release().unwrap();
    }
    d.stream_destroy(stream).unwrap();
    d.stream_destroy(other).unwrap();
}

#[test]
fn copies_that_cannot_run_say_why_and_the_pool_stays_usable() {
    let vmm = new_vmm();
    let b = vmm.backend();
    let d = b.driver().clone();
    let dev = vmm.alloc(1 << 20, 0).unwrap().base;
    let mut staging = PinnedStaging::new(StagingConfig::new(2, BUFFER, 2));
    let src = pattern(300_000, 9);
    let to = |dst: u64| PageableCopy::ToDevice {
        dst,
        src: src.as_ptr(),
        len: src.len(),
    };
    // A stream the driver does not know: nothing is done.
    // SAFETY: `src` outlives the call.
    let err = unsafe { staging.copy_pageable(b, to(dev), Stream(0xdead_0000), Completion::Done) }
        .unwrap_err();
    assert!(matches!(err, PageableCopyError::NotStarted(_)), "{err}");
    assert!(err.to_string().contains("cuEventRecord"), "{err}");
    // A device range nobody mapped: fails under way, naming the copy.
    let reservation = b.reserve(4 << 20, 0).unwrap();
    // SAFETY: as above; the device side is a reservation, which the driver refuses.
    let err =
        unsafe { staging.copy_pageable(b, to(reservation), Stream::LEGACY, Completion::Staged) }
            .unwrap_err();
    assert!(matches!(err, PageableCopyError::Failed(_)), "{err}");
    assert!(err.to_string().contains("cuMemcpyHtoDAsync"), "{err}");
    b.free_reservation(reservation, 4 << 20).unwrap();
    // The pool still copies exactly, on the legacy stream too.
    // SAFETY: as above.
    unsafe { staging.copy_pageable(b, to(dev), Stream::LEGACY, Completion::Done) }.unwrap();
    let mut back = vec![0u8; src.len()];
    let to_host = PageableCopy::ToHost {
        dst: back.as_mut_ptr(),
        src: dev,
        len: back.len(),
    };
    // SAFETY: `back` is ours for the call.
    unsafe { staging.copy_pageable(b, to_host, Stream::PER_THREAD, Completion::Done) }.unwrap();
    assert!(back == src);
    // Nothing to copy: nothing done.
    let empty = PageableCopy::ToHost {
        dst: back.as_mut_ptr(),
        src: dev,
        len: 0,
    };
    // SAFETY: nothing is touched.
    unsafe { staging.copy_pageable(b, empty, Stream(0xdead_0000), Completion::Done) }.unwrap();
    drop(d);
}

/// Where the work cannot be handed to the pool's threads (here: the caller is a worker of a
/// rayon pool, as it would be with no threads or in a child of fork) it runs on the calling
/// thread, byte-exact, through more batches than the pool has buffers.
#[test]
fn copies_on_the_calling_thread_are_exact() {
    let vmm = new_vmm();
    let b = vmm.backend();
    let len = 20 * BUFFER + 5;
    let dev = vmm.alloc(len as u64 + 7, 0).unwrap().base + 7;
    let want = pattern(len, 21);
    let mut back = vec![0u8; len];
    let mut staging = PinnedStaging::new(StagingConfig::new(2, BUFFER, 3));
    let outer = rayon_core::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    outer.install(|| {
        assert!(rayon_core::current_thread_index().is_some());
        let to_device = PageableCopy::ToDevice {
            dst: dev,
            src: want.as_ptr(),
            len,
        };
        // SAFETY: `want` outlives the call; the device range is inside the allocation.
        unsafe { staging.copy_pageable(b, to_device, Stream::LEGACY, Completion::Done) }.unwrap();
        let to_host = PageableCopy::ToHost {
            dst: back.as_mut_ptr(),
            src: dev,
            len,
        };
        // SAFETY: `back` is ours for the call.
        unsafe { staging.copy_pageable(b, to_host, Stream::LEGACY, Completion::Done) }.unwrap();
    });
    assert!(back == want);
    assert!(staging.take_notes().is_empty(), "the pool has its threads");
}

/// Times many staged copies each way (figures to read, not a check): small buffers, where
/// a copy's fixed cost shows (the hand-off to the copy threads), and 4 MiB ones. Run by hand:
/// `cargo test -p driver --release --test pageable_on_simgpu -- --ignored --nocapture`.
#[test]
#[ignore = "timings to read; run by hand"]
fn many_staged_copies_timing() {
    let vmm = new_vmm();
    let b = vmm.backend();
    let most = 32 << 20;
    let dev = vmm.alloc(most as u64, 0).unwrap().base;
    let src = pattern(most, 3);
    let mut back = vec![0u8; most];
    for (buffer, len, count) in [
        (16 << 10, 256 << 10, 500),
        (4 << 20, 8 << 20, 200),
        (4 << 20, most, 50),
    ] {
        for threads in [2, 16] {
            let mut staging = PinnedStaging::new(StagingConfig::new(2, buffer, threads));
            staging.prepare(b).unwrap();
            let to_device = PageableCopy::ToDevice {
                dst: dev,
                src: src.as_ptr(),
                len,
            };
            let to_host = PageableCopy::ToHost {
                dst: back.as_mut_ptr(),
                src: dev,
                len,
            };
            for (name, copy) in [("to device", to_device), ("to host", to_host)] {
                let t = std::time::Instant::now();
                for _ in 0..count {
                    // SAFETY: `src` and `back` outlive the call; nothing else uses them.
                    unsafe { staging.copy_pageable(b, copy, Stream::LEGACY, Completion::Done) }
                        .unwrap();
                }
                eprintln!(
                    "{count} copies of {} KiB {name}, {} KiB buffers, {threads} threads: {:?} each",
                    len >> 10,
                    buffer >> 10,
                    t.elapsed() / count
                );
            }
            assert!(back[..len] == src[..len]);
        }
    }
}
