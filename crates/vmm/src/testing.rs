//! Backends over host memory for tests and benches (no device needed).
//!
//! [`HostBackend`] simulates device memory in `Vec`s and checks the VMM's use of it: no
//! double map, no map outside a reservation, unmap only of mapped ranges, release only of
//! unmapped physical memory. Every violation fails the call and is recorded
//! ([`HostBackend::violations`]). Copies touching unmapped device memory fail with
//! `CUDA_ERROR_ILLEGAL_ADDRESS` (700) and are counted ([`HostBackend::faults`]).
//! [`NullBackend`] does nothing and costs nothing, for timing the VMM itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::{Backend, BackendError};

/// A backend operation, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`Backend::reserve`].
    Reserve,
    /// [`Backend::create_physical`].
    CreatePhysical,
    /// [`Backend::map`].
    Map,
    /// [`Backend::unmap`].
    Unmap,
    /// [`Backend::release_physical`].
    Release,
    /// [`Backend::alloc_linear`].
    AllocLinear,
    /// [`Backend::copy_to_host`].
    CopyToHost,
    /// [`Backend::copy_from_host`].
    CopyFromHost,
}

#[derive(Debug)]
struct Phys {
    data: Vec<u8>,
    mapped_at: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    next_va: u64,
    reservations: BTreeMap<u64, u64>,
    next_handle: u64,
    physical: HashMap<u64, Phys>,
    physical_bytes: u64,
    peak_physical_bytes: u64,
    /// base → (size, handle)
    mappings: BTreeMap<u64, (u64, u64)>,
    next_linear: u64,
    linear: BTreeMap<u64, Vec<u8>>,
    linear_bytes: u64,
    faults: HashMap<Op, u32>,
    violations: Vec<String>,
    faults_seen: u64,
    calls: HashMap<Op, u64>,
}

/// Device memory simulated in host `Vec`s, checking its own invariants.
#[derive(Debug)]
pub struct HostBackend {
    granularity: u64,
    capacity: Option<u64>,
    create_delay: Option<Duration>,
    inner: Mutex<Inner>,
}

fn violation(inner: &mut Inner, msg: String) -> BackendError {
    inner.violations.push(msg.clone());
    BackendError::new(BackendError::INVALID_VALUE, format!("violation: {msg}"))
}

impl HostBackend {
    /// A backend with this granularity and unlimited memory.
    pub fn new(granularity: u64) -> Self {
        Self {
            granularity,
            capacity: None,
            create_delay: None,
            inner: Mutex::new(Inner {
                next_va: 0x7f00_0000_0000,
                next_handle: 1,
                next_linear: 0x5000_0000_0000,
                ..Inner::default()
            }),
        }
    }

    /// The same with a device capacity: physical creation past it fails with
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// The same with every physical creation sleeping first (to widen race windows).
    pub fn with_create_delay(mut self, d: Duration) -> Self {
        self.create_delay = Some(d);
        self
    }

    /// Makes the next `n` calls of `op` fail.
    pub fn fail_next(&self, op: Op, n: u32) {
        self.inner.lock().faults.insert(op, n);
    }

    fn fault(inner: &mut Inner, op: Op) -> Result<(), BackendError> {
        *inner.calls.entry(op).or_default() += 1;
        match inner.faults.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(BackendError::new(
                    999,
                    format!("injected failure of {op:?}"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Invariant violations seen so far.
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().violations.clone()
    }

    /// Copies refused because they touched unmapped device memory (what a kernel touching
    /// evicted memory would fault on). Not a violation by itself: tests provoke it.
    pub fn faults(&self) -> u64 {
        self.inner.lock().faults_seen
    }

    /// Physical allocations alive now.
    pub fn physical_count(&self) -> usize {
        self.inner.lock().physical.len()
    }

    /// Physical bytes alive now.
    pub fn physical_bytes(&self) -> u64 {
        self.inner.lock().physical_bytes
    }

    /// The most physical bytes alive at once.
    pub fn peak_physical_bytes(&self) -> u64 {
        self.inner.lock().peak_physical_bytes
    }

    /// Mappings alive now.
    pub fn mapping_count(&self) -> usize {
        self.inner.lock().mappings.len()
    }

    /// Linear allocations alive now.
    pub fn linear_count(&self) -> usize {
        self.inner.lock().linear.len()
    }

    /// Linear bytes alive now.
    pub fn linear_bytes(&self) -> u64 {
        self.inner.lock().linear_bytes
    }

    /// Reservations alive now.
    pub fn reservation_count(&self) -> usize {
        self.inner.lock().reservations.len()
    }

    /// How many times `op` was called.
    pub fn calls(&self, op: Op) -> u64 {
        self.inner.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Visits the device bytes of `[addr, addr + len)` piece by piece; every byte must be
    /// mapped or inside one linear allocation.
    fn with_device<F>(inner: &mut Inner, addr: u64, len: u64, mut f: F) -> Result<(), BackendError>
    where
        F: FnMut(&mut [u8], usize),
    {
        if len == 0 {
            return Ok(());
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| violation(inner, format!("copy range {addr:#x}+{len} overflows")))?;
        if let Some((&lb, buf)) = inner.linear.range_mut(..=addr).next_back() {
            if addr < lb + buf.len() as u64 {
                if end > lb + buf.len() as u64 {
                    return Err(violation(
                        inner,
                        format!("copy {addr:#x}+{len} runs past linear allocation {lb:#x}"),
                    ));
                }
                let off = (addr - lb) as usize;
                f(&mut buf[off..off + len as usize], 0);
                return Ok(());
            }
        }
        let mut cur = addr;
        while cur < end {
            let hit = inner
                .mappings
                .range(..=cur)
                .next_back()
                .map(|(&b, &(s, h))| (b, s, h));
            match hit {
                Some((b, s, h)) if cur < b + s => {
                    let n = (end.min(b + s) - cur) as usize;
                    let off = (cur - b) as usize;
                    let phys = inner.physical.get_mut(&h).expect("mapped handle exists");
                    f(&mut phys.data[off..off + n], (cur - addr) as usize);
                    cur += n as u64;
                }
                _ => {
                    inner.faults_seen += 1;
                    return Err(BackendError::new(
                        700,
                        format!("CUDA_ERROR_ILLEGAL_ADDRESS: {cur:#x} is not mapped"),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Backend for HostBackend {
    type Physical = u64;

    fn granularity(&self) -> Result<u64, BackendError> {
        Ok(self.granularity)
    }

    fn reserve(&self, size: u64, alignment: u64) -> Result<u64, BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::Reserve)?;
        let align = alignment.max(self.granularity);
        let base = inner.next_va.div_ceil(align) * align;
        inner.next_va = base + size + self.granularity; // a guard gap between reservations
        inner.reservations.insert(base, size);
        Ok(base)
    }

    fn free_reservation(&self, base: u64, size: u64) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        if inner.reservations.get(&base) != Some(&size) {
            return Err(violation(
                &mut inner,
                format!("free of unknown reservation {base:#x}+{size}"),
            ));
        }
        if inner.mappings.range(base..base + size).next().is_some() {
            return Err(violation(
                &mut inner,
                format!("free of reservation {base:#x} with mappings inside"),
            ));
        }
        inner.reservations.remove(&base);
        Ok(())
    }

    fn create_physical(&self, size: u64) -> Result<u64, BackendError> {
        if let Some(d) = self.create_delay {
            std::thread::sleep(d);
        }
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::CreatePhysical)?;
        if size == 0 || size % self.granularity != 0 {
            return Err(violation(
                &mut inner,
                format!(
                    "create_physical({size}) not a multiple of {}",
                    self.granularity
                ),
            ));
        }
        if let Some(cap) = self.capacity {
            if inner.physical_bytes + inner.linear_bytes + size > cap {
                return Err(BackendError::new(
                    BackendError::OUT_OF_MEMORY,
                    "CUDA_ERROR_OUT_OF_MEMORY",
                ));
            }
        }
        let h = inner.next_handle;
        inner.next_handle += 1;
        inner.physical.insert(
            h,
            Phys {
                data: vec![0; size as usize],
                mapped_at: None,
            },
        );
        inner.physical_bytes += size;
        inner.peak_physical_bytes = inner.peak_physical_bytes.max(inner.physical_bytes);
        Ok(h)
    }

    fn release_physical(&self, physical: u64) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::Release)?;
        match inner.physical.get(&physical) {
            None => Err(violation(
                &mut inner,
                format!("release of unknown physical {physical}"),
            )),
            Some(p) if p.mapped_at.is_some() => Err(violation(
                &mut inner,
                format!("release of physical {physical} still mapped"),
            )),
            Some(p) => {
                let n = p.data.len() as u64;
                inner.physical.remove(&physical);
                inner.physical_bytes -= n;
                Ok(())
            }
        }
    }

    fn map(&self, addr: u64, size: u64, physical: u64) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::Map)?;
        let g = self.granularity;
        if addr % g != 0 {
            return Err(violation(
                &mut inner,
                format!("map at {addr:#x} not aligned to {g}"),
            ));
        }
        let in_reservation = inner
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, &s)| addr + size <= b + s);
        if !in_reservation {
            return Err(violation(
                &mut inner,
                format!("map {addr:#x}+{size} outside every reservation"),
            ));
        }
        let overlaps = inner
            .mappings
            .range(..addr + size)
            .next_back()
            .is_some_and(|(&b, &(s, _))| b + s > addr);
        if overlaps {
            return Err(violation(
                &mut inner,
                format!("double map at {addr:#x}+{size}"),
            ));
        }
        match inner
            .physical
            .get(&physical)
            .map(|p| (p.data.len() as u64, p.mapped_at))
        {
            None => {
                return Err(violation(
                    &mut inner,
                    format!("map of unknown physical {physical}"),
                ))
            }
            Some((_, Some(at))) => {
                return Err(violation(
                    &mut inner,
                    format!("physical {physical} mapped twice ({at:#x}, {addr:#x})"),
                ))
            }
            Some((len, None)) if len != size => {
                return Err(violation(
                    &mut inner,
                    format!("map size {size} != physical size {len}"),
                ))
            }
            Some(_) => {}
        }
        inner
            .physical
            .get_mut(&physical)
            .expect("checked")
            .mapped_at = Some(addr);
        inner.mappings.insert(addr, (size, physical));
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::Unmap)?;
        match inner.mappings.get(&addr).copied() {
            Some((s, h)) if s == size => {
                inner.mappings.remove(&addr);
                inner
                    .physical
                    .get_mut(&h)
                    .expect("mapped handle exists")
                    .mapped_at = None;
                Ok(())
            }
            _ => Err(violation(
                &mut inner,
                format!("unmap of {addr:#x}+{size}, which is not a mapping"),
            )),
        }
    }

    fn alloc_linear(&self, size: u64) -> Result<u64, BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::AllocLinear)?;
        if let Some(cap) = self.capacity {
            if inner.physical_bytes + inner.linear_bytes + size > cap {
                return Err(BackendError::new(
                    BackendError::OUT_OF_MEMORY,
                    "CUDA_ERROR_OUT_OF_MEMORY",
                ));
            }
        }
        let addr = inner.next_linear;
        inner.next_linear += size.div_ceil(512) * 512 + 512;
        inner.linear.insert(addr, vec![0; size as usize]);
        inner.linear_bytes += size;
        inner.peak_physical_bytes = inner
            .peak_physical_bytes
            .max(inner.physical_bytes + inner.linear_bytes);
        Ok(addr)
    }

    fn free_linear(&self, addr: u64) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        match inner.linear.remove(&addr) {
            Some(v) => {
                inner.linear_bytes -= v.len() as u64;
                Ok(())
            }
            None => Err(violation(
                &mut inner,
                format!("free_linear of unknown {addr:#x}"),
            )),
        }
    }

    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::CopyToHost)?;
        Self::with_device(&mut inner, src, dst.len() as u64, |dev, off| {
            dst[off..off + dev.len()].copy_from_slice(dev);
        })
    }

    fn copy_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        let mut inner = self.inner.lock();
        Self::fault(&mut inner, Op::CopyFromHost)?;
        Self::with_device(&mut inner, dst, src.len() as u64, |dev, off| {
            let n = dev.len();
            dev.copy_from_slice(&src[off..off + n]);
        })
    }

    fn memory_info(&self) -> Result<(u64, u64), BackendError> {
        let inner = self.inner.lock();
        let total = self.capacity.unwrap_or(80 << 30);
        Ok((
            total.saturating_sub(inner.physical_bytes + inner.linear_bytes),
            total,
        ))
    }
}

/// A backend whose calls do nothing and cost (almost) nothing: addresses and handles come
/// from counters; copies succeed without moving bytes.
#[derive(Debug)]
pub struct NullBackend {
    granularity: u64,
    next: AtomicU64,
}

impl NullBackend {
    /// A null backend with this granularity.
    pub fn new(granularity: u64) -> Self {
        Self {
            granularity,
            next: AtomicU64::new(1 << 40),
        }
    }
}

impl Backend for NullBackend {
    type Physical = u64;

    fn granularity(&self) -> Result<u64, BackendError> {
        Ok(self.granularity)
    }

    fn reserve(&self, size: u64, _alignment: u64) -> Result<u64, BackendError> {
        let size = size.div_ceil(self.granularity) * self.granularity;
        Ok(self
            .next
            .fetch_add(size + self.granularity, Ordering::Relaxed))
    }

    fn free_reservation(&self, _base: u64, _size: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn create_physical(&self, _size: u64) -> Result<u64, BackendError> {
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn release_physical(&self, _physical: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn map(&self, _addr: u64, _size: u64, _physical: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn unmap(&self, _addr: u64, _size: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn alloc_linear(&self, size: u64) -> Result<u64, BackendError> {
        Ok(self
            .next
            .fetch_add(size.div_ceil(256) * 256, Ordering::Relaxed))
    }

    fn free_linear(&self, _addr: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn copy_to_host(&self, _dst: &mut [u8], _src: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn copy_from_host(&self, _dst: u64, _src: &[u8]) -> Result<(), BackendError> {
        Ok(())
    }

    fn memory_info(&self) -> Result<(u64, u64), BackendError> {
        Ok((80 << 30, 80 << 30))
    }
}
