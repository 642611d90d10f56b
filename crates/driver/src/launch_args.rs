//! A launch's arguments as the driver API passes them, read where they are: the
//! dimensions of `cuLaunchKernelEx`'s `CUlaunchConfig`, and the argument block of
//! `cuLaunchKernel` — one pointer per parameter (`kernelParams`) or, without them, the
//! buffer its `extra` list names (`CU_LAUNCH_PARAM_BUFFER_POINTER`).

use std::ffi::c_void;

/// `CU_LAUNCH_PARAM_END` (cuda.h).
pub const PARAM_END: usize = 0;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER` (cuda.h).
pub const PARAM_BUFFER_POINTER: usize = 1;
/// `CU_LAUNCH_PARAM_BUFFER_SIZE` (cuda.h).
pub const PARAM_BUFFER_SIZE: usize = 2;

/// The grid, block, shared memory and stream of a launch.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory.
    pub shared: u32,
    /// The stream.
    pub stream: *mut c_void,
}

/// `CUlaunchConfig` (cuda.h), the first fields of which `cuLaunchKernelEx` reads.
#[repr(C)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: *mut c_void,
}

/// The dimensions of a `cuLaunchKernelEx` launch (`None` for a null config).
///
/// # Safety
/// `config` is null or points to a `CUlaunchConfig`.
pub unsafe fn dims_of_config(config: *const c_void) -> Option<Dims> {
    // SAFETY: the caller's `CUlaunchConfig` (null checked by `as_ref`).
    let c = unsafe { config.cast::<LaunchConfig>().as_ref() }?;
    Some(Dims {
        grid: c.grid,
        block: c.block,
        shared: c.shared,
        stream: c.stream,
    })
}

/// Where a launch's parameters are: `params[ordinal]` (one pointer per parameter) or,
/// without `params`, `buffer + offset` (the buffer `extra` names); neither when both are
/// null.
#[derive(Debug, Clone, Copy)]
pub struct Args {
    params: *mut *mut c_void,
    buffer: *const u8,
}

impl Args {
    /// A launch's argument block, from its `kernelParams` and `extra`.
    ///
    /// # Safety
    /// `params` is null or holds one pointer per kernel parameter, each to that
    /// parameter's bytes; without `params`, `extra` is null or a key/value list ended by
    /// `CU_LAUNCH_PARAM_END` whose buffer, if it names one, holds the whole parameter
    /// block. All stay valid and unchanged while the `Args` is used (a launch's
    /// arguments, during its wrapper).
    pub unsafe fn new(params: *mut *mut c_void, extra: *mut *mut c_void) -> Args {
        let buffer = if params.is_null() {
            // SAFETY: the caller's contract for `extra`.
            unsafe { extra_buffer(extra) }
        } else {
            std::ptr::null()
        };
        Args { params, buffer }
    }

    /// Whether neither `params` nor an `extra` buffer is at hand.
    pub fn is_empty(&self) -> bool {
        self.params.is_null() && self.buffer.is_null()
    }

    /// Where parameter `ordinal` (at `offset` in the block) begins; null when unknown.
    fn base(&self, ordinal: u32, offset: u32) -> *const u8 {
        if !self.params.is_null() {
            // SAFETY: one argument pointer per kernel parameter (`new`'s contract); the
            // layout gives the ordinals of this kernel's parameters.
            return (unsafe { *self.params.add(ordinal as usize) }) as *const u8;
        }
        if self.buffer.is_null() {
            return std::ptr::null();
        }
        // SAFETY: the buffer holds the whole parameter block (`new`'s contract).
        unsafe { self.buffer.add(offset as usize) }
    }

    /// The `size` bytes of parameter `ordinal`, at `offset` in the block, as the kernel's
    /// layout gives them.
    pub fn param(&self, ordinal: u32, offset: u32, size: u32) -> Option<&[u8]> {
        let base = self.base(ordinal, offset);
        // SAFETY: `base` points at this parameter's `size` bytes (`new`'s contract, the
        // layout being the kernel's).
        (!base.is_null()).then(|| unsafe { std::slice::from_raw_parts(base, size as usize) })
    }

    /// The 8-byte word at byte `at` of parameter `ordinal` (at `offset` in the block).
    ///
    /// # Safety
    /// A whole word lies at `at` within the parameter's bytes (a scan of this kernel's
    /// layout found one there).
    pub unsafe fn word(&self, ordinal: u32, offset: u32, at: u32) -> Option<u64> {
        let base = self.base(ordinal, offset);
        // SAFETY: the caller's contract; `read_unaligned` for any alignment.
        (!base.is_null()).then(|| unsafe { base.add(at as usize).cast::<u64>().read_unaligned() })
    }
}

/// The argument buffer `extra` names (`CU_LAUNCH_PARAM_BUFFER_POINTER`), if any.
///
/// # Safety
/// `extra` is null or a key/value list ended by `CU_LAUNCH_PARAM_END`.
unsafe fn extra_buffer(extra: *mut *mut c_void) -> *const u8 {
    if extra.is_null() {
        return std::ptr::null();
    }
    let mut i = 0;
    // At most 16 pairs: the list holds three keys at most, and a corrupt one is not chased.
    while i < 32 {
        // SAFETY: the caller's list, ended by CU_LAUNCH_PARAM_END.
        let key = unsafe { *extra.add(i) } as usize;
        if key == PARAM_END {
            break;
        }
        // SAFETY: every key but the end is followed by its value.
        let value = unsafe { *extra.add(i + 1) };
        if key == PARAM_BUFFER_POINTER {
            return value as *const u8;
        }
        i += 2;
    }
    std::ptr::null()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_come_from_params_or_the_extra_buffer() {
        // params: one pointer per argument.
        let (mut v, mut n) = (0x7f00_1000u64, 1024i32);
        let mut params: [*mut c_void; 2] =
            [(&mut v as *mut u64).cast(), (&mut n as *mut i32).cast()];
        // SAFETY: two parameters, alive for the test.
        let args = unsafe { Args::new(params.as_mut_ptr(), std::ptr::null_mut()) };
        assert!(!args.is_empty());
        assert_eq!(args.param(0, 0, 8), Some(&0x7f00_1000u64.to_ne_bytes()[..]));
        assert_eq!(args.param(1, 8, 4), Some(&1024i32.to_ne_bytes()[..]));
        // SAFETY: parameter 0 is one word.
        assert_eq!(unsafe { args.word(0, 0, 0) }, Some(0x7f00_1000));

        // extra: CU_LAUNCH_PARAM_BUFFER_POINTER, the buffer, CU_LAUNCH_PARAM_BUFFER_SIZE,
        // its size, the end: parameters at their offsets.
        let mut buffer = [0xaaaa_u64, 0xbbbb, 0xcccc];
        let mut size = std::mem::size_of_val(&buffer);
        let mut extra = [
            PARAM_BUFFER_POINTER as *mut c_void,
            buffer.as_mut_ptr().cast(),
            PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            PARAM_END as *mut c_void,
        ];
        // SAFETY: a list ended by the end key, naming a 24-byte block.
        let args = unsafe { Args::new(std::ptr::null_mut(), extra.as_mut_ptr()) };
        assert_eq!(args.param(1, 8, 8), Some(&0xbbbbu64.to_ne_bytes()[..]));
        // SAFETY: parameter 1 is a 16-byte struct at offset 8.
        assert_eq!(unsafe { args.word(1, 8, 8) }, Some(0xcccc));

        // A list without a buffer, and none at all: nothing.
        let mut bare = [PARAM_END as *mut c_void];
        // SAFETY: an empty list; null.
        let (a, b) = unsafe {
            (
                Args::new(std::ptr::null_mut(), bare.as_mut_ptr()),
                Args::new(std::ptr::null_mut(), std::ptr::null_mut()),
            )
        };
        assert!(a.is_empty() && b.is_empty());
        assert_eq!(a.param(0, 0, 8), None);
    }

    #[test]
    fn launch_config_dims_are_read_from_cu_launch_config() {
        #[repr(C)]
        struct Config {
            dims: [u32; 7],
            stream: usize,
            attrs: usize,
            n: u32,
        }
        let c = Config {
            dims: [4, 2, 1, 128, 1, 1, 512],
            stream: 0x5000,
            attrs: 0,
            n: 0,
        };
        // SAFETY: a `CUlaunchConfig`'s layout, alive for the call.
        let d = unsafe { dims_of_config((&c as *const Config).cast()) }.unwrap();
        assert_eq!(
            (d.grid, d.block, d.shared, d.stream as usize),
            ([4, 2, 1], [128, 1, 1], 512, 0x5000)
        );
        // SAFETY: null is allowed.
        assert!(unsafe { dims_of_config(std::ptr::null()) }.is_none());
    }
}
