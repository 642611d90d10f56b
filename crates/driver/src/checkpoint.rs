//! The driver's process checkpoint API (`cuCheckpointProcess*`, drivers 550 and later; GPU
//! remapping on restore from r580), called about another process by PID, as `cudaw-ckpt`
//! does: [`CheckpointApi::load`] resolves the six entry points in a loaded driver, or says
//! which are missing (an older driver).

use std::ffi::{c_int, c_void};

use crate::api::Driver;
use crate::error::{DriverError, Result, CUDA_ERROR_NOT_FOUND};
use crate::loader::LibCuda;

/// `CU_PROCESS_STATE_*`, the driver's view of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// `CU_PROCESS_STATE_RUNNING`.
    Running,
    /// `CU_PROCESS_STATE_LOCKED`: its CUDA calls wait.
    Locked,
    /// `CU_PROCESS_STATE_CHECKPOINTED`: its GPU state is in host memory, the GPU holds
    /// nothing of it.
    Checkpointed,
    /// `CU_PROCESS_STATE_FAILED`.
    Failed,
    /// Another value (checkpointing, restoring to custom storage, or newer).
    Other(i32),
}

impl ProcessState {
    fn from_raw(v: c_int) -> ProcessState {
        match v {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            other => ProcessState::Other(other),
        }
    }
}

/// The `CUcheckpoint*Args` structures are 64 bytes, zero but for the fields set here.
type Args = [u64; 8];

type WithArgs = unsafe extern "C" fn(c_int, *mut Args) -> u32;
type WithOut = unsafe extern "C" fn(c_int, *mut c_int) -> u32;

/// The entry points, resolved.
pub struct CheckpointApi<'a> {
    cuda: &'a LibCuda,
    lock: WithArgs,
    checkpoint: WithArgs,
    restore: WithArgs,
    unlock: WithArgs,
    get_state: WithOut,
}

/// The names of the entry points, in the order the driver's header lists them.
pub const ENTRY_POINTS: [&str; 5] = [
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

impl<'a> CheckpointApi<'a> {
    /// Resolves the entry points in `cuda`. `CUDA_ERROR_NOT_FOUND` naming the missing ones
    /// when the driver lacks any (drivers before 550).
    pub fn load(cuda: &'a LibCuda) -> Result<CheckpointApi<'a>> {
        let found: Vec<Option<usize>> = ENTRY_POINTS
            .iter()
            .map(|n| {
                let name = std::ffi::CString::new(*n).expect("no NUL in the names");
                cuda.raw_symbol(&name)
            })
            .collect();
        let missing: Vec<&str> = ENTRY_POINTS
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() {
            return Err(DriverError {
                code: CUDA_ERROR_NOT_FOUND,
                name: format!("{} has no {}", cuda.path(), missing.join(", ")),
                call: "dlsym",
            });
        }
        let at = |i: usize| found[i].expect("checked above") as *const c_void;
        // SAFETY: each address is the driver's export of that name, whose C signature in
        // cuda.h is `CUresult f(int pid, CUcheckpoint*Args *args)` (the state getter:
        // `CUresult f(int pid, CUprocessState *state)`, an enum of int size); the library
        // stays loaded as long as `cuda`, which this borrows.
        unsafe {
            Ok(CheckpointApi {
                cuda,
                get_state: std::mem::transmute::<*const c_void, WithOut>(at(0)),
                lock: std::mem::transmute::<*const c_void, WithArgs>(at(1)),
                checkpoint: std::mem::transmute::<*const c_void, WithArgs>(at(2)),
                restore: std::mem::transmute::<*const c_void, WithArgs>(at(3)),
                unlock: std::mem::transmute::<*const c_void, WithArgs>(at(4)),
            })
        }
    }

    fn check(&self, code: u32, call: &'static str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let name = self
            .cuda
            .error_name(code)
            .unwrap_or_else(|| format!("CUDA_ERROR_{code}"));
        Err(DriverError { code, name, call })
    }

    fn call(&self, f: WithArgs, pid: u32, mut args: Args, name: &'static str) -> Result<()> {
        let pid = c_int::try_from(pid).map_err(|_| DriverError {
            code: crate::error::CUDA_ERROR_INVALID_VALUE,
            name: format!("PID {pid} is out of range"),
            call: name,
        })?;
        // SAFETY: `f` has this signature (see `load`); `args` is a live, zeroed 64-byte
        // structure with only documented fields set, and any pointer in it outlives the call.
        let code = unsafe { f(pid, &mut args) };
        self.check(code, name)
    }

    /// `cuCheckpointProcessGetState`.
    pub fn state(&self, pid: u32) -> Result<ProcessState> {
        let mut s: c_int = -1;
        let p = c_int::try_from(pid).unwrap_or(-1);
        // SAFETY: as `call`, with a valid out-pointer.
        let code = unsafe { (self.get_state)(p, &mut s) };
        self.check(code, "cuCheckpointProcessGetState")?;
        Ok(ProcessState::from_raw(s))
    }

    /// `cuCheckpointProcessLock`, waiting up to `timeout_ms` (0: for ever) for the
    /// process's CUDA work; `CUDA_ERROR_NOT_READY` at the timeout (the process runs on).
    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<()> {
        let mut a: Args = [0; 8];
        a[0] = u64::from(timeout_ms);
        self.call(self.lock, pid, a, "cuCheckpointProcessLock")
    }

    /// `cuCheckpointProcessCheckpoint`, to the process's host memory.
    pub fn checkpoint(&self, pid: u32) -> Result<()> {
        self.call(
            self.checkpoint,
            pid,
            [0; 8],
            "cuCheckpointProcessCheckpoint",
        )
    }

    /// `cuCheckpointProcessRestore`; `gpu_pairs` (old UUID, new UUID) move the process onto
    /// other GPUs (r580), none restores it where it was.
    pub fn restore(&self, pid: u32, gpu_pairs: &[([u8; 16], [u8; 16])]) -> Result<()> {
        let mut a: Args = [0; 8];
        // `CUcheckpointGpuPair` is two `CUuuid`s: 32 bytes, as each tuple here.
        let pairs: Vec<[[u8; 16]; 2]> = gpu_pairs.iter().map(|(o, n)| [*o, *n]).collect();
        if !pairs.is_empty() {
            a[0] = pairs.as_ptr() as u64;
            a[1] = pairs.len() as u64;
        }
        self.call(self.restore, pid, a, "cuCheckpointProcessRestore")
    }

    /// `cuCheckpointProcessUnlock`.
    pub fn unlock(&self, pid: u32) -> Result<()> {
        self.call(self.unlock, pid, [0; 8], "cuCheckpointProcessUnlock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_the_entry_points_is_named_with_them() {
        // libc loads anywhere and has none of them: an old driver's case.
        let Ok(lib) = LibCuda::open_path("libc.so.6") else {
            return;
        };
        let e = CheckpointApi::load(&lib)
            .err()
            .expect("libc has no checkpoint API");
        assert_eq!(e.code, CUDA_ERROR_NOT_FOUND);
        assert!(
            e.name
                .contains("libc.so.6 has no cuCheckpointProcessGetState, cuCheckpointProcessLock"),
            "{}",
            e.name
        );
    }

    #[test]
    fn simgpu_has_them_and_a_missing_process_is_an_error() {
        let lib = LibCuda::open_path(&simgpu::testing::library_path().to_string_lossy())
            .expect("loading simgpu");
        lib.init().expect("cuInit");
        let api = CheckpointApi::load(&lib).expect("simgpu has the API");
        let e = api.state(i32::MAX as u32).unwrap_err();
        assert_eq!(e.name, "CUDA_ERROR_INVALID_VALUE");
        assert_eq!(e.call, "cuCheckpointProcessGetState");
    }
}
