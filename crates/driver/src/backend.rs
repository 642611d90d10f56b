//! [`DriverBackend`]: `vmm::Backend` over any [`Driver`] (the real `libcuda.so.1` or simgpu).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use vmm::backend::{Backend, BackendError};

use crate::api::{
    no_access, pinned_device_prop, read_write_access, Context, Device, Driver, PhysicalHandle,
};
use crate::error::Result;
use crate::sys;

/// Device memory for the VMM from one device's primary context.
///
/// Every operation first makes the primary context current on the calling thread (the
/// VMM calls from any thread; `cuCtxSetCurrent` is cheap). Dropping it releases the
/// primary context.
///
/// Every mapping gives the device read/write access, and its *peers* too: the devices
/// granted access to this device's memory ([`DriverBackend::add_peer`], for peer access
/// the program enabled), which a VMM mapping needs per mapping (`cuCtxEnablePeerAccess`
/// reaches only `cuMemAlloc` memory). The mappings are known here, so a peer added later
/// is granted access on every mapping there is, and every later one.
pub struct DriverBackend {
    driver: Arc<dyn Driver>,
    device: Device,
    context: Context,
    granularity: u64,
    access: Mutex<Access>,
}

/// The mappings made (address → bytes) and the peers granted access to them, under one
/// lock: a peer added while a chunk is being mapped is granted access on it either way.
#[derive(Debug, Default)]
struct Access {
    mappings: BTreeMap<u64, u64>,
    peers: Vec<Device>,
}

impl std::fmt::Debug for DriverBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverBackend")
            .field("device", &self.device)
            .field("context", &self.context)
            .field("granularity", &self.granularity)
            .finish_non_exhaustive()
    }
}

impl DriverBackend {
    /// Initialises the driver, retains device `ordinal`'s primary context, makes it
    /// current here and reads the minimum VMM granularity.
    pub fn new(driver: Arc<dyn Driver>, ordinal: i32) -> Result<Self> {
        driver.init()?;
        let device = driver.device_get(ordinal)?;
        let context = driver.primary_ctx_retain(device)?;
        let granularity = driver
            .ctx_set_current(context)
            .and_then(|()| {
                driver.mem_allocation_granularity(
                    &pinned_device_prop(device),
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            })
            .inspect_err(|_| {
                let _ = driver.primary_ctx_release(device);
            })?;
        Ok(DriverBackend {
            driver,
            device,
            context,
            granularity,
            access: Mutex::new(Access::default()),
        })
    }

    fn access(&self) -> MutexGuard<'_, Access> {
        // A panic while holding it leaves the map as it was between two whole updates.
        self.access.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grants device `peer` read/write access on every mapping of this device's memory,
    /// now and from now on. Idempotent. On failure `peer` is not added; the mappings
    /// granted already keep their access (a later [`DriverBackend::remove_peer`] takes it
    /// away).
    pub fn add_peer(&self, peer: Device) -> Result<()> {
        if peer == self.device {
            return Ok(());
        }
        let mut a = self.access();
        if a.peers.contains(&peer) {
            return Ok(());
        }
        let _ctx = self.scoped()?;
        let desc = [read_write_access(peer)];
        for (&addr, &size) in &a.mappings {
            self.driver.mem_set_access(addr, size, &desc)?;
        }
        a.peers.push(peer);
        Ok(())
    }

    /// Takes device `peer`'s access away from every mapping of this device's memory; later
    /// mappings no longer grant it. Every mapping is tried; the first failure is returned.
    pub fn remove_peer(&self, peer: Device) -> Result<()> {
        let mut a = self.access();
        let Some(i) = a.peers.iter().position(|&p| p == peer) else {
            return Ok(());
        };
        a.peers.remove(i);
        let _ctx = self.scoped()?;
        let desc = [no_access(peer)];
        let mut first = Ok(());
        for (&addr, &size) in &a.mappings {
            if let Err(e) = self.driver.mem_set_access(addr, size, &desc) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// The devices granted access to this device's memory besides itself.
    pub fn peers(&self) -> Vec<Device> {
        self.access().peers.clone()
    }

    /// The mappings made and not unmapped: (address, bytes), by address.
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        self.access()
            .mappings
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect()
    }

    /// The driver underneath.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The primary context it uses.
    pub fn context(&self) -> Context {
        self.context
    }

    /// Makes the primary context current on the calling thread.
    pub fn make_current(&self) -> Result<()> {
        self.driver.ctx_set_current(self.context)
    }

    /// Runs `f` with the primary context current on the calling thread, and the thread's
    /// own context current again afterwards (if it had one the driver could name). Unlike
    /// the [`Backend`] operations, `f` runs even where the current context cannot be read.
    pub fn in_context<T>(&self, f: impl FnOnce() -> T) -> T {
        let mine = self.driver.ctx_get_current().ok();
        let switch = mine != Some(self.context);
        if switch {
            let _ = self.driver.ctx_set_current(self.context);
        }
        let r = f();
        if let (true, Some(mine)) = (switch, mine) {
            let _ = self.driver.ctx_set_current(mine);
        }
        r
    }

    /// Waits for the device's work in its primary context (`cuCtxSynchronize`), leaving
    /// the calling thread's current context as it was.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.scoped()?;
        self.driver.ctx_synchronize()
    }

    /// Makes the primary context current for one operation of the [`Backend`]; the
    /// [`KeptContext`] it returns puts back the context the thread had: a program's own
    /// context (`cuCtxCreate`, a driver-API program allocating through cudaw's driver
    /// layer), or another device's (the runtime takes the thread's device from its current
    /// context: freeing device 0's memory from a thread on device 1 must leave it there).
    /// A thread with none keeps the primary context, as the runtime would bind it.
    fn scoped(&self) -> Result<KeptContext<'_>> {
        let kept = KeptContext::new(&*self.driver)?;
        if kept.prev != self.context {
            self.driver.ctx_set_current(self.context)?;
        }
        Ok(kept)
    }
}

/// The calling thread's current context, kept: when dropped, it is put back if it was a
/// context (not none) and something made another one current meanwhile.
pub struct KeptContext<'a> {
    driver: &'a dyn Driver,
    prev: Context,
}

impl<'a> KeptContext<'a> {
    /// Notes the calling thread's current context.
    pub fn new(driver: &'a dyn Driver) -> Result<Self> {
        Ok(KeptContext {
            driver,
            prev: driver.ctx_get_current()?,
        })
    }
}

impl Drop for KeptContext<'_> {
    fn drop(&mut self) {
        if self.prev != Context::NONE && self.driver.ctx_get_current().ok() != Some(self.prev) {
            let _ = self.driver.ctx_set_current(self.prev);
        }
    }
}

impl Drop for DriverBackend {
    fn drop(&mut self) {
        if let Err(e) = self.driver.primary_ctx_release(self.device) {
            eprintln!("cudaw: releasing the primary context: {e}");
        }
    }
}

impl Backend for DriverBackend {
    type Physical = PhysicalHandle;

    fn granularity(&self) -> Result<u64, BackendError> {
        Ok(self.granularity)
    }

    fn reserve(&self, size: u64, alignment: u64) -> Result<u64, BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.mem_address_reserve(size, alignment, 0)?)
    }

    fn free_reservation(&self, base: u64, size: u64) -> Result<(), BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.mem_address_free(base, size)?)
    }

    fn create_physical(&self, size: u64) -> Result<PhysicalHandle, BackendError> {
        let _ctx = self.scoped()?;
        Ok(self
            .driver
            .mem_create(size, &pinned_device_prop(self.device))?)
    }

    fn release_physical(&self, physical: PhysicalHandle) -> Result<(), BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.mem_release(physical)?)
    }

    fn map(&self, addr: u64, size: u64, physical: PhysicalHandle) -> Result<(), BackendError> {
        let mut a = self.access();
        let _ctx = self.scoped()?;
        self.driver.mem_map(addr, size, physical)?;
        let access: Vec<sys::CUmemAccessDesc> = std::iter::once(self.device)
            .chain(a.peers.iter().copied())
            .map(read_write_access)
            .collect();
        if let Err(e) = self.driver.mem_set_access(addr, size, &access) {
            let _ = self.driver.mem_unmap(addr, size);
            return Err(e.into());
        }
        a.mappings.insert(addr, size);
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut a = self.access();
        let _ctx = self.scoped()?;
        self.driver.mem_unmap(addr, size)?;
        a.mappings.remove(&addr);
        Ok(())
    }

    fn alloc_linear(&self, size: u64) -> Result<u64, BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.mem_alloc(size)?)
    }

    fn free_linear(&self, addr: u64) -> Result<(), BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.mem_free(addr)?)
    }

    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<(), BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.memcpy_dtoh(dst, src)?)
    }

    fn copy_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.memcpy_htod(dst, src)?)
    }

    fn memory_info(&self) -> Result<(u64, u64), BackendError> {
        let _ctx = self.scoped()?;
        Ok(self.driver.mem_get_info()?)
    }
}
