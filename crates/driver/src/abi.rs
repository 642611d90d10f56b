//! The C signatures of the CUDA runtime's and driver's functions, generated from the CUDA
//! headers ([`runtime`], [`driver`]: `scripts/gen-signatures.py`, committed, checked by a
//! test that regenerates them), and the compile-time check of a signature written in Rust
//! against them ([`check_signature!`](crate::check_signature)): every typed call of a real CUDA function in cudaw
//! (`call_real!`, `forward!`, the driver loader's table, the wrappers' own signatures)
//! names the function and the Rust type it calls it with; a type whose ABI differs from
//! the header's — a missing or extra argument, a `u64` for an `int`, a pointer for a
//! struct passed by value — stops the build.
//!
//! The comparison is by ABI class ([`Class`]), what the calling convention sees, not by
//! Rust type: a C enum may be written `i32` or `u32` (or cudarc's enum, as an argument),
//! a handle any pointer. Return values stay raw integers in cudaw (`cudaError_t` is a
//! `u32`): an unknown value in a Rust enum would be undefined behaviour.
#![forbid(unsafe_code)]

// Generated, one line per function: left as the generator writes them.
#[rustfmt::skip]
pub mod driver;
#[rustfmt::skip]
pub mod runtime;

/// How one argument or return value travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// No value (a `void` return).
    Void,
    /// An integer or enum of 1, 2, 4 or 8 bytes.
    I1,
    /// See [`Class::I1`].
    I2,
    /// See [`Class::I1`].
    I4,
    /// See [`Class::I1`].
    I8,
    /// A `float`.
    F4,
    /// A `double`.
    F8,
    /// Any pointer, handle or function pointer.
    Ptr,
    /// A struct by value: its size and alignment.
    S(usize, usize),
}

/// A Rust type's [`Class`] when passed to or returned from C.
pub trait Abi {
    /// The class.
    const CLASS: Class;
}

macro_rules! classes {
    ($($class:ident: $($t:ty),+;)+) => { $($(impl Abi for $t { const CLASS: Class = Class::$class; })+)+ };
}
classes! {
    Void: ();
    I1: i8, u8, bool;
    I2: i16, u16;
    I4: i32, u32;
    I8: i64, u64, isize, usize;
    F4: f32;
    F8: f64;
}

impl<T: ?Sized> Abi for *mut T {
    const CLASS: Class = Class::Ptr;
}
impl<T: ?Sized> Abi for *const T {
    const CLASS: Class = Class::Ptr;
}
impl<T: ?Sized> Abi for &T {
    const CLASS: Class = Class::Ptr;
}
impl<T: ?Sized> Abi for &mut T {
    const CLASS: Class = Class::Ptr;
}

/// Implements [`Abi`] for `repr(C)` structs passed by value ([`Class::S`]):
/// `driver::abi_struct!(Dim3, cudaExtent)`.
#[macro_export]
macro_rules! abi_struct {
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::abi::Abi for $t {
            const CLASS: $crate::abi::Class =
                $crate::abi::Class::S(::std::mem::size_of::<$t>(), ::std::mem::align_of::<$t>());
        }
    )+};
}

/// Implements [`Abi`] for C enums (4 bytes, [`Class::I4`]): `driver::abi_enum!(sys::CUdevice_attribute)`.
#[macro_export]
macro_rules! abi_enum {
    ($($t:ty),+ $(,)?) => {$(
        const _: () = assert!(::std::mem::size_of::<$t>() == 4);
        impl $crate::abi::Abi for $t {
            const CLASS: $crate::abi::Class = $crate::abi::Class::I4;
        }
    )+};
}

abi_enum!(
    crate::sys::CUdevice_attribute,
    crate::sys::CUmemAllocationGranularity_flags,
);

/// A function pointer type's classes, return value first.
pub trait Signature {
    /// The classes.
    const CLASSES: &'static [Class];
}

macro_rules! signatures {
    ($(($($a:ident),*))+) => {$(
        impl<R: Abi, $($a: Abi),*> Signature for unsafe extern "C" fn($($a),*) -> R {
            const CLASSES: &'static [Class] = &[R::CLASS, $($a::CLASS),*];
        }
        impl<R: Abi, $($a: Abi),*> Signature for extern "C" fn($($a),*) -> R {
            const CLASSES: &'static [Class] = &[R::CLASS, $($a::CLASS),*];
        }
        impl<R: Abi, $($a: Abi),*> Abi for unsafe extern "C" fn($($a),*) -> R {
            const CLASS: Class = Class::Ptr;
        }
        impl<R: Abi, $($a: Abi),*> Abi for Option<unsafe extern "C" fn($($a),*) -> R> {
            const CLASS: Class = Class::Ptr;
        }
        impl<R: Abi, $($a: Abi),*> Abi for extern "C" fn($($a),*) -> R {
            const CLASS: Class = Class::Ptr;
        }
        impl<R: Abi, $($a: Abi),*> Abi for Option<extern "C" fn($($a),*) -> R> {
            const CLASS: Class = Class::Ptr;
        }
    )+};
}
signatures! {
    ()
    (A)
    (A, B)
    (A, B, C)
    (A, B, C, D)
    (A, B, C, D, E)
    (A, B, C, D, E, F)
    (A, B, C, D, E, F, G)
    (A, B, C, D, E, F, G, H)
    (A, B, C, D, E, F, G, H, I)
    (A, B, C, D, E, F, G, H, I, J)
    (A, B, C, D, E, F, G, H, I, J, K)
    (A, B, C, D, E, F, G, H, I, J, K, L)
}

/// Whether two signatures have the same classes (a `const fn`, for [`check_signature!`](crate::check_signature)).
pub const fn same(a: &[Class], b: &[Class]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        use Class::*;
        let equal = match (a[i], b[i]) {
            (S(s, t), S(u, v)) => s == u && t == v,
            // A pointer and an 8-byte integer travel alike (LP64: x86-64, aarch64): a
            // handle may be written `usize`, a `CUdeviceptr` a pointer.
            (I8 | Ptr, I8 | Ptr) => true,
            (x, y) => matches!(
                (x, y),
                (Void, Void) | (I1, I1) | (I2, I2) | (I4, I4) | (F4, F4) | (F8, F8)
            ),
        };
        if !equal {
            return false;
        }
        i += 1;
    }
    true
}

/// Stops the build unless the function type `$f` calls `$header::$name` as the CUDA
/// headers declare it: `driver::check_signature!(runtime, cudaMalloc, unsafe extern "C"
/// fn(*mut *mut c_void, usize) -> u32)`. A name the headers do not declare is an error
/// too (no `abi::runtime::NAME`).
#[macro_export]
macro_rules! check_signature {
    ($header:ident, $name:ident, $f:ty) => {
        const _: () = assert!(
            $crate::abi::same(
                $crate::abi::$header::$name,
                <$f as $crate::abi::Signature>::CLASSES
            ),
            concat!(
                "the signature written for ",
                stringify!($name),
                " differs from the CUDA header's (crates/driver/src/abi/",
                stringify!($header),
                ".rs)"
            )
        );
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;

    #[repr(C)]
    struct Dim3 {
        x: u32,
        y: u32,
        z: u32,
    }
    abi_struct!(Dim3);

    check_signature!(
        runtime,
        cudaMalloc,
        unsafe extern "C" fn(*mut *mut c_void, usize) -> u32
    );
    check_signature!(
        driver,
        cuMemAlloc_v2,
        unsafe extern "C" fn(*mut u64, usize) -> u32
    );
    check_signature!(
        runtime,
        cudaLaunchKernel,
        unsafe extern "C" fn(
            *const c_void,
            Dim3,
            Dim3,
            *mut *mut c_void,
            usize,
            *mut c_void,
        ) -> u32
    );

    #[test]
    fn a_wrong_signature_differs() {
        let written = <unsafe extern "C" fn(*mut *mut c_void, u32) -> u32>::CLASSES;
        assert!(!same(runtime::cudaMalloc, written));
        let short = <unsafe extern "C" fn(*mut *mut c_void) -> u32>::CLASSES;
        assert!(!same(runtime::cudaMalloc, short));
        assert!(!same(&[Class::S(12, 4)], &[Class::S(16, 4)]));
        assert!(same(&[Class::S(12, 4)], &[Class::S(12, 4)]));
    }

    /// The committed signatures are what `scripts/gen-signatures.py` makes of the headers
    /// today (skipped without them: `scripts/setup-cuda.sh`).
    #[test]
    fn signatures_match_the_headers() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if !root.join("target/cuda/include/cuda_runtime_api.h").exists() {
            assert!(
                std::env::var_os("CUDAW_REQUIRE_CUDA_TOOLS").is_none(),
                "no CUDA headers (run scripts/setup-cuda.sh)"
            );
            eprintln!("skipped: no CUDA headers (run scripts/setup-cuda.sh)");
            return;
        }
        let out = std::process::Command::new("python3")
            .arg(root.join("scripts/gen-signatures.py"))
            .arg("--check")
            .output()
            .expect("run scripts/gen-signatures.py");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
