//! Reads CUDA device code — fatbin containers, cubin ELF images and PTX text, alone or inside a
//! host executable, shared library or object — and answers one question cheaply: *what is the
//! parameter layout of kernel NAME on sm_XX?* Pure, safe Rust: no input makes it panic or read
//! out of bounds; every failure is an [`Error`] naming the offset and the value seen.
//!
//! # Entry points
//!
//! - [`Fatbin::parse`] — any file or buffer: a host ELF (its `.nv_fatbin` and `__nv_relfatbin`
//!   sections), one or several concatenated fatbin containers, a cubin, or PTX text. It reads
//!   headers only: no entry is decompressed.
//! - [`Fatbin::kernel`] — the layout of one kernel for a device SM, parsed on first request
//!   and cached; [`Fatbin::kernels_for_sm`] — every kernel the driver would load on that SM.
//!   Per SM, a name → kernel map is built lazily: a lookup decompresses the chosen entry of
//!   each container (and only those), in input order, until it finds the name; names already
//!   seen are a hash lookup. `Fatbin` is `Sync`: share it between threads. For the fastest
//!   first launch, index the one container the kernel was registered with
//!   ([`container_len`] + [`Fatbin::parse`] on exactly its bytes).
//! - [`Fatbin::select`] / [`select_entry`] — which entry of a container the driver runs on an
//!   SM: an exact-SM cubin; else a cubin of the same major and a lower minor (arch-specific
//!   `sm_XXa` cubins only on exactly their SM); else the highest PTX whose SM is ≤ the device's
//!   (JIT-compiled).
//! - [`Entry::kernels`] — every kernel of one entry (decompressing it).
//! - [`parse_cubin`], [`parse_ptx`] — one cubin or PTX text.
//! - For a caller that holds a raw pointer ([`raw`]): [`parse_wrapper`] reads the 24-byte
//!   `__fatBinC_Wrapper_t` given to `__cudaRegisterFatBinary`; [`container_len`] reads a
//!   container's total length from its first 16 bytes; [`elf_image_len`] a cubin's length;
//!   [`detect_image_kind`] tells a fatbin, cubin or PTX image (what `cuModuleLoadData` gets)
//!   apart. Read exactly the declared bytes, then call [`Fatbin::parse`].
//!
//! ```no_run
//! let bytes = std::fs::read("a.out").unwrap();
//! let fatbin = fatbin::Fatbin::parse(&bytes).unwrap();
//! if let Some(k) = fatbin.kernel("_Z6vecAddPfS_S_i", 90).unwrap() {
//!     for p in &k.params {
//!         println!("param {} at offset {} ({} bytes)", p.ordinal, p.offset, p.size);
//!     }
//! }
//! ```
//!
//! # Layouts
//!
//! A cubin's layout comes from `.nv.info.<kernel>`: `EIATTR_KPARAM_INFO` (0x17; size in bits
//! 18–31 of its third word) and `EIATTR_KPARAM_INFO_V2` (0x45, for parameters over 4 KiB;
//! verified against cuobjdump: u32 index, u16 ordinal, u16 offset, size in bits 0–15 of the
//! third word), the total from `EIATTR_CBANK_PARAM_SIZE` (0x19). A PTX layout packs each
//! `.param` at its natural (or `.align`) alignment in order; for the same kernel both agree.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod container;
pub mod cubin;
mod error;
mod index;
pub mod ptx;
pub mod raw;
mod select;
pub mod sites;
pub mod stream;

pub use container::{
    Compression, Container, Entry, EntryKind, FLAG_64BIT, FLAG_ARCH_SPECIFIC, FLAG_DEBUG,
    FLAG_FAMILY_SPECIFIC, FLAG_LZ4, FLAG_ZSTD, MAX_UNCOMPRESSED_SIZE, MIN_ENTRY_HEADER_SIZE,
};
pub use cubin::{parse_cubin, Cubin, CubinFlavour};
pub use error::{Error, Result};
pub use index::{Fatbin, InputKind};
pub use ptx::{parse_ptx, PtxModule};
pub use raw::{
    container_len, detect_image_kind, elf_image_len, parse_wrapper, FatbinWrapper, ImageKind,
};
pub use select::select_entry;
pub use stream::{decode_in_order, DecodeStats, Decoder, ReadAt, StreamIndex};

/// Where a kernel's layout was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Source {
    /// A cubin's `.nv.info`.
    #[default]
    Elf,
    /// A PTX `.entry` signature.
    Ptx,
}

impl Source {
    /// `"elf"` or `"ptx"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Elf => "elf",
            Source::Ptx => "ptx",
        }
    }
}

/// One kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ParamInfo {
    /// Position in the signature, from 0.
    pub ordinal: u32,
    /// Byte offset in the parameter buffer.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

impl ParamInfo {
    /// The offsets, within this parameter, of its 8-byte words that lie 8-byte aligned in
    /// the parameter buffer: where a pointer can be, inside a struct too.
    pub fn aligned_words(&self) -> impl Iterator<Item = usize> {
        let (off, size) = (self.offset as usize, self.size as usize);
        ((8 - off % 8) % 8..size.saturating_sub(7)).step_by(8)
    }

    /// Calls `f(offset, value)` for each of [`ParamInfo::aligned_words`] whose value (read
    /// little-endian from `bytes`, this parameter's bytes) lies in `lo..hi`, in order. A
    /// launch's words are mostly not pointers (sizes, strides, a multi-tensor kernel's
    /// tables): they are tested eight at a time without a branch, so a parameter of
    /// hundreds of words costs a few nanoseconds per eight.
    pub fn words_in_range(&self, bytes: &[u8], lo: u64, hi: u64, mut f: impl FnMut(usize, u64)) {
        let width = hi.wrapping_sub(lo);
        if hi <= lo {
            return;
        }
        let start = (8 - self.offset as usize % 8) % 8;
        let Some(body) = bytes.get(start..) else {
            return;
        };
        let word = |w: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            u64::from_le_bytes(a)
        };
        // The words of `chunk` (at offset `at`) in range, one by one.
        let mut each = |at: usize, chunk: &[u8]| {
            for (j, w) in chunk.chunks_exact(8).enumerate() {
                let v = word(w);
                if v.wrapping_sub(lo) < width {
                    f(at + j * 8, v);
                }
            }
        };
        let mut blocks = body.chunks_exact(64);
        let mut at = start;
        for block in blocks.by_ref() {
            let any = block
                .chunks_exact(8)
                .fold(false, |any, w| any | (word(w).wrapping_sub(lo) < width));
            if any {
                each(at, block);
            }
            at += 64;
        }
        each(at, blocks.remainder());
    }
}

/// A kernel and its parameter layout. Field names are stable: the shim, simgpu and the driver
/// shim use them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelInfo {
    /// The mangled name (as in `__cudaRegisterFunction` and `cuModuleGetFunction`).
    pub name: String,
    /// Parameters in ordinal order.
    pub params: Vec<ParamInfo>,
    /// Total parameter bytes (`EIATTR_CBANK_PARAM_SIZE`; for PTX the end of the last
    /// parameter). 0 for a kernel without parameters.
    pub param_bytes: u32,
    /// SM of the image the layout was read from: the cubin's SM, or the PTX's target
    /// (`compute_XX`); `None` when not known.
    pub sm: Option<u32>,
    /// Cubin or PTX.
    pub source: Source,
    /// Registers per thread (cubin `.text.<kernel>` `sh_info >> 24`, else `EIATTR_REGCOUNT`).
    pub registers: Option<u32>,
    /// `__launch_bounds__` / `.maxntid` (x, y, z).
    pub max_threads: Option<[u32; 3]>,
    /// `.reqntid` (x, y, z).
    pub reqntid: Option<[u32; 3]>,
    /// `EIATTR_MAXREG_COUNT`.
    pub max_registers: Option<u32>,
    /// Per-thread stack frame bytes (`EIATTR_FRAME_SIZE`).
    pub frame_size: Option<u32>,
    /// Static shared memory bytes (`.nv.shared.<kernel>` size).
    pub shared_bytes: Option<u64>,
    /// Offset of the parameters in constant bank 0 (`EIATTR_PARAM_CBANK`; 0x210 on sm_90).
    pub param_cbank_offset: Option<u32>,
}

impl KernelInfo {
    /// A layout of just these parameters, each `(ordinal, offset, size)` (what a launch
    /// reads; the rest default): for tests and tools that build layouts by hand.
    pub fn with_params(params: &[(u32, u32, u32)]) -> KernelInfo {
        KernelInfo {
            params: params
                .iter()
                .map(|&(ordinal, offset, size)| ParamInfo {
                    ordinal,
                    offset,
                    size,
                })
                .collect(),
            ..Default::default()
        }
    }
}
