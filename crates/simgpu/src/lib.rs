//! simgpu: a simulated CUDA device over host memory. Built as a cdylib it plays
//! `libcuda.so.1` (see [`driver_api`] for the exported functions) and the subset of
//! `libcudart` the test programs reach through cudaw's forwarding ([`runtime_api`]), with
//! their kernels run as host functions looked up by name ([`kernels`]).
//!
//! Device pointers are host addresses: a reservation is a real inaccessible address range,
//! physical memory is a shared memory file mapped into it, so memory that is unmapped
//! really faults and kernels can later run as host functions. Streams run on worker
//! threads, so asynchronous work is really asynchronous.
//!
//! Several devices ([`device`]): `SIMGPU_DEVICES` (how many, default 1; 0: none),
//! `SIMGPU_MEM` (each device's memory, e.g. `8G`, or `8G,4G` device by device; default
//! 16G) and `CUDA_VISIBLE_DEVICES` (as the driver reads it), read once at `cuInit`
//! ([`config`]); each device has its own memory, contexts, streams and sticky error, and
//! kernels reach another device's memory only with peer access or a `cuMemSetAccess`
//! right, as on a GPU. Memory created with the POSIX file-descriptor handle type can be
//! exported, passed to another process and imported there, as NCCL does between ranks
//! ([`memory`]). `SIMGPU_LAUNCH_DELAY_US` (every launch sleeps that long inside the
//! call before queuing its kernel: tests widen the window of a launch in flight);
//! `SIMGPU_COPY_DELAY_US` (every copy of the driver API waits that long on its stream
//! before moving its bytes: tests show that later work waits for a copy).
//!
//! The driver's process checkpoint API (`cuCheckpointProcess*`) works across processes
//! as the real one does ([`checkpoint`]): every process serves a small socket
//! (`$SIMGPU_CHECKPOINT_DIR/PID.sock`) that another process's calls reach;
//! `SIMGPU_CHECKPOINT=unsupported` makes the calling process's entry points return
//! `CUDA_ERROR_NOT_SUPPORTED`.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

/// `eprintln!`, but the whole line in one write: cudaw's libraries log to the same standard
/// error with their own locks, and a line written in pieces gets theirs inside it.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say_line(format_args!($($arg)*))
    };
}

/// Writes `args` and a newline to standard error in one `write` (see `say!`).
pub(crate) fn say_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut line = args.to_string();
    line.push('\n');
    let _ = std::io::stderr().write_all(line.as_bytes());
}

pub mod checkpoint;
pub mod config;
pub mod device;
pub mod driver_api;
pub mod driver_modules;
pub mod error;
pub mod kernels;
pub mod memory;
mod os;
pub mod runtime;
pub mod runtime_api;
pub mod stream;
pub mod testing;

pub use error::{CuError, CuResult};
