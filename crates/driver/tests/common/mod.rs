//! Shared by the driver's integration tests.

pub use simgpu::testing::library_path as simgpu_path;
