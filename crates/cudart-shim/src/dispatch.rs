//! The dispatch table: the bottom layer of the library.
//!
//! `build.rs` writes `names.rs` (every runtime export of every major, sorted, with an index
//! constant per name); this module holds the table over those names ([`DISPATCH`]: where
//! each export goes, and the real runtime's function for each), the typed look-ups of the
//! real functions ([`real`], [`real_or_stub`]) and the stubs for names the real runtime
//! lacks. It names nothing of this library above it: the table's initialiser is the crate
//! root's `initialise`, which wires the layers; the trampolines that jump through the table
//! are [`crate::trampolines`]'.

use cudaw_shim_core::Dispatch;

include!(concat!(env!("OUT_DIR"), "/names.rs"));

/// Number of names in the dispatch table.
pub const N: usize = ALL_NAMES.len();

/// Where each export goes (a wrapper of cudaw's, the real function, or a stub), and the
/// real runtime's function for each name.
pub static DISPATCH: Dispatch<N> = Dispatch::new(&ALL_NAMES, crate::initialise);

/// Whether the shim has initialised (or begun to).
pub(crate) fn initialised() -> bool {
    DISPATCH.initialised()
}

/// Marks the shim initialised without loading a runtime: for tests that fill the table
/// themselves (in a process of their own).
#[doc(hidden)]
pub fn skip_initialise_for_test() {
    DISPATCH.skip_initialise_for_test();
}

/// The real runtime's function `index`, or the stub for a name it lacks: where the export
/// goes when cudaw does not wrap it.
pub fn real_or_stub(index: usize) -> usize {
    match DISPATCH.real_now(index) {
        0 => stub_for(ALL_NAMES[index]),
        p => p,
    }
}

/// The stub for a name the real runtime lacks: a typed one where the return type is not a
/// `cudaError_t`, else the one returning `cudaErrorNotSupported`.
pub(crate) fn stub_for(name: &str) -> usize {
    match name {
        "cudaGetErrorString" | "cudaGetErrorName" => error_string_stub as *const () as usize,
        _ => cudaw_shim_core::dispatch::unsupported_address(),
    }
}

extern "C" fn error_string_stub() -> *const std::ffi::c_char {
    c"cudaw: the real CUDA runtime could not be loaded".as_ptr()
}

/// The index of `name` in [`ALL_NAMES`].
pub fn index_of(name: &str) -> Option<usize> {
    DISPATCH.index_of(name)
}

/// The real runtime's function for `index`, if it has one (initialising first).
#[inline]
pub fn real(index: usize) -> Option<usize> {
    DISPATCH.real(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sorted_unique_and_indexed() {
        assert!(ALL_NAMES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(index_of("cudaMalloc"), Some(idx::cudaMalloc));
        assert_eq!(ALL_NAMES[idx::cudaLaunchKernel], "cudaLaunchKernel");
        assert!(index_of("notACudaFunction").is_none());
        const { assert!(EXPORTED_COUNT <= N) };
    }
}
