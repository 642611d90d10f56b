//! The dispatch table: where each export's trampoline jumps ([`Dispatch::table`]) and the
//! real library's function for each name ([`Dispatch::real`]), filled once at
//! initialisation; and the trampolines' slow path ([`slow_resolve`]).
//!
//! Each cdylib's `build.rs` (through `shim-build`) writes its sorted names and one
//! trampoline per export; the cdylib declares one `static DISPATCH: Dispatch<N>` over
//! those names, and hands `sym DISPATCH` to the trampolines as their `{table}`: the table
//! is the first field of this `repr(C)` struct, so the static's address is the table's.

use crate::boundary::guard;
use crate::Library;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// `CUDA_ERROR_NOT_SUPPORTED` and `cudaErrorNotSupported` (both 801): what a call the
/// real library lacks returns.
pub const CUDA_ERROR_NOT_SUPPORTED: u32 = 801;

extern "C" fn unsupported() -> u32 {
    CUDA_ERROR_NOT_SUPPORTED
}

/// The stub returning [`CUDA_ERROR_NOT_SUPPORTED`]: where a name the real library lacks
/// goes (the argument registers are ignored, so it serves any signature that returns a
/// CUDA error code).
pub fn unsupported_address() -> usize {
    unsupported as *const () as usize
}

/// One library's dispatch table over its `N` sorted names.
#[repr(C)]
pub struct Dispatch<const N: usize> {
    /// Where each export goes: a wrapper of cudaw's, the real function, or a stub. First:
    /// the trampolines index this static's address.
    table: [AtomicUsize; N],
    /// The real library's function for each name (0: the real library lacks it).
    real: [AtomicUsize; N],
    names: &'static [&'static str; N],
    init: Once,
    initialise: fn(),
}

impl<const N: usize> Dispatch<N> {
    /// The table over `names` (sorted), filled by `initialise` on first need.
    pub const fn new(names: &'static [&'static str; N], initialise: fn()) -> Self {
        Dispatch {
            table: [const { AtomicUsize::new(0) }; N],
            real: [const { AtomicUsize::new(0) }; N],
            names,
            init: Once::new(),
            initialise,
        }
    }

    /// The names, sorted.
    pub fn names(&self) -> &'static [&'static str; N] {
        self.names
    }

    /// The index of `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.binary_search(&name).ok()
    }

    /// Runs the initialisation (once).
    pub fn ensure_initialised(&self) {
        self.init.call_once(self.initialise);
    }

    /// Whether the initialisation has run (or begun to).
    pub fn initialised(&self) -> bool {
        self.init.is_completed()
    }

    /// Marks the table initialised without running the initialisation: for tests that
    /// fill the table themselves (in a process of their own).
    #[doc(hidden)]
    pub fn skip_initialise_for_test(&self) {
        self.init.call_once(|| {});
    }

    /// Where export `index` goes now (the stub while unset).
    pub fn target(&self, index: u32) -> usize {
        match self
            .table
            .get(index as usize)
            .map(|t| t.load(Ordering::Acquire))
        {
            Some(0) | None => unsupported_address(),
            Some(target) => target,
        }
    }

    /// Points export `index` at `f` (a wrapper, the real function or a stub).
    pub fn set(&self, index: usize, f: usize) {
        if let Some(t) = self.table.get(index) {
            t.store(f, Ordering::Release);
        }
    }

    /// Every entry, for a test that reads or fills them.
    pub fn table(&self) -> &[AtomicUsize; N] {
        &self.table
    }

    /// The real library's function `index`, if it has one (initialising first).
    #[inline]
    pub fn real(&self, index: usize) -> Option<usize> {
        // Filled before any wrapper is reachable: a wrapper's forward finds it on the
        // first load, without the initialisation's `Once` (one cache line fewer on a
        // launch).
        match self.real.get(index)?.load(Ordering::Acquire) {
            0 => self.real_initialised(index),
            p => Some(p),
        }
    }

    #[cold]
    fn real_initialised(&self, index: usize) -> Option<usize> {
        self.ensure_initialised();
        match self.real.get(index)?.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    /// The real library's function `index` as it stands (0: none, or not loaded yet),
    /// without initialising.
    pub fn real_now(&self, index: usize) -> usize {
        self.real
            .get(index)
            .map_or(0, |r| r.load(Ordering::Acquire))
    }

    /// Fills both tables from the real library (`lookup(name)`: its function's address),
    /// `stub_for(name)` where it lacks a name. Returns the names it lacks.
    pub fn fill(
        &self,
        lookup: impl Fn(&str) -> Option<usize>,
        stub_for: impl Fn(&str) -> usize,
    ) -> Vec<&'static str> {
        let mut missing = Vec::new();
        for (i, name) in self.names.iter().enumerate() {
            match lookup(name) {
                Some(p) => {
                    self.real[i].store(p, Ordering::Release);
                    self.table[i].store(p, Ordering::Release);
                }
                None => {
                    self.table[i].store(stub_for(name), Ordering::Release);
                    missing.push(*name);
                }
            }
        }
        missing
    }

    /// Points every export at `stub_for(name)`: no real library.
    pub fn fill_stubs(&self, stub_for: impl Fn(&str) -> usize) {
        for (t, name) in self.table.iter().zip(self.names) {
            t.store(stub_for(name), Ordering::Release);
        }
    }

    /// Points each `(index, wrapper)` export at cudaw's wrapper.
    pub fn install(&self, wrappers: impl IntoIterator<Item = (usize, usize)>) {
        for (i, f) in wrappers {
            self.set(i, f);
        }
    }
}

/// The slow path of every plain trampoline (the assembly's `{resolve}`): initialise once,
/// wait while paused (unless the thread is inside a call in flight, which pause already
/// waits for: holding it would deadlock the pause), return the target; `slot` is where
/// the caller's return address is ([`Library::entered`]).
///
/// # Safety
/// `slot` is the address of the export call's return address, and the call jumps to the
/// returned target next (the assembly's contract).
pub unsafe fn slow_resolve<L: Library>(index: u32, slot: *mut usize) -> usize {
    guard(L::SLOW_PATH, unsupported_address(), || {
        L::ensure_initialised();
        if !L::block().in_flight() {
            L::wait_while_paused();
        }
        let target = L::target(index);
        // SAFETY: the caller's contract.
        unsafe { L::entered(index, slot) };
        target
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    static NAMES: [&str; 3] = ["a", "b", "c"];
    static D: Dispatch<3> = Dispatch::new(&NAMES, || {});

    #[test]
    fn fills_installs_and_resolves() {
        assert_eq!(D.index_of("b"), Some(1));
        assert_eq!(D.index_of("z"), None);
        assert_eq!(D.target(0), unsupported_address());
        let missing = D.fill(|n| (n != "c").then_some(0x1000), |_| 0x42);
        assert_eq!(missing, ["c"]);
        assert_eq!(D.target(0), 0x1000);
        assert_eq!(D.target(2), 0x42);
        assert_eq!(D.real(2), None);
        assert_eq!(D.real(1), Some(0x1000));
        D.install([(1, 0x2000)]);
        assert_eq!(D.target(1), 0x2000);
        assert_eq!(D.real(1), Some(0x1000));
        assert_eq!(D.target(7), unsupported_address());
        D.fill_stubs(|_| 0x42);
        assert_eq!(D.target(0), 0x42);
    }
}
