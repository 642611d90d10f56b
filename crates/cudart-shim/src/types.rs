//! The runtime's C types and error codes that cudaw's wrappers touch
//! ([`cudaw_engine::types`]), and a compile-time check for the wrapper lists.

pub use cudaw_engine::types::*;

/// Whether `a` and `b` hold the same indices (each once): for compile-time checks that a
/// set of wrappers is the list's.
pub const fn same_set(a: &[usize], b: &[usize]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        let mut j = 0;
        let mut found = false;
        while j < b.len() {
            found |= a[i] == b[j];
            j += 1;
        }
        if !found {
            return false;
        }
        i += 1;
    }
    true
}
