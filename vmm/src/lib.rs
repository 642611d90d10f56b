//! cudaw's virtual memory manager. See `../shared/DESIGN.md`.
#![deny(missing_docs)]

pub mod backend;

pub use backend::{Backend, BackendError};
