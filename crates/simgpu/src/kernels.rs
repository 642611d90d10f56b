//! Kernels as host functions, looked up by mangled kernel name.
//!
//! Each entry stands for one `__global__` function of the test programs
//! (`tests/cuda/programs/*.cu`). A launch first *prepares* the kernel: it reads every
//! argument from the launch's `void** args` with the C type the kernel declares (the
//! argument storage belongs to the caller and is gone once the launch returns), and
//! returns [`Work`]: the device memory the grid will touch and a closure computing exactly
//! what the CUDA kernel computes over the whole grid. The stream worker checks the memory
//! (a fault is the kernel's, reported like a GPU's: a sticky error) and runs the closure.
//!
//! Device pointers are host addresses in simgpu, so the closures read and write them
//! directly, element by element through raw pointers (kernels may alias, as on a GPU).

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;

use crate::memory::{Accessor, Memory};
use crate::runtime::{Dim3, RtError};

/// A launch's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads in a block.
    pub block: Dim3,
    /// Dynamic shared memory in bytes.
    pub shared_mem: usize,
}

impl Launch {
    /// A one-dimensional launch.
    pub fn linear(blocks: u32, threads: u32) -> Launch {
        Launch {
            grid: Dim3::x(blocks),
            block: Dim3::x(threads),
            shared_mem: 0,
        }
    }

    /// Calls `f(i)` for every thread's `i = blockIdx.x * blockDim.x + threadIdx.x` (in
    /// `int` arithmetic, as the kernels compute it) that satisfies `0 <= i < n`, once per
    /// thread: threads differing only in y or z repeat an index, as they do on a GPU.
    fn each_index(&self, n: i32, mut f: impl FnMut(usize)) {
        let (g, b) = (self.grid, self.block);
        for _ in 0..u64::from(g.z) * u64::from(g.y) {
            for bx in 0..g.x {
                for _ in 0..u64::from(b.z) * u64::from(b.y) {
                    for tx in 0..b.x {
                        let i = bx.wrapping_mul(b.x).wrapping_add(tx) as i32;
                        if (0..n).contains(&i) {
                            f(i as usize);
                        }
                    }
                }
            }
        }
    }

    /// How many distinct indices `0 <= i < n` [`Launch::each_index`] visits.
    fn covered(&self, n: i32) -> usize {
        let threads = u64::from(self.grid.x) * u64::from(self.block.x);
        (n.max(0) as u64).min(threads) as usize
    }

    /// Whether the grid has a thread with blockIdx and threadIdx zero.
    fn has_threads(&self) -> bool {
        self.grid.count() > 0 && self.block.count() > 0
    }
}

/// A device pointer argument to elements of type `T`.
struct Dev<T> {
    addr: u64,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for Dev<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Dev<T> {}

impl<T: Copy> Dev<T> {
    fn new(addr: u64) -> Self {
        Dev {
            addr,
            _type: PhantomData,
        }
    }

    /// The memory `count` elements from the start occupy.
    fn region(self, count: usize, write: bool) -> Region {
        Region {
            addr: self.addr,
            len: (count * std::mem::size_of::<T>()) as u64,
            write,
            align: std::mem::align_of::<T>() as u64,
        }
    }

    /// Element `i`.
    ///
    /// # Safety
    /// `i` lies in a region checked readable device memory.
    unsafe fn get(self, i: usize) -> T {
        // SAFETY: checked device memory (caller's contract), aligned (checked with it).
        unsafe { (self.addr as *const T).add(i).read() }
    }

    /// Sets element `i`.
    ///
    /// # Safety
    /// `i` lies in a region checked writable device memory.
    unsafe fn set(self, i: usize, value: T) {
        // SAFETY: checked device memory (caller's contract), aligned (checked with it).
        unsafe { (self.addr as *mut T).add(i).write(value) }
    }
}

/// Device memory a launch touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub addr: u64,
    /// Length in bytes (0: touches nothing).
    pub len: u64,
    /// Whether the kernel writes it.
    pub write: bool,
    /// The alignment its elements need.
    pub align: u64,
}

/// A fault a kernel would take on a GPU: what it touched and the error it raises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The kernel's mangled name.
    pub kernel: &'static str,
    /// What went wrong, for people.
    pub what: String,
    /// `cudaErrorIllegalAddress` or `cudaErrorMisalignedAddress` (sticky).
    pub error: RtError,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {}: {} ({})", self.kernel, self.what, self.error)
    }
}

/// A prepared launch: its arguments read, ready to run on a stream.
pub struct Work {
    kernel: &'static str,
    regions: Vec<Region>,
    fault: Option<String>,
    run: Box<dyn FnOnce() + Send>,
}

impl Work {
    fn new(
        kernel: &'static str,
        regions: Vec<Region>,
        run: impl FnOnce() + Send + 'static,
    ) -> Work {
        Work {
            kernel,
            regions,
            fault: None,
            run: Box::new(run),
        }
    }

    fn faulting(kernel: &'static str, what: String) -> Work {
        Work {
            kernel,
            regions: Vec::new(),
            fault: Some(what),
            run: Box::new(|| {}),
        }
    }

    /// The device memory the launch touches.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Checks that every region is device memory the kernel, running on device `device`,
    /// may touch (its own memory, memory it was granted access to, or memory of a device
    /// it has peer access to), aligned for its elements.
    pub fn check(&self, memory: &Memory, device: usize) -> Result<(), Fault> {
        let fault = |what: String, error| Fault {
            kernel: self.kernel,
            what,
            error,
        };
        if let Some(what) = &self.fault {
            return Err(fault(what.clone(), RtError::cudaErrorIllegalAddress));
        }
        for r in self.regions.iter().filter(|r| r.len > 0) {
            if r.addr % r.align != 0 {
                return Err(fault(
                    format!("address {:#x} is not {}-byte aligned", r.addr, r.align),
                    RtError::cudaErrorMisalignedAddress,
                ));
            }
            if memory
                .check_access(r.addr, r.len, r.write, Accessor::Device(device))
                .is_err()
            {
                let what = if r.write { "a write" } else { "a read" };
                let right = if r.write { "writable" } else { "readable" };
                let text = match memory.device_of(r.addr) {
                    Some(owner) if owner != device => format!(
                        "{what} of {} bytes at {:#x} on device {device} reaches device \
                         {owner}'s memory without access (peer access not enabled, or no \
                         access granted to device {device} with cuMemSetAccess)",
                        r.len, r.addr
                    ),
                    _ => format!(
                        "{what} of {} bytes at {:#x} is outside {right} device memory",
                        r.len, r.addr
                    ),
                };
                return Err(fault(text, RtError::cudaErrorIllegalAddress));
            }
        }
        Ok(())
    }

    /// Runs the kernel over its grid.
    ///
    /// # Safety
    /// [`Work::check`] passed, and the memory stays mapped while it runs.
    pub unsafe fn run(self) {
        (self.run)()
    }
}

/// Reads argument `i` with C type `T`.
///
/// # Safety
/// `args` holds at least `i + 1` pointers and the `i`-th points at a `T`.
unsafe fn arg<T: Copy>(args: *const *const c_void, i: usize) -> T {
    // SAFETY: the launch passes one pointer per kernel parameter (caller's contract);
    // the argument storage need not be aligned for `T`.
    unsafe { (*args.add(i)).cast::<T>().read_unaligned() }
}

/// Reads a field of type `T` at byte `offset` of argument `i` (a struct passed by value).
///
/// # Safety
/// As [`arg`], for a struct with a `T` at `offset`.
unsafe fn field<T: Copy>(args: *const *const c_void, i: usize, offset: usize) -> T {
    // SAFETY: the struct argument holds a `T` at `offset` (caller's contract).
    unsafe {
        (*args.add(i))
            .cast::<u8>()
            .add(offset)
            .cast::<T>()
            .read_unaligned()
    }
}

/// Reads a kernel's arguments and returns its work.
///
/// # Safety
/// `args` holds one valid pointer per parameter of the kernel, each to a value of the
/// parameter's C type.
type Prepare = unsafe fn(&'static str, &Launch, *const *const c_void) -> Work;

/// A kernel simgpu can run.
pub struct Kernel {
    /// The mangled name the program registers.
    pub name: &'static str,
    /// The CUDA declaration it implements.
    pub declaration: &'static str,
    prepare: Prepare,
}

impl Kernel {
    /// Reads the launch's arguments and returns the work to run on a stream.
    ///
    /// # Safety
    /// `args` holds one valid pointer per parameter of the kernel, each to a value of the
    /// type [`Kernel::declaration`] gives it.
    pub unsafe fn prepare(&self, launch: &Launch, args: *const *const c_void) -> Work {
        // SAFETY: forwarded from the caller.
        unsafe { (self.prepare)(self.name, launch, args) }
    }
}

/// Every kernel simgpu knows, by mangled name.
pub static KERNELS: &[Kernel] = &[
    Kernel {
        name: "_Z5emptyv",
        declaration: "empty() (launch_loop's benchmark kernel)",
        prepare: empty,
    },
    Kernel {
        name: "_Z4spinj",
        declaration: "spin(unsigned ms) (mem_shell: a kernel that runs ms milliseconds)",
        prepare: spin,
    },
    Kernel {
        name: "_Z10vector_addPKfS0_Pfi",
        declaration: "vector_add(const float* a, const float* b, float* c, int n)",
        prepare: vector_add,
    },
    Kernel {
        name: "_Z9block_sumPKiPxi",
        declaration: "block_sum(const int* in, long long* partial, int n)",
        prepare: block_sum,
    },
    Kernel {
        name: "_Z9final_sumPKxPxi",
        declaration: "final_sum(const long long* partial, long long* out, int n)",
        prepare: final_sum,
    },
    Kernel {
        name: "_Z5scalePfif",
        declaration: "scale(float* v, int n, float k)",
        prepare: scale,
    },
    Kernel {
        name: "_Z12saxpy_struct5Saxpy",
        declaration: "saxpy_struct(Saxpy p) with struct Saxpy { const float* x; float* y; int n; float alpha; double* total; }",
        prepare: saxpy_struct,
    },
    Kernel {
        name: "_Z4fillPiii",
        declaration: "fill(int* v, int n, int base)",
        prepare: fill,
    },
    Kernel {
        name: "_Z8add_intoPKiPii",
        declaration: "add_into(const int* a, int* acc, int n)",
        prepare: add_into,
    },
    Kernel {
        name: "_Z10iota_timesPxii",
        declaration: "iota_times(long long* v, int n, int k)",
        prepare: iota_times,
    },
    Kernel {
        name: "_Z3mixPjPKjij",
        declaration: "mix(unsigned* x, const unsigned* y, int n, unsigned k)",
        prepare: mix,
    },
];

/// The kernel registered under `name`, if simgpu has a host implementation of it.
pub fn find(name: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name)
}

// The kernels. Each `// CUDA:` line is the body it implements.

/// CUDA: `if (i < n) c[i] = a[i] + b[i];`
unsafe fn vector_add(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (a, b, c, n) = unsafe {
        (
            Dev::<f32>::new(arg(args, 0)),
            Dev::<f32>::new(arg(args, 1)),
            Dev::<f32>::new(arg(args, 2)),
            arg::<i32>(args, 3),
        )
    };
    let m = l.covered(n);
    let l = *l;
    let regions = vec![a.region(m, false), b.region(m, false), c.region(m, true)];
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked regions.
        l.each_index(n, |i| unsafe { c.set(i, a.get(i) + b.get(i)) })
    })
}

/// CUDA: per block, `s[t] = i < n ? in[i] : 0`, then the shared-memory tree
/// `for (stride = blockDim.x / 2; stride > 0; stride >>= 1) if (t < stride) s[t] += s[t + stride];`,
/// then thread 0 writes `partial[blockIdx.x] = s[0]`. `s` holds 256 elements.
unsafe fn block_sum(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    const SHARED: u32 = 256;
    // SAFETY: the parameters as declared (the caller's contract).
    let (input, partial, n) = unsafe {
        (
            Dev::<i32>::new(arg(args, 0)),
            Dev::<i64>::new(arg(args, 1)),
            arg::<i32>(args, 2),
        )
    };
    if l.block.x > SHARED {
        return Work::faulting(
            name,
            format!(
                "blockDim.x = {} overruns its {SHARED}-element shared array",
                l.block.x
            ),
        );
    }
    let l = *l;
    let regions = vec![
        input.region(l.covered(n), false),
        partial.region(l.grid.x as usize, true),
    ];
    Work::new(name, regions, move || {
        let threads = l.block.x as usize;
        let mut s = vec![0i64; threads];
        for bx in 0..l.grid.x {
            for (t, slot) in s.iter_mut().enumerate() {
                let i = bx.wrapping_mul(l.block.x).wrapping_add(t as u32) as i32;
                *slot = if (0..n).contains(&i) {
                    // SAFETY: `0 <= i < n` and `i` is a thread's index: in the checked region.
                    i64::from(unsafe { input.get(i as usize) })
                } else {
                    0
                };
            }
            let mut stride = threads / 2;
            while stride > 0 {
                for t in 0..stride {
                    s[t] = s[t].wrapping_add(s[t + stride]);
                }
                stride >>= 1;
            }
            if threads > 0 {
                // SAFETY: `bx < gridDim.x`: in the checked region.
                unsafe { partial.set(bx as usize, s[0]) };
            }
        }
    })
}

/// CUDA: `if (blockIdx.x == 0 && threadIdx.x == 0) { t = sum of partial[0..n]; *out = t; }`
unsafe fn final_sum(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (partial, out, n) = unsafe {
        (
            Dev::<i64>::new(arg(args, 0)),
            Dev::<i64>::new(arg(args, 1)),
            arg::<i32>(args, 2),
        )
    };
    if !l.has_threads() {
        return Work::new(name, Vec::new(), || {});
    }
    let count = n.max(0) as usize;
    let regions = vec![partial.region(count, false), out.region(1, true)];
    Work::new(name, regions, move || {
        let mut t = 0i64;
        for i in 0..count {
            // SAFETY: `i < n`: in the checked region.
            t = t.wrapping_add(unsafe { partial.get(i) });
        }
        // SAFETY: one element, checked writable.
        unsafe { out.set(0, t) };
    })
}

/// CUDA: `if (i < n) v[i] *= k;`
unsafe fn scale(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (v, n, k) = unsafe {
        (
            Dev::<f32>::new(arg(args, 0)),
            arg::<i32>(args, 1),
            arg::<f32>(args, 2),
        )
    };
    let l = *l;
    let regions = vec![v.region(l.covered(n), true)];
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked region.
        l.each_index(n, |i| unsafe { v.set(i, v.get(i) * k) })
    })
}

/// CUDA: `if (i < p.n) p.y[i] = p.alpha * p.x[i] + p.y[i]; if (i == 0) *p.total = (double)p.n;`
/// with `struct Saxpy { const float* x; float* y; int n; float alpha; double* total; }`
/// (offsets 0, 8, 16, 20, 24). nvcc contracts `a * x + y` into one fused multiply-add,
/// so this does too.
unsafe fn saxpy_struct(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: one struct parameter with the fields at these offsets (the caller's contract).
    let (x, y, n, alpha, total) = unsafe {
        (
            Dev::<f32>::new(field(args, 0, 0)),
            Dev::<f32>::new(field(args, 0, 8)),
            field::<i32>(args, 0, 16),
            field::<f32>(args, 0, 20),
            Dev::<f64>::new(field(args, 0, 24)),
        )
    };
    let l = *l;
    let m = l.covered(n);
    let writes_total = l.has_threads();
    let mut regions = vec![x.region(m, false), y.region(m, true)];
    if writes_total {
        regions.push(total.region(1, true));
    }
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked regions.
        l.each_index(n, |i| unsafe {
            y.set(i, alpha.mul_add(x.get(i), y.get(i)))
        });
        if writes_total {
            // SAFETY: one element, checked writable.
            unsafe { total.set(0, f64::from(n)) };
        }
    })
}

/// CUDA: `if (i < n) v[i] = base + i;`
unsafe fn fill(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (v, n, base) = unsafe {
        (
            Dev::<i32>::new(arg(args, 0)),
            arg::<i32>(args, 1),
            arg::<i32>(args, 2),
        )
    };
    let l = *l;
    let regions = vec![v.region(l.covered(n), true)];
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked region.
        l.each_index(n, |i| unsafe { v.set(i, base.wrapping_add(i as i32)) })
    })
}

/// CUDA: `{}` (tests/cuda/gpu/launch_loop.cu: launches cost, nothing else).
unsafe fn empty(name: &'static str, _l: &Launch, _args: *const *const c_void) -> Work {
    Work::new(name, Vec::new(), || {})
}

/// CUDA: spins on the global timer for `ms` milliseconds; here the stream's worker sleeps
/// as long (the stream, and a device synchronise, wait for it as on a GPU).
unsafe fn spin(name: &'static str, _l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameter as declared (the caller's contract).
    let ms = unsafe { arg::<u32>(args, 0) };
    Work::new(name, Vec::new(), move || {
        std::thread::sleep(std::time::Duration::from_millis(u64::from(ms)))
    })
}

/// CUDA: `if (i < n) acc[i] += a[i];`
unsafe fn add_into(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (a, acc, n) = unsafe {
        (
            Dev::<i32>::new(arg(args, 0)),
            Dev::<i32>::new(arg(args, 1)),
            arg::<i32>(args, 2),
        )
    };
    let l = *l;
    let m = l.covered(n);
    let regions = vec![a.region(m, false), acc.region(m, true)];
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked regions.
        l.each_index(n, |i| unsafe {
            acc.set(i, acc.get(i).wrapping_add(a.get(i)))
        })
    })
}

/// CUDA: `if (i < n) v[i] = (long long)i * k;`
unsafe fn iota_times(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (v, n, k) = unsafe {
        (
            Dev::<i64>::new(arg(args, 0)),
            arg::<i32>(args, 1),
            arg::<i32>(args, 2),
        )
    };
    let l = *l;
    let regions = vec![v.region(l.covered(n), true)];
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked region.
        l.each_index(n, |i| unsafe {
            v.set(i, (i as i64).wrapping_mul(i64::from(k)))
        })
    })
}

/// CUDA: `if (i < n) x[i] = x[i] * 1664525u + y[i] + k;`
unsafe fn mix(name: &'static str, l: &Launch, args: *const *const c_void) -> Work {
    // SAFETY: the parameters as declared (the caller's contract).
    let (x, y, n, k) = unsafe {
        (
            Dev::<u32>::new(arg(args, 0)),
            Dev::<u32>::new(arg(args, 1)),
            arg::<i32>(args, 2),
            arg::<u32>(args, 3),
        )
    };
    let l = *l;
    let m = l.covered(n);
    let regions = vec![x.region(m, true), y.region(m, false)];
    Work::new(name, regions, move || {
        // SAFETY: every index below is in the checked regions.
        l.each_index(n, |i| unsafe {
            x.set(
                i,
                x.get(i)
                    .wrapping_mul(1_664_525)
                    .wrapping_add(y.get(i))
                    .wrapping_add(k),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr<T>(v: &mut [T]) -> u64 {
        v.as_mut_ptr() as u64
    }

    /// Prepares and runs a kernel on host buffers (no memory check: these are not device
    /// memory).
    fn run(name: &str, l: Launch, args: &[*const c_void]) {
        let k = find(name).unwrap();
        // SAFETY: each test passes the kernel's parameters with their declared types.
        let w = unsafe { k.prepare(&l, args.as_ptr()) };
        assert!(w.fault.is_none(), "{:?}", w.fault);
        // SAFETY: the buffers are live host memory of the sizes the regions name.
        unsafe { w.run() }
    }

    fn p<T>(v: &T) -> *const c_void {
        v as *const T as *const c_void
    }

    #[test]
    fn names_are_unique_and_mangled() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert!(k.name.starts_with("_Z"), "{}", k.name);
            assert!(KERNELS[..i].iter().all(|o| o.name != k.name));
        }
        assert!(find("_Z7unknownv").is_none());
    }

    #[test]
    fn vector_add_covers_the_grid_and_stops_at_n() {
        let mut a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut b = vec![0.5f32; 1000];
        let mut c = vec![-1f32; 1000];
        let (pa, pb, pc) = (ptr(&mut a), ptr(&mut b), ptr(&mut c));
        let n = 900i32;
        run(
            "_Z10vector_addPKfS0_Pfi",
            Launch::linear(4, 256),
            &[p(&pa), p(&pb), p(&pc), p(&n)],
        );
        assert_eq!(c[899], 899.5);
        assert_eq!(c[900], -1.0, "i >= n untouched");
        // A grid smaller than n covers only its threads.
        let mut c2 = vec![-1f32; 1000];
        let pc2 = ptr(&mut c2);
        run(
            "_Z10vector_addPKfS0_Pfi",
            Launch::linear(2, 128),
            &[p(&pa), p(&pb), p(&pc2), p(&n)],
        );
        assert_eq!(c2[255], 255.5);
        assert_eq!(c2[256], -1.0);
    }

    #[test]
    fn block_sum_writes_each_blocks_tree_sum() {
        let mut input: Vec<i32> = (0..1000).map(|i| i % 7 - 3).collect();
        let mut partial = vec![0i64; 4];
        let (pi, pp) = (ptr(&mut input), ptr(&mut partial));
        let n = 1000i32;
        run(
            "_Z9block_sumPKiPxi",
            Launch::linear(4, 256),
            &[p(&pi), p(&pp), p(&n)],
        );
        for (b, &got) in partial.iter().enumerate() {
            let want: i64 = input[b * 256..((b + 1) * 256).min(1000)]
                .iter()
                .map(|&v| i64::from(v))
                .sum();
            assert_eq!(got, want, "block {b}");
        }
        // blockDim.x = 6 is not a power of two: the tree drops element 2 (s[2] is never
        // folded into s[0]), exactly as on the GPU.
        let mut partial = vec![0i64; 1];
        let pp = ptr(&mut partial);
        let mut six = vec![1i32, 10, 100, 1000, 10000, 100000];
        let ps = ptr(&mut six);
        let n = 6i32;
        run(
            "_Z9block_sumPKiPxi",
            Launch::linear(1, 6),
            &[p(&ps), p(&pp), p(&n)],
        );
        assert_eq!(partial[0], 1 + 10 + 1000 + 10000);
        // More than 256 threads overrun the shared array: a fault, not a wrong answer.
        let k = find("_Z9block_sumPKiPxi").unwrap();
        // SAFETY: the declared parameters.
        let w = unsafe { k.prepare(&Launch::linear(1, 512), [p(&ps), p(&pp), p(&n)].as_ptr()) };
        assert!(w.fault.is_some());
    }

    #[test]
    fn struct_arguments_are_read_at_their_offsets() {
        let mut x: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let mut y = vec![1f32; 10];
        let mut total = 0f64;
        #[repr(C)]
        struct Saxpy {
            x: u64,
            y: u64,
            n: i32,
            alpha: f32,
            total: u64,
        }
        let s = Saxpy {
            x: ptr(&mut x),
            y: ptr(&mut y),
            n: 10,
            alpha: 2.0,
            total: &mut total as *mut f64 as u64,
        };
        run("_Z12saxpy_struct5Saxpy", Launch::linear(1, 128), &[p(&s)]);
        assert_eq!(y[9], 19.0);
        assert_eq!(total, 10.0);
    }

    #[test]
    fn integer_kernels() {
        let mut v = vec![0i64; 100];
        let pv = ptr(&mut v);
        let (n, k) = (100i32, 3i32);
        run(
            "_Z10iota_timesPxii",
            Launch::linear(1, 128),
            &[p(&pv), p(&n), p(&k)],
        );
        assert_eq!(v[99], 297);
        let mut f = vec![0i32; 100];
        let mut acc = vec![5i32; 100];
        let (pf, pacc) = (ptr(&mut f), ptr(&mut acc));
        let base = 7i32;
        run(
            "_Z4fillPiii",
            Launch::linear(1, 128),
            &[p(&pf), p(&n), p(&base)],
        );
        run(
            "_Z8add_intoPKiPii",
            Launch::linear(1, 128),
            &[p(&pf), p(&pacc), p(&n)],
        );
        assert_eq!(acc[10], 5 + 7 + 10);
        let mut s = vec![2f32; 100];
        let ps = ptr(&mut s);
        let factor = 1.5f32;
        run(
            "_Z5scalePfif",
            Launch::linear(1, 64),
            &[p(&ps), p(&n), p(&factor)],
        );
        assert_eq!((s[63], s[64]), (3.0, 2.0));
        let mut out = 0i64;
        let po = &mut out as *mut i64 as u64;
        let n3 = 3i32;
        run(
            "_Z9final_sumPKxPxi",
            Launch::linear(1, 1),
            &[p(&pv), p(&po), p(&n3)],
        );
        assert_eq!(out, 3 + 6);
        let mut x = vec![2u32; 100];
        let y: Vec<u32> = (0..100).collect();
        let (px, py) = (ptr(&mut x), y.as_ptr() as u64);
        let k = 5u32;
        run(
            "_Z3mixPjPKjij",
            Launch::linear(1, 64),
            &[p(&px), p(&py), p(&n), p(&k)],
        );
        assert_eq!((x[10], x[64]), (2 * 1_664_525 + 10 + 5, 2));
    }
}
