//! The plumbing cudaw's two cdylibs share: the runtime shim (`crates/cudart-shim`,
//! `libcudart.so`) and the driver layer (`crates/driver-shim`, `libcuda.so.1`), and the
//! engine (`crates/engine`) that both drive.
//!
//! - [`log`]: one logging facade (`CUDAW_LOG`), each library naming itself.
//! - [`boundary`]: the panic boundary; no panic crosses `extern "C"`.
#![forbid(unsafe_code)]

pub mod boundary;
pub mod log;
