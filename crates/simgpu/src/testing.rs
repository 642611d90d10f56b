//! For the in-process tests of the crates that load simgpu as their driver (`driver`,
//! `engine`): where cargo built the library, and test data.

use std::path::PathBuf;

/// `libsimgpu.so`, built by cargo (simgpu is a dev-dependency of the calling crate) into
/// the same `deps/` folder as the running test binary, or the folder above it.
///
/// # Panics
/// When it is in neither place (simgpu is not a dev-dependency of the test's crate).
pub fn library_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    [deps.join("libsimgpu.so"), deps.join("../libsimgpu.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libsimgpu.so not found next to {}", exe.display()))
}

/// `len` bytes of a pseudo-random pattern that differs with `seed` (xorshift64).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_differ_by_seed_and_repeat_by_seed() {
        assert_eq!(super::pattern(64, 3), super::pattern(64, 3));
        assert_ne!(super::pattern(64, 3), super::pattern(64, 4));
        assert_eq!(super::pattern(5, 1).len(), 5);
    }
}
