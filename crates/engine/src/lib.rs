//! cudaw's engine: everything that acts on a process's GPU state — pause, resume, dump,
//! restore, driver-handle virtualisation, the pinned staging, the device memory managers
//! and budgets, the kernel registry — apart from the library that carries it
//! (`crates/cudart-shim`, cudaw's `libcudart.so`).
//!
//! What only that library has (the pause gate, its calls in flight, the real runtime's
//! calls, the tracer) comes through one trait, [`host::Host`], installed once
//! ([`host::install`]); the engine's tests install one over simgpu's driver and run
//! pause, resume, dump and restore in-process.
//!
//! The modules, by concern:
//! - [`inflight`]: the wrapped calls counted in flight, and the wait for them.
//! - [`signals`], [`lifecycle`]: the pause and resume signals' self-pipe; load, exit, fork.
//! - [`control`]: the control thread and the control socket, the only caller of
//!   [`requests`] (pause, resume, dump, restore one at a time; a pause at exit).
//! - [`evict`]: pause and resume themselves; [`image`]: dump and restore, built on them.
//! - [`memory`], [`handles`], [`staging`], [`registry`]: the state they act on.
//! - [`pageable`]: the program's copies with pageable host memory, through the staging.
//! - [`pinning`]: smart pinning (`CUDAW_PIN`): hot pageable ranges page-locked in place.
#![deny(unsafe_op_in_unsafe_fn)]
// Module docs name the crate-private steps they describe (`--document-private-items`
// shows them).
#![allow(rustdoc::private_intra_doc_links)]
// Handles such as `cudaStream_t` are opaque pointers handed to the host, never
// dereferenced by the engine.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub use cudaw_config as config;
pub use cudaw_shim_core::{boundary, log};

pub mod control;
pub mod drain;
pub mod evict;
pub mod failure;
pub mod handles;
pub mod hold;
pub mod host;
pub mod image;
pub mod inflight;
pub mod launch_args;
pub mod lifecycle;
pub mod memory;
pub mod memory_calls;
pub mod pageable;
pub mod peer;
pub mod pinning;
pub mod registry;
pub mod requests;
pub mod room;
pub mod signals;
pub mod slim;
pub mod staging;
pub mod state;
pub mod summary;
pub mod trace;
pub mod types;

pub use host::{install, Host};
