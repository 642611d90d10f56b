//! What the program registered: fatbins, host stubs → kernel names, kernel handles → host
//! stubs. Layouts are parsed from the registered fatbin lazily, on a kernel's first
//! translated launch, and cached.
//!
//! A launch looks its kernel up here (translated addressing, tracing), so the lookup takes
//! no lock and touches no shared counter: kernel records are never freed (a record outlives
//! its fatbin's unregistration, a few hundred bytes each, so a reference handed out stays
//! valid), and each thread keeps a cache of the records it launched, emptied when a fatbin
//! is unregistered (the registry's generation moves on).

use fatbin::{Fatbin, KernelInfo};
use parking_lot::RwLock;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// One registered fatbin.
pub struct FatbinRecord {
    /// The registration handle the real runtime returned (`void**`).
    pub handle: usize,
    /// The fatbin container bytes, borrowed from the program's image for its lifetime.
    pub data: Option<&'static [u8]>,
    parsed: OnceLock<Option<Fatbin<'static>>>,
}

impl FatbinRecord {
    fn fatbin(&self) -> Option<&Fatbin<'static>> {
        self.parsed
            .get_or_init(|| {
                let data = self.data?;
                match Fatbin::parse(data) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        crate::log::warn(format_args!("registered fatbin unreadable: {e}"));
                        None
                    }
                }
            })
            .as_ref()
    }
}

/// One registered kernel.
pub struct FunctionRecord {
    /// The host stub's address.
    pub host_fun: usize,
    /// The (mangled) device name.
    pub name: String,
    /// The fatbin it came from.
    pub fatbin: Arc<FatbinRecord>,
    layout: OnceLock<Option<Arc<KernelInfo>>>,
    /// Its number in the tracer (the host's tracer), given on its first traced launch.
    pub trace_id: OnceLock<u32>,
    /// Where its traced launches were seen to pass pointers (the host's tracer).
    pub sites: parking_lot::Mutex<fatbin::sites::PointerSites>,
}

impl FunctionRecord {
    /// The kernel's parameter layout on `sm` (parsed once).
    pub fn layout(&self, sm: u32) -> Option<&KernelInfo> {
        self.layout
            .get_or_init(|| {
                let f = self.fatbin.fatbin()?;
                match f.kernel(&self.name, sm) {
                    Ok(Some(k)) => Some(k),
                    Ok(None) => {
                        crate::log::warn(format_args!(
                            "no layout for kernel {} on sm_{sm}",
                            self.name
                        ));
                        None
                    }
                    Err(e) => {
                        crate::log::warn(format_args!("layout of {}: {e}", self.name));
                        None
                    }
                }
            })
            .as_deref()
    }
}

#[derive(Default)]
struct Registry {
    fatbins: HashMap<usize, Arc<FatbinRecord>>,
    functions: HashMap<usize, &'static FunctionRecord>,
    kernels: HashMap<usize, usize>,
    /// Per fatbin handle, the host stubs registered in it: unregistering a fatbin touches
    /// its own kernels only (PyTorch unregisters ~450 fatbins of ~21000 kernels at exit).
    stubs: HashMap<usize, Vec<&'static FunctionRecord>>,
    /// Mangled name → the registered kernels of that name, oldest first (the latest is the
    /// answer: kernels of one mangled name share their parameters), for cudaw's driver
    /// layer, which knows kernels by name. All are kept, so that when the latest one's
    /// fatbin is unregistered the name goes to one that stays (most names have one).
    by_name: HashMap<&'static str, smallvec::SmallVec<[&'static FunctionRecord; 1]>>,
}

/// Bumped whenever a lookup's answer may change for the worse (a fatbin unregistered, a
/// host stub registered again): every thread's cache is stale.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The caches' maps: host stubs and kernel handles are addresses.
type AddressMap<V> = vmm::KeyMap<usize, V>;

/// One thread's answers so far: host stub (or kernel handle) → record.
#[derive(Default)]
struct Cache {
    generation: u64,
    functions: AddressMap<&'static FunctionRecord>,
    kernels: AddressMap<&'static FunctionRecord>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// `lookup` through the calling thread's cache (`kernels` picks its map); the registry's
/// lock is taken on a miss only. Misses are not remembered (a stub registered later
/// must be found then).
fn cached(
    key: usize,
    kernels: bool,
    lookup: impl Fn(&Registry) -> Option<&'static FunctionRecord>,
) -> Option<&'static FunctionRecord> {
    let generation = GENERATION.load(Ordering::Acquire);
    let hit = CACHE.try_with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        if c.generation != generation {
            c.functions.clear();
            c.kernels.clear();
            c.generation = generation;
        }
        let map = if kernels {
            &mut c.kernels
        } else {
            &mut c.functions
        };
        if let Some(rec) = map.get(&key) {
            return Some(*rec);
        }
        let rec = lookup(&registry().read())?;
        map.insert(key, rec);
        Some(rec)
    });
    match hit {
        Ok(Some(rec)) => Some(rec),
        _ => lookup(&registry().read()),
    }
}

static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
/// Registrations over the process's life (unregistration at exit does not lower them).
static FATBINS_EVER: AtomicUsize = AtomicUsize::new(0);
static FUNCTIONS_EVER: AtomicUsize = AtomicUsize::new(0);

fn registry() -> &'static RwLock<Registry> {
    REGISTRY.get_or_init(Default::default)
}

/// The container bytes of a registration wrapper, reading only what its headers declare.
///
/// # Safety
/// `wrapper` is null or points to a `__fatBinC_Wrapper_t` and the container it names,
/// both alive for the rest of the process (they are in the program's image).
pub unsafe fn fatbin_bytes(wrapper: *const std::ffi::c_void) -> Option<&'static [u8]> {
    if wrapper.is_null() {
        return None;
    }
    // SAFETY: a wrapper is 24 bytes (caller's contract).
    let w = unsafe { std::slice::from_raw_parts(wrapper as *const u8, 24) };
    let info = fatbin::parse_wrapper(w).ok()?;
    let container = info.container as *const u8;
    if container.is_null() {
        return None;
    }
    // SAFETY: the wrapper names a container, whose 16-byte header is readable.
    let head = unsafe { std::slice::from_raw_parts(container, 16) };
    let len = fatbin::container_len(head).ok()?;
    let len = usize::try_from(len).ok()?;
    // SAFETY: the container's header declares `len` bytes, all part of the program image.
    Some(unsafe { std::slice::from_raw_parts(container, len) })
}

/// Records a fatbin registration.
pub fn add_fatbin(handle: usize, data: Option<&'static [u8]>) {
    let rec = Arc::new(FatbinRecord {
        handle,
        data,
        parsed: OnceLock::new(),
    });
    registry().write().fatbins.insert(handle, rec);
    FATBINS_EVER.fetch_add(1, Ordering::Relaxed);
}

/// Forgets a fatbin and its kernels (their records stay allocated: a launch on another
/// thread may hold one).
pub fn remove_fatbin(handle: usize) {
    let mut r = registry().write();
    GENERATION.fetch_add(1, Ordering::AcqRel);
    r.fatbins.remove(&handle);
    for rec in r.stubs.remove(&handle).unwrap_or_default() {
        if r.functions
            .get(&rec.host_fun)
            .is_some_and(|f| std::ptr::eq(*f, rec))
        {
            r.functions.remove(&rec.host_fun);
        }
        if let Some(named) = r.by_name.get_mut(rec.name.as_str()) {
            named.retain(|f| !std::ptr::eq(*f, rec));
            if named.is_empty() {
                r.by_name.remove(rec.name.as_str());
            }
        }
    }
    let Registry {
        functions, kernels, ..
    } = &mut *r;
    kernels.retain(|_, h| functions.contains_key(h));
}

/// Records `host_fun` → `name` in fatbin `handle`.
pub fn add_function(handle: usize, host_fun: usize, name: String) {
    let mut r = registry().write();
    let fatbin = match r.fatbins.get(&handle) {
        Some(f) => f.clone(),
        None => Arc::new(FatbinRecord {
            handle,
            data: None,
            parsed: OnceLock::new(),
        }),
    };
    FUNCTIONS_EVER.fetch_add(1, Ordering::Relaxed);
    let rec: &'static FunctionRecord = Box::leak(Box::new(FunctionRecord {
        host_fun,
        name,
        fatbin,
        layout: OnceLock::new(),
        trace_id: OnceLock::new(),
        sites: parking_lot::Mutex::new(fatbin::sites::PointerSites::new()),
    }));
    if r.functions.insert(host_fun, rec).is_some() {
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    r.by_name.entry(rec.name.as_str()).or_default().push(rec);
    r.stubs.entry(handle).or_default().push(rec);
}

/// Records a `cudaKernel_t` handed out for `host_fun`.
pub fn add_kernel_handle(kernel: usize, host_fun: usize) {
    let mut r = registry().write();
    if r.kernels
        .insert(kernel, host_fun)
        .is_some_and(|old| old != host_fun)
    {
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The kernel registered for host stub `host_fun`.
pub fn function(host_fun: usize) -> Option<&'static FunctionRecord> {
    cached(host_fun, false, |r| r.functions.get(&host_fun).copied())
}

/// The kernel behind a `cudaKernel_t` from `__cudaGetKernel`.
pub fn function_of_kernel(kernel: usize) -> Option<&'static FunctionRecord> {
    cached(kernel, true, |r| {
        r.functions.get(r.kernels.get(&kernel)?).copied()
    })
}

/// A registered kernel of mangled name `name`, the latest registered of those that are
/// still (one lookup under the registry's read lock).
pub fn function_named(name: &str) -> Option<&'static FunctionRecord> {
    registry()
        .read()
        .by_name
        .get(name)
        .and_then(|named| named.last().copied())
}

/// How many fatbins and kernels are registered now.
pub fn counts() -> (usize, usize) {
    let r = registry().read();
    (r.fatbins.len(), r.functions.len())
}

/// How many fatbins and kernels were ever registered.
pub fn counts_ever() -> (usize, usize) {
    (
        FATBINS_EVER.load(Ordering::Relaxed),
        FUNCTIONS_EVER.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unregistering_a_fatbin_forgets_its_kernels_only() {
        // Addresses of this test's own (the registry is the process's).
        let (f1, f2) = (0xfee1_0000, 0xfee2_0000);
        add_fatbin(f1, None);
        add_fatbin(f2, None);
        add_function(f1, f1 + 1, "a".into());
        add_function(f1, f1 + 2, "b".into());
        add_function(f2, f2 + 1, "c".into());
        // A stub registered again in the second fatbin belongs to it now.
        add_function(f2, f1 + 2, "b2".into());
        add_kernel_handle(f1 + 0x100, f1 + 1);
        add_kernel_handle(f2 + 0x100, f2 + 1);
        assert_eq!(
            function_of_kernel(f1 + 0x100).map(|r| r.name.as_str()),
            Some("a")
        );
        assert_eq!(function_named("a").map(|r| r.host_fun), Some(f1 + 1));
        assert_eq!(function_named("b2").map(|r| r.host_fun), Some(f1 + 2));
        remove_fatbin(f1);
        // By name: the unregistered fatbin's kernels are gone, the other's stay.
        assert!(function_named("a").is_none() && function_named("b").is_none());
        assert_eq!(function_named("c").map(|r| r.host_fun), Some(f2 + 1));
        assert_eq!(function_named("b2").map(|r| r.host_fun), Some(f1 + 2));
        assert!(function(f1 + 1).is_none());
        assert!(function_of_kernel(f1 + 0x100).is_none());
        assert_eq!(function(f1 + 2).map(|r| r.name.as_str()), Some("b2"));
        assert_eq!(function(f2 + 1).map(|r| r.name.as_str()), Some("c"));
        assert_eq!(
            function_of_kernel(f2 + 0x100).map(|r| r.name.as_str()),
            Some("c")
        );
        remove_fatbin(f2);
        assert!(function(f1 + 2).is_none() && function(f2 + 1).is_none());
        assert!(function_named("b2").is_none() && function_named("c").is_none());
    }

    #[test]
    fn a_name_goes_to_a_twin_that_stays_when_the_latest_is_unregistered() {
        // Two fatbins registering a kernel of the same mangled name (a library loaded
        // twice), then a third; the registry is the process's: names of this test's own.
        let (f1, f2, f3) = (0xfab1_0000, 0xfab2_0000, 0xfab3_0000);
        for f in [f1, f2, f3] {
            add_fatbin(f, None);
        }
        add_function(f1, f1 + 1, "twin_kernel".into());
        add_function(f2, f2 + 1, "twin_kernel".into());
        add_function(f3, f3 + 1, "twin_kernel".into());
        let named = || function_named("twin_kernel").map(|r| r.host_fun);
        assert_eq!(named(), Some(f3 + 1), "the latest registered answers");
        // The latest unregistered: the name goes to the latest of those that stay.
        remove_fatbin(f3);
        assert_eq!(named(), Some(f2 + 1));
        // An older one unregistered: the answer stays.
        remove_fatbin(f1);
        assert_eq!(named(), Some(f2 + 1));
        remove_fatbin(f2);
        assert_eq!(named(), None);
    }
}
