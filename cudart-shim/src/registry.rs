//! What the program registered: fatbins, host stubs → kernel names, kernel handles → host
//! stubs. Layouts are parsed from the registered fatbin lazily, on a kernel's first
//! translated launch, and cached.

use fatbin::{Fatbin, KernelInfo};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Its number in the tracer ([`crate::tracing`]), given on its first traced launch.
    pub trace_id: OnceLock<u32>,
}

impl FunctionRecord {
    /// The kernel's parameter layout on `sm` (parsed once).
    pub fn layout(&self, sm: u32) -> Option<Arc<KernelInfo>> {
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
            .clone()
    }
}

#[derive(Default)]
struct Registry {
    fatbins: HashMap<usize, Arc<FatbinRecord>>,
    functions: HashMap<usize, Arc<FunctionRecord>>,
    kernels: HashMap<usize, usize>,
}

static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
/// Registrations over the process's life (unregistration at exit does not lower them).
static FATBINS_EVER: AtomicUsize = AtomicUsize::new(0);
static FUNCTIONS_EVER: AtomicUsize = AtomicUsize::new(0);

fn registry() -> &'static RwLock<Registry> {
    REGISTRY.get_or_init(Default::default)
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

/// Forgets a fatbin and its kernels.
pub fn remove_fatbin(handle: usize) {
    let mut r = registry().write();
    r.fatbins.remove(&handle);
    r.functions.retain(|_, f| f.fatbin.handle != handle);
    let functions = &r.functions;
    let live: std::collections::HashSet<usize> = functions.keys().copied().collect();
    r.kernels.retain(|_, h| live.contains(h));
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
    r.functions.insert(
        host_fun,
        Arc::new(FunctionRecord {
            host_fun,
            name,
            fatbin,
            layout: OnceLock::new(),
            trace_id: OnceLock::new(),
        }),
    );
}

/// Records a `cudaKernel_t` handed out for `host_fun`.
pub fn add_kernel_handle(kernel: usize, host_fun: usize) {
    registry().write().kernels.insert(kernel, host_fun);
}

/// The kernel registered for host stub `host_fun`.
pub fn function(host_fun: usize) -> Option<Arc<FunctionRecord>> {
    registry().read().functions.get(&host_fun).cloned()
}

/// The kernel behind a `cudaKernel_t` from `__cudaGetKernel`.
pub fn function_of_kernel(kernel: usize) -> Option<Arc<FunctionRecord>> {
    let r = registry().read();
    let host = *r.kernels.get(&kernel)?;
    r.functions.get(&host).cloned()
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
