//! Listing 200 MiB of decompressed cubins holds a few of them at a time: the heap's peak
//! during `decode_in_order`, measured by a counting allocator (this test binary's own),
//! stays near `threads` images, far below the total.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

mod synthetic;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are
// only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn heap_peak_is_a_few_images_not_the_input() {
    const MIB: usize = 1 << 20;
    const THREADS: usize = 4;
    let data = synthetic::synthetic_fatbin(200, 5, MIB);
    let index = fatbin::StreamIndex::read(data.as_slice()).unwrap();
    let all = index.loadable();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let stats = fatbin::decode_in_order(
        data.as_slice(),
        &index,
        &all,
        THREADS,
        |(): &mut (), _, kernels| kernels.map(|k| k.len()),
        |n| n.map(drop),
    )
    .unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(stats.timings.decompressed_bytes, 200 * MIB as u64);
    assert!(
        peak < (THREADS + 2) * MIB,
        "heap grew by {peak} bytes while decoding 200 MiB on {THREADS} threads"
    );
    eprintln!("heap peak {peak} bytes over 200 MiB decoded; {stats:?}");
}
