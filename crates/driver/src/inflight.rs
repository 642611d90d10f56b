//! Calls in flight: the Rust half of the in-flight trampolines `shim-build` generates for
//! both of cudaw's libraries (the exports that can enqueue device work: launches, copies,
//! sets, graph launches, stream memory operations, prefetches).
//!
//! Each thread has, per library, a [`Block`] in static TLS: a word ([`IDLE`],
//! [`IN_FLIGHT`], [`UNREGISTERED`]) and the caller's return address saved while a marked
//! call runs. The trampoline sets the word to [`IN_FLIGHT`] *before* it tests the gate, with
//! no fence; pause closes the gate, then runs [`barrier`] (`membarrier`: a full barrier on
//! every running thread of the process), then waits until no registered word reads
//! [`IN_FLIGHT`] ([`Registry::busy`]). Either a thread's word was visible by the barrier
//! (pause waits for its call to return: its work is queued before the synchronisation), or
//! the thread tests the gate after it and sees it closed (it takes the slow path,
//! [`enter`], which sets its word back to [`IDLE`] before it blocks).
//!
//! The registry lives in the runtime shim (the driver shim registers through the runtime
//! hooks, `driver::hooks`); a thread's block is registered on its first marked call
//! (its word starts [`UNREGISTERED`], which sends that call to the slow path) and
//! unregistered by a thread-local destructor before the thread's TLS goes away.

use std::cell::RefCell;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// No marked call in progress on the thread (the value `shim-build` writes).
pub const IDLE: u64 = 0;
/// A marked call is in progress, or about to test the gate.
pub const IN_FLIGHT: u64 = 1;
/// The thread's first marked call has not happened yet (the initial TLS value).
pub const UNREGISTERED: u64 = 2;

/// The calling thread's block of a library's in-flight support (`shim-build`'s
/// `in_flight_support`): the address of its initial-exec TLS symbol `$tls` (a string
/// literal, `PREFIX_inflight_tls`), computed in place (two instructions: the block's
/// offset from the GOT, plus the thread pointer), where a call of an accessor function
/// would be a call through the GOT. A `&'static Block`, used on the calling thread only.
#[macro_export]
#[cfg(target_arch = "x86_64")]
macro_rules! inflight_block {
    ($tls:literal) => {{
        let p: *const $crate::inflight::Block;
        // SAFETY: reads the thread pointer's self-pointer (%fs:0) and the TLS block's
        // offset from it (the GOT's TPOFF entry of `$tls`): the address of the calling
        // thread's static TLS block, which lives as long as the thread.
        unsafe {
            ::std::arch::asm!(
                concat!("movq ", $tls, "@gottpoff(%rip), {p}"),
                "addq %fs:0, {p}",
                p = out(reg) p,
                options(att_syntax, pure, readonly, nostack),
            );
            &*p
        }
    }};
}

/// The calling thread's block (see the x86-64 form): on AArch64 the thread pointer
/// (`tpidr_el0`) plus the block's offset from it (the GOT's TPREL entry of `$tls`).
#[macro_export]
#[cfg(target_arch = "aarch64")]
macro_rules! inflight_block {
    ($tls:literal) => {{
        let p: *const $crate::inflight::Block;
        // SAFETY: reads the thread pointer and the GOT's TPREL entry of `$tls`: their sum
        // is the address of the calling thread's static TLS block, which lives as long as
        // the thread.
        unsafe {
            ::std::arch::asm!(
                "mrs {p}, tpidr_el0",
                concat!("adrp {t}, :gottprel:", $tls),
                concat!("ldr {t}, [{t}, #:gottprel_lo12:", $tls, "]"),
                "add {p}, {p}, {t}",
                p = out(reg) p,
                t = out(reg) _,
                options(pure, readonly, nostack),
            );
            &*p
        }
    }};
}

/// One thread's in-flight block (the layout `shim-build`'s assembly uses).
#[repr(C)]
#[derive(Debug)]
pub struct Block {
    /// [`IDLE`], [`IN_FLIGHT`] or [`UNREGISTERED`].
    pub word: AtomicU64,
    /// The caller's return address while a marked call runs.
    pub ret: AtomicUsize,
    /// The address of the library's own per-thread state, 0 until it sets it: reached
    /// through this block's initial-exec TLS, where a `thread_local!` of a shared library
    /// costs a call of `__tls_get_addr` on every access (the driver shim's launch counts).
    pub local: AtomicUsize,
    /// A word of the library's own, per thread. cudaw's runtime: its flags (a launch its
    /// tracing records is under way, which cudaw's driver layer then leaves alone:
    /// `hooks::RECORDING_LAUNCH`); cudaw's driver layer: the address of the runtime's
    /// flags word for the thread, once asked.
    pub flags: AtomicUsize,
}

impl Block {
    /// An unregistered block (what a new thread's TLS holds).
    pub const fn new() -> Block {
        Block {
            word: AtomicU64::new(UNREGISTERED),
            ret: AtomicUsize::new(0),
            local: AtomicUsize::new(0),
            flags: AtomicUsize::new(0),
        }
    }

    /// Whether a marked call is in progress on the block's thread.
    pub fn in_flight(&self) -> bool {
        self.word.load(Ordering::Acquire) == IN_FLIGHT
    }
}

impl Default for Block {
    fn default() -> Self {
        Block::new()
    }
}

/// The blocks of every thread that has made a marked call (addresses).
#[derive(Debug, Default)]
pub struct Registry {
    blocks: Mutex<Vec<usize>>,
}

impl Registry {
    /// An empty registry.
    pub const fn new() -> Registry {
        Registry {
            blocks: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `block`, which must stay alive until [`Registry::unregister`]ed.
    pub fn register(&self, block: *const Block) {
        let mut b = self.lock();
        if !b.contains(&(block as usize)) {
            b.push(block as usize);
        }
    }

    /// Removes `block` (its thread is ending): once this returns, the registry never reads
    /// it again.
    pub fn unregister(&self, block: *const Block) {
        self.lock().retain(|&a| a != block as usize);
    }

    /// Registered blocks.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no block is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many registered threads have a marked call in flight. Run [`barrier`] between
    /// closing the gate and the first call.
    pub fn busy(&self) -> usize {
        let b = self.lock();
        b.iter()
            .filter(|&&a| {
                // SAFETY: a registered block is alive until unregistered, which takes the
                // lock held here.
                unsafe { &*(a as *const Block) }.in_flight()
            })
            .count()
    }
}

/// Unregisters a block when its thread ends.
struct Guard {
    block: usize,
    unregister: fn(*const Block),
}

impl Drop for Guard {
    fn drop(&mut self) {
        (self.unregister)(self.block as *const Block);
        // SAFETY: the thread's own static TLS block, alive until after its destructors;
        // a later marked call on this thread then runs uncounted (`enter`).
        unsafe { &*(self.block as *const Block) }
            .word
            .store(UNREGISTERED, Ordering::SeqCst);
    }
}

thread_local! {
    static GUARDS: RefCell<Vec<Guard>> = const { RefCell::new(Vec::new()) };
}

/// Registers the calling thread's `block` with `register` and arranges `unregister` at
/// thread exit; false (nothing registered) once the thread's destructors run.
pub fn register_until_thread_exit(
    block: &Block,
    register: &dyn Fn(*const Block),
    unregister: fn(*const Block),
) -> bool {
    GUARDS
        .try_with(|g| {
            let Ok(mut g) = g.try_borrow_mut() else {
                return false;
            };
            register(block);
            g.push(Guard {
                block: block as *const Block as usize,
                unregister,
            });
            true
        })
        .unwrap_or(false)
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Whether this process registered for `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`.
fn membarrier_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes plain integers and touches no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
                0,
            )
        };
        rc == 0
    })
}

/// Registers for the expedited barrier now (it may take a few milliseconds once), so that
/// the first pause does not pay for it. Returns whether `membarrier` is available.
pub fn prepare_barrier() -> bool {
    membarrier_registered()
}

/// A full memory barrier on every thread of the process that is running now (the
/// other half of the trampolines' unfenced store): `membarrier`, or, where the kernel
/// refuses it, a change of protection of a page this thread wrote, which makes the kernel
/// interrupt every CPU running the process to flush its TLB (the same fallback as
/// HotSpot's `FlushProcessWriteBuffers`).
pub fn barrier() {
    fence(Ordering::SeqCst);
    if membarrier_registered() {
        // SAFETY: as in `membarrier_registered`.
        let rc =
            unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
        if rc == 0 {
            return;
        }
    }
    flush_by_mprotect();
    fence(Ordering::SeqCst);
}

fn flush_by_mprotect() {
    static PAGE: OnceLock<Mutex<usize>> = OnceLock::new();
    let page = PAGE.get_or_init(|| {
        // SAFETY: a fresh private anonymous mapping of one page.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Mutex::new(if p == libc::MAP_FAILED { 0 } else { p as usize })
    });
    let p = *page.lock().unwrap_or_else(|e| e.into_inner());
    if p == 0 {
        // No page: a long enough wait for any store buffer to drain.
        std::thread::sleep(std::time::Duration::from_millis(1));
        return;
    }
    // SAFETY: `p` is our own page, mapped above and never unmapped; the lock serialises.
    unsafe {
        libc::mprotect(
            p as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        );
        (p as *mut u8).write_volatile(1);
        libc::mprotect(p as *mut libc::c_void, 4096, libc::PROT_NONE);
    }
}

/// What the slow path of an in-flight trampoline asks of its library.
pub struct Gate<'a> {
    /// Whether the gate is closed for pause.
    pub paused: &'a dyn Fn() -> bool,
    /// Whether the calling thread may pass a closed gate (cudaw's own thread, or one that
    /// pause already waits for).
    pub may_pass: &'a dyn Fn() -> bool,
    /// Blocks while the gate is closed.
    pub wait: &'a dyn Fn(),
    /// Registers the calling thread's block where pause reads it, and arranges its
    /// unregistration at thread exit; false when it cannot (the thread is ending).
    pub register: &'a dyn Fn(&Block) -> bool,
}

/// The slow path of an in-flight trampoline, on the calling thread's `block` (whose word
/// is [`IN_FLIGHT`], or [`UNREGISTERED`] on the thread's first marked call): registers the
/// block if needed, waits while the gate is closed with the word [`IDLE`], then, with the
/// word [`IN_FLIGHT`] and the gate passed, saves the return address at `slot` in the block
/// and puts `thunk` there. Returns whether it did (false: the call runs uncounted, its
/// thread ending; the word is left [`UNREGISTERED`]).
///
/// # Safety
/// `block` is the calling thread's block; `slot` is the address of the return address of
/// the export call in progress, which jumps to its target next.
pub unsafe fn enter(block: &Block, slot: *mut usize, thunk: usize, gate: &Gate<'_>) -> bool {
    if !admit(block, gate) {
        return false;
    }
    // SAFETY: `slot` holds this call's return address (caller's contract).
    let ret = unsafe { slot.read() };
    block.ret.store(ret, Ordering::Relaxed);
    // SAFETY: as above; the target returns into the thunk, which returns to `ret`.
    unsafe { slot.write(thunk) };
    true
}

/// The slow path of a call marked in flight by its wrapper rather than by a trampoline
/// (the wrapper knows when the call returns): registers `block` if needed and waits while
/// the gate is closed with the word [`IDLE`]; returns with the word [`IN_FLIGHT`] and the
/// gate passed (true: the caller sets the word back to [`IDLE`] after the call), or false
/// when the thread is ending (the word is left [`UNREGISTERED`]: the call runs unmarked).
pub fn admit(block: &Block, gate: &Gate<'_>) -> bool {
    if block.word.load(Ordering::Relaxed) == UNREGISTERED {
        if !(gate.register)(block) {
            if (gate.paused)() && !(gate.may_pass)() {
                (gate.wait)();
            }
            return false;
        }
        block.word.store(IN_FLIGHT, Ordering::SeqCst);
    }
    loop {
        // The word's store before the gate's load (pause: close, barrier, read words).
        fence(Ordering::SeqCst);
        if !(gate.paused)() || (gate.may_pass)() {
            break;
        }
        block.word.store(IDLE, Ordering::SeqCst);
        (gate.wait)();
        block.word.store(IN_FLIGHT, Ordering::SeqCst);
    }
    true
}

/// Sets a block's word back to [`IDLE`] when dropped: the end (or unwinding) of a call
/// [`marked`] in flight.
struct Idle<'a>(&'a Block);

impl Drop for Idle<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.word.store(IDLE, Ordering::Release);
    }
}

/// Runs `f`, a call that can enqueue device work, marked in flight on the calling thread's
/// `block` by its wrapper rather than by an in-flight trampoline (whose thunk makes the
/// return one the CPU cannot predict). The same protocol as the trampolines: the word is
/// set to [`IN_FLIGHT`] before `gate_open` is asked, with no fence (pause's [`barrier`]
/// orders it); a gate that is not open, or the thread's first marked call, goes to `slow`
/// ([`admit`] with the library's [`Gate`]; false: run unmarked). Inside another marked call
/// of the same library, `f` just runs (pause waits for the outer one).
#[inline(always)]
pub fn marked<R>(
    block: &Block,
    gate_open: impl FnOnce() -> bool,
    slow: impl FnOnce(&Block) -> bool,
    f: impl FnOnce() -> R,
) -> R {
    match block.word.load(Ordering::Relaxed) {
        IN_FLIGHT => return f(),
        IDLE => {
            block.word.store(IN_FLIGHT, Ordering::Relaxed);
            // Only the compiler must keep the gate's load after the store.
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            if gate_open() {
                let _idle = Idle(block);
                return f();
            }
        }
        _ => {}
    }
    marked_slow(block, slow, f)
}

#[cold]
#[inline(never)]
fn marked_slow<R>(block: &Block, slow: impl FnOnce(&Block) -> bool, f: impl FnOnce() -> R) -> R {
    if slow(block) {
        let _idle = Idle(block);
        f()
    } else {
        if block.in_flight() {
            // A failure before the gate was passed: nothing else will clear the word.
            block.word.store(IDLE, Ordering::SeqCst);
        }
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn marked_calls_hold_the_word_while_they_run_and_take_the_slow_path_when_the_gate_is_shut() {
        let b = Block::new();
        // First call: unregistered, so the slow path (which registers: here, says yes).
        let slow_calls = AtomicU32::new(0);
        let admit = |b: &Block| {
            slow_calls.fetch_add(1, Ordering::SeqCst);
            b.word.store(IN_FLIGHT, Ordering::SeqCst);
            true
        };
        let seen = marked(&b, || true, admit, || b.word.load(Ordering::SeqCst));
        assert_eq!((seen, b.word.load(Ordering::SeqCst)), (IN_FLIGHT, IDLE));
        assert_eq!(slow_calls.load(Ordering::SeqCst), 1);
        // Registered, gate open: the fast path, in flight during the call, idle after.
        let seen = marked(
            &b,
            || true,
            |_| unreachable!(),
            || b.word.load(Ordering::SeqCst),
        );
        assert_eq!((seen, b.word.load(Ordering::SeqCst)), (IN_FLIGHT, IDLE));
        // Nested: the inner call leaves the outer's word alone.
        let inner = marked(
            &b,
            || true,
            |_| unreachable!(),
            || {
                marked(&b, || true, |_| unreachable!(), || ());
                b.word.load(Ordering::SeqCst)
            },
        );
        assert_eq!((inner, b.word.load(Ordering::SeqCst)), (IN_FLIGHT, IDLE));
        // Gate shut: the word is set before the gate is asked, then the slow path decides.
        let asked = marked(
            &b,
            || {
                assert_eq!(b.word.load(Ordering::SeqCst), IN_FLIGHT);
                false
            },
            admit,
            || 7,
        );
        assert_eq!((asked, b.word.load(Ordering::SeqCst)), (7, IDLE));
        assert_eq!(slow_calls.load(Ordering::SeqCst), 2);
        // A slow path that refuses (a thread ending): the call runs, the word is cleared.
        assert_eq!(marked(&b, || false, |_| false, || 8), 8);
        assert_eq!(b.word.load(Ordering::SeqCst), IDLE);
    }

    #[test]
    fn the_registry_counts_words_in_flight() {
        let r = Registry::new();
        let (a, b) = (Block::new(), Block::new());
        r.register(&a);
        r.register(&b);
        r.register(&a);
        assert_eq!(r.len(), 2);
        assert_eq!(r.busy(), 0, "unregistered words are not in flight");
        a.word.store(IN_FLIGHT, Ordering::SeqCst);
        b.word.store(IDLE, Ordering::SeqCst);
        assert_eq!(r.busy(), 1);
        r.unregister(&a);
        assert_eq!(r.busy(), 0);
        assert!(!r.is_empty());
    }

    fn gate_of<'a>(
        closed: &'a AtomicBool,
        pass: &'a AtomicBool,
        registry: &'a Registry,
        wait: &'a dyn Fn(),
    ) -> (
        impl Fn() -> bool + 'a,
        impl Fn() -> bool + 'a,
        impl Fn(&Block) -> bool + 'a,
        &'a dyn Fn(),
    ) {
        (
            move || closed.load(Ordering::SeqCst),
            move || pass.load(Ordering::SeqCst),
            move |b: &Block| {
                registry.register(b);
                true
            },
            wait,
        )
    }

    #[test]
    fn enter_registers_swaps_the_return_address_and_passes_an_open_gate() {
        let (closed, pass, registry) = (
            AtomicBool::new(false),
            AtomicBool::new(false),
            Registry::new(),
        );
        let (paused, may_pass, register, wait) = gate_of(&closed, &pass, &registry, &|| {
            panic!("waited at an open gate")
        });
        let g = Gate {
            paused: &paused,
            may_pass: &may_pass,
            wait,
            register: &register,
        };
        let block = Block::new();
        let mut slot = 0x1234usize;
        // SAFETY: a stand-in slot.
        assert!(unsafe { enter(&block, &mut slot, 0x9999, &g) });
        assert_eq!((slot, block.ret.load(Ordering::SeqCst)), (0x9999, 0x1234));
        assert!(block.in_flight());
        assert_eq!(registry.busy(), 1);
    }

    #[test]
    fn a_closed_gate_holds_the_caller_idle_unless_it_may_pass() {
        let closed = Arc::new(AtomicBool::new(true));
        let registry = Arc::new(Registry::new());
        let block = Arc::new(Block::new());
        let waits = Arc::new(AtomicU32::new(0));
        let t = {
            let (closed, registry, block, waits) = (
                closed.clone(),
                registry.clone(),
                block.clone(),
                waits.clone(),
            );
            std::thread::spawn(move || {
                let pass = AtomicBool::new(false);
                let wait = || {
                    waits.fetch_add(1, Ordering::SeqCst);
                    while closed.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                };
                let (paused, may_pass, register, wait) = gate_of(&closed, &pass, &registry, &wait);
                let g = Gate {
                    paused: &paused,
                    may_pass: &may_pass,
                    wait,
                    register: &register,
                };
                let mut slot = 7usize;
                // SAFETY: a stand-in slot.
                unsafe { enter(&block, &mut slot, 8, &g) }
            })
        };
        let start = Instant::now();
        while waits.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "never reached the gate"
            );
            std::thread::yield_now();
        }
        barrier();
        assert_eq!(registry.len(), 1);
        assert_eq!(
            registry.busy(),
            0,
            "a thread held at the gate counts as idle"
        );
        closed.store(false, Ordering::SeqCst);
        assert!(t.join().unwrap());
        assert!(block.in_flight());
        assert_eq!(registry.busy(), 1);

        // cudaw's own thread passes a closed gate, in flight.
        closed.store(true, Ordering::SeqCst);
        let pass = AtomicBool::new(true);
        let (paused, may_pass, register, wait) = gate_of(&closed, &pass, &registry, &|| {
            panic!("held a thread that may pass")
        });
        let g = Gate {
            paused: &paused,
            may_pass: &may_pass,
            wait,
            register: &register,
        };
        let b2 = Block::new();
        let mut slot = 1usize;
        // SAFETY: a stand-in slot.
        assert!(unsafe { enter(&b2, &mut slot, 2, &g) });
        assert!(b2.in_flight());
    }

    /// The race the barrier closes: threads store "in flight" then read the gate, with no
    /// fence between (as the trampolines do); the closer closes the gate, runs [`barrier`],
    /// then reads the words. A thread that read the gate open must have its word seen.
    #[test]
    fn barrier_orders_an_unfenced_store_before_a_gate_load() {
        const THREADS: usize = 1;
        const ROUNDS: u32 = 500;
        let gate = Arc::new(AtomicU32::new(0));
        let words: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let passed: Arc<Vec<AtomicU32>> =
            Arc::new((0..THREADS).map(|_| AtomicU32::new(0)).collect());
        let round = Arc::new(AtomicU32::new(0));
        let done = Arc::new(AtomicU32::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (gate, words, passed, round, done) = (
                    gate.clone(),
                    words.clone(),
                    passed.clone(),
                    round.clone(),
                    done.clone(),
                );
                std::thread::spawn(move || {
                    let mut seen = 0;
                    while seen < ROUNDS {
                        let r = round.load(Ordering::Acquire);
                        if r == seen {
                            std::thread::yield_now();
                            continue;
                        }
                        seen = r;
                        // The trampoline: an unfenced store, then the gate's load.
                        words[i].store(1, Ordering::Relaxed);
                        std::sync::atomic::compiler_fence(Ordering::SeqCst);
                        if gate.load(Ordering::Relaxed) == 0 {
                            passed[i].store(seen, Ordering::Release);
                        } else {
                            words[i].store(0, Ordering::Relaxed);
                        }
                        done.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        for r in 1..=ROUNDS {
            for w in words.iter() {
                w.store(0, Ordering::SeqCst);
            }
            gate.store(0, Ordering::SeqCst);
            round.store(r, Ordering::Release);
            std::hint::spin_loop();
            gate.store(1, Ordering::SeqCst);
            barrier();
            let seen: Vec<u64> = words.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            while done.load(Ordering::Acquire) < r * THREADS as u32 {
                std::thread::yield_now();
            }
            for i in 0..THREADS {
                if passed[i].load(Ordering::Acquire) == r {
                    assert_eq!(seen[i], 1, "round {r}: thread {i} passed the gate unseen");
                }
            }
        }
        for h in handles {
            h.join().unwrap();
        }
    }
}
