//! Shared by the driver's integration tests.

use std::path::PathBuf;

/// `libsimgpu.so`, built by cargo (simgpu is a dev-dependency) into the same `deps/` folder
/// as the test binary.
pub fn simgpu_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    [deps.join("libsimgpu.so"), deps.join("../libsimgpu.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libsimgpu.so not found next to {}", exe.display()))
}
