//! Driver-level physical memory made evictable: the handles of `cuMemCreate`, whichever way
//! the program reached it — `cudaGetDriverEntryPoint` (the runtime shim's `entry_points`,
//! PyTorch's expandable segments) or cudaw's driver layer (`libcuda.so.1`, through
//! [`driver::hooks::HandleHooks`], for cuBLAS, NCCL, Triton and driver-only programs).
//!
//! The program never sees a real `CUmemGenericAllocationHandle`: `cuMemCreate` hands out a
//! *virtual* handle (a tagged counter, [`TAG`]) and this table keeps, behind it, the current
//! real handle, the allocation's properties, the program's references (create 1, each
//! `cuMemRetainAllocationHandle` one more, each `cuMemRelease` one less), every mapping
//! (address, size, offset into the handle) and the access set on it. Every call that takes
//! a handle translates it; a handle the table does not know (one of cudaw's VMM, a
//! multicast object's) passes through unchanged.
//!
//! Pause ([`evict`], after the VMM's eviction, through the same pinned staging): every
//! live handle of device memory whose bytes are all reachable through its mappings is
//! copied to host memory (with `CUDAW_HOST_ARENA=pinned`, into the host arena as the VMM's
//! allocations are, under ids of its own: [`range_id`]), unmapped, and its real handle
//! released; its budget charge is given back. Resume ([`restore`]): a new real handle with
//! the same properties is created, mapped at the same addresses with the same offsets, its
//! access restored and its bytes copied back; the charge is taken again. Never evicted, and reported:
//! handles exported to or imported from a shareable handle (another process may use the
//! memory) or bound to a multicast object, handles of host memory, and handles not fully
//! mapped (bytes no mapping reaches cannot be copied). Not translated: the handles inside
//! `cuMemMapArrayAsync`'s `CUarrayMapInfo` (sparse arrays).

use crate::log;
use crate::memory;
use crate::staging::staging;
use driver::DriverBackend;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;
use vmm::{AllocationId, HostCopy, LoadRange, Source, Staging, StagingRange};

/// The high bits of every virtual handle (real drivers hand out pointers or small counters).
pub const TAG: u64 = 0xCDA0_0000_0000_0000;

const CU_SUCCESS: u32 = 0;
const CU_ERROR_INVALID_VALUE: u32 = 1;
const CU_ERROR_OUT_OF_MEMORY: u32 = 2;
const CU_ERROR_NOT_SUPPORTED: u32 = 801;

/// `sizeof(CUmemAllocationProp)` in every CUDA version since 10.2.
const PROP_BYTES: usize = 32;
/// `sizeof(CUmemAccessDesc)`.
const ACCESS_DESC_BYTES: usize = 12;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
const PROT_NONE: u32 = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const PROT_READWRITE: u32 = 3;

/// One `CUmemAccessDesc`: device `device` gets `flags`.
fn access_desc(device: i32, flags: u32) -> [u8; ACCESS_DESC_BYTES] {
    let mut d = [0u8; ACCESS_DESC_BYTES];
    d[0..4].copy_from_slice(&LOCATION_DEVICE.to_ne_bytes());
    d[4..8].copy_from_slice(&device.to_ne_bytes());
    d[8..12].copy_from_slice(&flags.to_ne_bytes());
    d
}

/// Whether the descriptors `descs` (`CUmemAccessDesc`s) give device `device` any access.
fn grants(descs: &[u8], device: i32) -> bool {
    descs.chunks_exact(ACCESS_DESC_BYTES).any(|d| {
        let word = |i: usize| u32::from_ne_bytes(d[i..i + 4].try_into().expect("4 bytes"));
        word(0) == LOCATION_DEVICE && word(4) as i32 == device && word(8) != PROT_NONE
    })
}

/// One handle the program holds.
#[derive(Debug, Clone)]
struct Handle {
    /// The real handle now; `None` while evicted.
    real: Option<u64>,
    /// Bytes (0 when unknown: an imported handle).
    size: u64,
    /// The `CUmemAllocationProp` it was created with.
    prop: [u8; PROP_BYTES],
    /// The device it is memory of (`None`: host memory, or unknown).
    device: Option<i32>,
    /// Bytes charged to the device's budget now.
    charged: u64,
    /// The program's references; 0: released by the program, alive while mapped.
    refs: u32,
    /// The real handle was released (the driver frees it at its last unmap).
    real_released: bool,
    /// Why it must stay on the device (exported, imported, bound to multicast).
    pinned: Option<&'static str>,
    /// While evicted: one per saved range.
    saved: Vec<Saved>,
    /// Memory shared with other processes ([`shared`]): the descriptors kept, the export
    /// it came from, and whether this pause evicts it.
    share: shared::Share,
}

/// One mapped range of an evicted handle: its bytes, in host memory, in the host arena or
/// in the image a dump wrote (`cudaw-ckpt dump`; resume reads them from there, by `id`).
#[derive(Debug, Clone)]
struct Saved {
    /// The mapping's address.
    addr: u64,
    /// Its id in a checkpoint image and in the host arena ([`range_id`]).
    id: u64,
    /// Its bytes.
    len: u64,
    /// Where the bytes are.
    bytes: Held,
}

/// Where an evicted range's bytes are.
#[derive(Debug, Clone)]
enum Held {
    /// In host memory of its own.
    Memory(Vec<u8>),
    /// In the page-locked host arena (`CUDAW_HOST_ARENA=pinned`), under the range's id on
    /// its device: [`crate::staging::with_retained`] reads them, a load or a dump forgets
    /// them ([`crate::staging::forget`]).
    Arena,
    /// In the image that holds the process's memory.
    Image,
}

/// Every mapping of virtual handle `v`: (address, mapping).
fn mappings_of(t: &Table, v: u64) -> Vec<(u64, Mapping)> {
    t.mappings
        .iter()
        .filter(|(_, m)| m.handle == v)
        .map(|(&va, m)| (va, m.clone()))
        .collect()
}

/// Unmaps every mapping of virtual handle `v` from the device (their records stay, to map
/// again): the first failure's address, size and CUresult.
fn unmap_all(t: &Table, v: u64) -> Result<(), (u64, u64, u32)> {
    let maps: Vec<(u64, u64)> = t
        .mappings
        .iter()
        .filter(|(_, m)| m.handle == v)
        .map(|(&va, m)| (va, m.size))
        .collect();
    for (va, size) in maps {
        let rc = real_unmap(va, size);
        if rc != CU_SUCCESS {
            return Err((va, size, rc));
        }
    }
    Ok(())
}

/// Maps real handle `r` at every one of `maps` again, with the access recorded on each;
/// `mapped` receives what was mapped (for the caller to undo on an error).
fn map_again(maps: &[(u64, Mapping)], r: u64, mapped: &mut Vec<(u64, u64)>) -> Result<(), String> {
    map_only(maps, r, mapped)?;
    for (_, m) in maps {
        for (a, n, d) in &m.access {
            set_access_again(*a, *n, d)?;
        }
    }
    Ok(())
}

/// `cuMemSetAccess` of `[va, va + size)` to `descs` (access the program set, set again on a
/// mapping made again), a failure as its message.
fn set_access_again(va: u64, size: u64, descs: &[u8]) -> Result<(), String> {
    match real_set_access(va, size, descs) {
        CU_SUCCESS => Ok(()),
        rc => Err(format!(
            "setting access on {size} bytes at {va:#x}: CUresult {rc}"
        )),
    }
}

/// Bits 48..52 of a virtual handle: clear while the handle counter stays below 2^48 (and
/// [`TAG`] leaves them clear), for [`range_id`]'s range index.
const RANGE_BITS: u64 = 0xF << 48;

/// The id of range `i` (in address order) of virtual handle `v`, in a checkpoint image and
/// in the host arena: the handle itself for its first range, then the range index in bits
/// 48..52. `None` past 16 ranges, or for a handle whose counter reached those bits (2^48
/// handles made: not in practice), so that two ranges never share an id.
///
/// Never an id of the VMM's: every range id has [`TAG`]'s bits set, so it is at least
/// [`TAG`] (0xCDA0 << 48), while the VMM numbers its allocations from 0 up, one per
/// allocation, per device (`vmm::AllocationId`, its creation order), and would need
/// 2^63 allocations to reach it. The host arena, keyed by those ids per device, can hold
/// both ([`is_range_id`] tells them apart).
fn range_id(v: u64, i: usize) -> Option<u64> {
    (i < 16 && v & TAG == TAG && v & RANGE_BITS == 0).then_some(v | ((i as u64) << 48))
}

/// Whether `id` (in the host arena or an image) is a driver-handle range's, not a VMM
/// allocation's ([`range_id`]).
pub fn is_range_id(id: u64) -> bool {
    id & TAG == TAG
}

/// One `cuMemMap`.
#[derive(Debug, Clone)]
struct Mapping {
    size: u64,
    offset: u64,
    /// The virtual handle mapped.
    handle: u64,
    /// `cuMemSetAccess` calls over (part of) it: (address, bytes, descriptors).
    access: Vec<(u64, u64, Vec<u8>)>,
}

#[derive(Debug, Default)]
struct Table {
    handles: BTreeMap<u64, Handle>,
    mappings: BTreeMap<u64, Mapping>,
    next: u64,
    peak: u64,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    handles: BTreeMap::new(),
    mappings: BTreeMap::new(),
    next: 1,
    peak: 0,
});

/// What the table holds now, per device.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Live handles.
    pub handles: u64,
    /// Bytes of handles on the device.
    pub resident: u64,
    /// Bytes of evicted handles.
    pub evicted: u64,
    /// Of `resident`, bytes a pause cannot evict (see the module docs).
    pub held: u64,
}

/// Counts of device `ordinal`'s handles.
pub fn counts(ordinal: i32) -> Counts {
    let t = TABLE.lock();
    let mut c = Counts::default();
    for (&v, h) in t.handles.iter().filter(|(_, h)| h.device == Some(ordinal)) {
        c.handles += 1;
        if h.real.is_some() {
            c.resident += h.size;
            if evictable(&t, v).is_err() {
                c.held += h.size;
            }
        } else {
            c.evicted += h.size;
        }
    }
    c
}

/// Devices with handles in the table.
pub fn devices() -> Vec<i32> {
    let t = TABLE.lock();
    let mut d: Vec<i32> = t.handles.values().filter_map(|h| h.device).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// (live handles, bytes, peak bytes, mappings), for the exit summary.
pub fn summary() -> (usize, u64, u64, usize) {
    let t = TABLE.lock();
    let bytes = t.handles.values().map(|h| h.size).sum();
    (t.handles.len(), bytes, t.peak, t.mappings.len())
}

// ---- the real driver ----

/// The real driver functions the table calls, resolved once.
struct Real {
    create: Option<usize>,
    release: Option<usize>,
    map: Option<usize>,
    unmap: Option<usize>,
    set_access: Option<usize>,
    props: Option<usize>,
    export: Option<usize>,
    import: Option<usize>,
    retain: Option<usize>,
    bind: Option<usize>,
    bind_v2: Option<usize>,
}

fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| {
        let drv = memory::driver().ok();
        let get = |n: &CStr| drv.as_ref().and_then(|d| d.raw_symbol(n));
        Real {
            create: get(c"cuMemCreate"),
            release: get(c"cuMemRelease"),
            map: get(c"cuMemMap"),
            unmap: get(c"cuMemUnmap"),
            set_access: get(c"cuMemSetAccess"),
            props: get(c"cuMemGetAllocationPropertiesFromHandle"),
            export: get(c"cuMemExportToShareableHandle"),
            import: get(c"cuMemImportFromShareableHandle"),
            retain: get(c"cuMemRetainAllocationHandle"),
            bind: get(c"cuMulticastBindMem"),
            bind_v2: get(c"cuMulticastBindMem_v2"),
        }
    })
}

macro_rules! call {
    ($f:expr, fn($($t:ty),*), $($arg:expr),*) => {
        match $f {
            // SAFETY: the real driver's export of this name, whose C signature (cuda.h) is
            // written here; the arguments are the program's, translated, or cudaw's own.
            Some(p) => unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> u32>(p)($($arg),*) },
            None => CU_ERROR_NOT_SUPPORTED,
        }
    };
}

fn real_create(size: u64, prop: &[u8; PROP_BYTES]) -> Result<u64, u32> {
    let mut h = 0u64;
    let rc = call!(
        real().create,
        fn(*mut u64, usize, *const c_void, u64),
        &mut h,
        size as usize,
        prop.as_ptr().cast(),
        0
    );
    if rc == CU_SUCCESS {
        Ok(h)
    } else {
        Err(rc)
    }
}

fn real_release(h: u64) -> u32 {
    call!(real().release, fn(u64), h)
}

fn real_map(va: u64, size: u64, offset: u64, h: u64) -> u32 {
    call!(
        real().map,
        fn(u64, usize, usize, u64, u64),
        va,
        size as usize,
        offset as usize,
        h,
        0
    )
}

fn real_unmap(va: u64, size: u64) -> u32 {
    call!(real().unmap, fn(u64, usize), va, size as usize)
}

fn real_set_access(va: u64, size: u64, descs: &[u8]) -> u32 {
    call!(
        real().set_access,
        fn(u64, usize, *const c_void, usize),
        va,
        size as usize,
        descs.as_ptr().cast(),
        descs.len() / ACCESS_DESC_BYTES
    )
}

/// The device a `CUmemAllocationProp` places memory on, if device memory: `location`
/// (`{ CUmemLocationType type; int id; }`) at offset 8.
fn device_of(prop: &[u8; PROP_BYTES]) -> Option<i32> {
    let kind = u32::from_ne_bytes(prop[8..12].try_into().ok()?);
    let id = i32::from_ne_bytes(prop[12..16].try_into().ok()?);
    (kind == LOCATION_DEVICE).then_some(id)
}

// ---- the calls ----

/// `cuMemCreate`: charges device memory to its budget when `charge`, creates the real
/// handle, hands out a virtual one.
///
/// # Safety
/// `out` is null or writable; `prop` is null or a `CUmemAllocationProp`.
pub unsafe fn create(
    out: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
    charge: bool,
) -> u32 {
    let _in_flight = crate::inflight::enter();
    if out.is_null() || prop.is_null() || size == 0 {
        return call!(
            real().create,
            fn(*mut u64, usize, *const c_void, u64),
            out,
            size,
            prop,
            flags
        );
    }
    let mut p = [0u8; PROP_BYTES];
    // SAFETY: a CUmemAllocationProp is 32 bytes (caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(prop.cast::<u8>(), p.as_mut_ptr(), PROP_BYTES) };
    let device = device_of(&p);
    let mut charged = 0;
    if let (Some(dev), true) = (device, charge) {
        if let Ok(b) = memory::budget(dev) {
            if let Err(first) = b.try_acquire(size as u64) {
                // With a node daemon, wait for it to make room.
                // Only the card shared with other jobs can have room made; the
                // process's own limit or a ledger that cannot be kept cannot.
                let waited = crate::room::retry(
                    dev,
                    size as u64,
                    first,
                    |r| matches!(r, cudaw_ledger::Refusal::Node { .. }),
                    || b.try_acquire(size as u64),
                );
                if waited.is_err() {
                    return CU_ERROR_OUT_OF_MEMORY;
                }
            }
            charged = size as u64;
        }
    }
    let mut h = 0u64;
    let rc = call!(
        real().create,
        fn(*mut u64, usize, *const c_void, u64),
        &mut h,
        size,
        prop,
        flags
    );
    if rc != CU_SUCCESS {
        if let (Some(dev), true) = (device, charged > 0) {
            memory::uncharge(dev, charged);
        }
        return rc;
    }
    let mut t = TABLE.lock();
    let v = TAG | t.next;
    t.next += 1;
    t.handles.insert(
        v,
        Handle {
            real: Some(h),
            size: size as u64,
            prop: p,
            device,
            charged,
            refs: 1,
            real_released: false,
            pinned: None,
            saved: Vec::new(),
            share: shared::Share::default(),
        },
    );
    let bytes: u64 = t.handles.values().map(|h| h.size).sum();
    t.peak = t.peak.max(bytes);
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out.write(v) };
    CU_SUCCESS
}

/// The real handle behind `h` (itself when the table does not know it).
fn translate(t: &Table, h: u64) -> Result<u64, u32> {
    match t.handles.get(&h) {
        Some(e) => e.real.ok_or(CU_ERROR_INVALID_VALUE),
        None => Ok(h),
    }
}

/// Forgets `v` and gives its charge back.
fn forget(t: &mut Table, v: u64) {
    if let Some(h) = t.handles.remove(&v) {
        if let (Some(dev), true) = (h.device, h.charged > 0) {
            memory::uncharge(dev, h.charged);
        }
    }
}

/// `cuMemRelease`.
pub fn release(v: u64) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let Some(h) = t.handles.get_mut(&v) else {
        drop(t);
        return real_release(v);
    };
    if h.refs == 0 {
        return CU_ERROR_INVALID_VALUE;
    }
    h.refs -= 1;
    if h.refs > 0 {
        return CU_SUCCESS;
    }
    if let (Some(r), false) = (h.real, h.real_released) {
        let rc = real_release(r);
        if rc != CU_SUCCESS {
            h.refs = 1;
            return rc;
        }
        h.real_released = true;
    }
    if !t.mappings.values().any(|m| m.handle == v) {
        forget(&mut t, v);
    }
    CU_SUCCESS
}

/// `cuMemMap`.
pub fn map(va: u64, size: usize, offset: usize, v: u64, flags: u64) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let r = match translate(&t, v) {
        Ok(r) => r,
        Err(rc) => return rc,
    };
    let rc = call!(
        real().map,
        fn(u64, usize, usize, u64, u64),
        va,
        size,
        offset,
        r,
        flags
    );
    if rc == CU_SUCCESS && t.handles.contains_key(&v) {
        t.mappings.insert(
            va,
            Mapping {
                size: size as u64,
                offset: offset as u64,
                handle: v,
                access: Vec::new(),
            },
        );
        // The devices with peer access to the handle's device may use it too.
        if let Some(owner) = t.handles[&v].device {
            if let Err(e) = grant_peers(va, size as u64, owner) {
                log::warn(format_args!("cuMemMap at {va:#x}: {e}"));
            }
        }
    }
    rc
}

/// Grants every device with peer access to `owner`'s memory read/write access on the
/// mapping at `va` (`size` bytes).
fn grant_peers(va: u64, size: u64, owner: i32) -> Result<(), String> {
    for accessor in memory::peer_accessors(owner) {
        let rc = real_set_access(va, size, &access_desc(accessor, PROT_READWRITE));
        if rc != CU_SUCCESS {
            return Err(format!(
                "granting device {accessor} access to {size} bytes of device {owner}'s memory at {va:#x}: CUresult {rc}"
            ));
        }
    }
    Ok(())
}

/// The mappings of device `owner`'s handles on the device now: (address, bytes, the
/// program's own access settings on it).
fn resident_mappings_of(t: &Table, owner: i32) -> Vec<(u64, u64, Vec<u8>)> {
    t.mappings
        .iter()
        .filter(|(_, m)| {
            t.handles
                .get(&m.handle)
                .is_some_and(|h| h.device == Some(owner) && h.real.is_some())
        })
        .map(|(&va, m)| {
            let own: Vec<u8> = m.access.iter().flat_map(|(_, _, d)| d.clone()).collect();
            (va, m.size, own)
        })
        .collect()
}

/// Peer access enabled ([`crate::peer`]): device `accessor` gets read/write access on every
/// mapping of device `owner`'s handles on the device (evicted ones get it when a resume
/// maps them again). Every mapping is tried; the first failure is returned.
pub fn grant_peer(accessor: i32, owner: i32) -> Result<(), String> {
    let t = TABLE.lock();
    let mut first = Ok(());
    for (va, size, _) in resident_mappings_of(&t, owner) {
        let rc = real_set_access(va, size, &access_desc(accessor, PROT_READWRITE));
        if rc != CU_SUCCESS && first.is_ok() {
            first = Err(format!("{size} bytes at {va:#x}: CUresult {rc}"));
        }
    }
    first
}

/// Peer access disabled: device `accessor`'s access to the mappings of device `owner`'s
/// handles is taken away, except on mappings where the program granted it itself
/// (`cuMemSetAccess`). Every mapping is tried; the first failure is returned.
pub fn revoke_peer(accessor: i32, owner: i32) -> Result<(), String> {
    let t = TABLE.lock();
    let mut first = Ok(());
    for (va, size, own) in resident_mappings_of(&t, owner) {
        if grants(&own, accessor) {
            continue;
        }
        let rc = real_set_access(va, size, &access_desc(accessor, PROT_NONE));
        if rc != CU_SUCCESS && first.is_ok() {
            first = Err(format!("{size} bytes at {va:#x}: CUresult {rc}"));
        }
    }
    first
}

/// `cuMemUnmap`.
pub fn unmap(va: u64, size: usize) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let rc = real_unmap(va, size as u64);
    if rc != CU_SUCCESS {
        return rc;
    }
    let end = va.saturating_add(size as u64);
    let gone: Vec<u64> = t.mappings.range(va..end).map(|(&a, _)| a).collect();
    for a in gone {
        if let Some(m) = t.mappings.remove(&a) {
            let v = m.handle;
            let orphan = t.handles.get(&v).is_some_and(|h| h.refs == 0)
                && !t.mappings.values().any(|m| m.handle == v);
            if orphan {
                forget(&mut t, v);
            }
        }
    }
    CU_SUCCESS
}

/// `cuMemSetAccess` (addresses, nothing to translate): recorded on the mappings it covers.
///
/// # Safety
/// `desc` is null or `count` `CUmemAccessDesc`s.
pub unsafe fn set_access(va: u64, size: usize, desc: *const c_void, count: usize) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let rc = call!(
        real().set_access,
        fn(u64, usize, *const c_void, usize),
        va,
        size,
        desc,
        count
    );
    if rc != CU_SUCCESS || desc.is_null() || count == 0 {
        return rc;
    }
    // SAFETY: `count` descriptors at `desc` (the caller's contract; the driver read them).
    let descs = unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), count * ACCESS_DESC_BYTES) }
        .to_vec();
    let end = va.saturating_add(size as u64);
    let start = t.mappings.range(..=va).next_back().map_or(va, |(&a, _)| a);
    for (&a, m) in t.mappings.range_mut(start..end) {
        let (lo, hi) = (a.max(va), (a + m.size).min(end));
        if lo < hi {
            m.access.push((lo, hi - lo, descs.clone()));
        }
    }
    CU_SUCCESS
}

/// `cuMemGetAllocationPropertiesFromHandle`.
///
/// # Safety
/// `prop` is null or a writable `CUmemAllocationProp`.
pub unsafe fn properties(prop: *mut c_void, v: u64) -> u32 {
    let t = TABLE.lock();
    match t.handles.get(&v) {
        Some(h) if h.real.is_none() && !prop.is_null() => {
            // SAFETY: a writable CUmemAllocationProp (caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(h.prop.as_ptr(), prop.cast::<u8>(), PROP_BYTES)
            };
            CU_SUCCESS
        }
        _ => match translate(&t, v) {
            Ok(r) => call!(real().props, fn(*mut c_void, u64), prop, r),
            Err(rc) => rc,
        },
    }
}

/// Marks `v` as never to evict, for `why`.
fn pin(t: &mut Table, v: u64, why: &'static str) {
    if let Some(h) = t.handles.get_mut(&v) {
        if h.pinned.is_none() {
            log::info(format_args!(
                "driver handle {v:#x} ({} bytes) {why}: it stays on the device while paused",
                h.size
            ));
        }
        h.pinned = Some(why);
    }
}

/// `cuMemExportToShareableHandle`: the handle is pinned (another process may map it).
pub fn export(out: *mut c_void, v: u64, kind: u32, flags: u64) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let r = match translate(&t, v) {
        Ok(r) => r,
        Err(rc) => return rc,
    };
    let rc = call!(
        real().export,
        fn(*mut c_void, u64, u32, u64),
        out,
        r,
        kind,
        flags
    );
    if rc == CU_SUCCESS {
        pin(&mut t, v, EXPORTED);
        shared::note_export(&mut t, v, kind, out);
    }
    rc
}

/// `cuMemImportFromShareableHandle`: a virtual handle for the imported one, pinned.
///
/// # Safety
/// `out` is null or writable.
pub unsafe fn import(out: *mut u64, os: *mut c_void, kind: u32) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut r = 0u64;
    let rc = call!(
        real().import,
        fn(*mut u64, *mut c_void, u32),
        &mut r,
        os,
        kind
    );
    if rc != CU_SUCCESS || out.is_null() {
        return rc;
    }
    let mut prop = [0u8; PROP_BYTES];
    let _ = call!(
        real().props,
        fn(*mut c_void, u64),
        prop.as_mut_ptr().cast(),
        r
    );
    let mut t = TABLE.lock();
    let v = TAG | t.next;
    t.next += 1;
    t.handles.insert(
        v,
        Handle {
            real: Some(r),
            size: 0,
            prop,
            device: None,
            charged: 0,
            refs: 1,
            real_released: false,
            pinned: Some(IMPORTED),
            saved: Vec::new(),
            share: shared::Share::imported(kind, os),
        },
    );
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out.write(v) };
    CU_SUCCESS
}

/// `cuMemRetainAllocationHandle`: the virtual handle mapped at `addr`, one more reference.
///
/// # Safety
/// `out` is null or writable.
pub unsafe fn retain(out: *mut u64, addr: *mut c_void) -> u32 {
    let _in_flight = crate::inflight::enter();
    let a = addr as u64;
    let mut t = TABLE.lock();
    let found = t
        .mappings
        .range(..=a)
        .next_back()
        .filter(|(&va, m)| a < va + m.size)
        .map(|(_, m)| m.handle);
    let Some(v) = found.filter(|v| t.handles.contains_key(v)) else {
        drop(t);
        return call!(real().retain, fn(*mut u64, *mut c_void), out, addr);
    };
    if out.is_null() {
        return CU_ERROR_INVALID_VALUE;
    }
    let h = t.handles.get_mut(&v).expect("checked above");
    if h.real_released {
        // The driver frees a released handle at its last unmap: take a real reference.
        let mut r = 0u64;
        let rc = call!(real().retain, fn(*mut u64, *mut c_void), &mut r, addr);
        if rc != CU_SUCCESS {
            return rc;
        }
        h.real_released = false;
    }
    h.refs += 1;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out.write(v) };
    CU_SUCCESS
}

/// `cuMulticastBindMem`: `mem` translated and pinned.
pub fn bind(mc: u64, mc_offset: usize, v: u64, offset: usize, size: usize, flags: u64) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let r = match translate(&t, v) {
        Ok(r) => r,
        Err(rc) => return rc,
    };
    let rc = call!(
        real().bind,
        fn(u64, usize, u64, usize, usize, u64),
        mc,
        mc_offset,
        r,
        offset,
        size,
        flags
    );
    if rc == CU_SUCCESS {
        pin(&mut t, v, "was bound to a multicast object");
    }
    rc
}

/// `cuMulticastBindMem_v2`: `mem` translated and pinned.
pub fn bind_v2(
    mc: u64,
    dev: i32,
    mc_offset: usize,
    v: u64,
    offset: usize,
    size: usize,
    flags: u64,
) -> u32 {
    let _in_flight = crate::inflight::enter();
    let mut t = TABLE.lock();
    let r = match translate(&t, v) {
        Ok(r) => r,
        Err(rc) => return rc,
    };
    let rc = call!(
        real().bind_v2,
        fn(u64, i32, usize, u64, usize, usize, u64),
        mc,
        dev,
        mc_offset,
        r,
        offset,
        size,
        flags
    );
    if rc == CU_SUCCESS {
        pin(&mut t, v, "was bound to a multicast object");
    }
    rc
}

// ---- pause and resume ----

/// Whether `h` can be evicted: `Err` says why not.
fn evictable(t: &Table, v: u64) -> Result<(), String> {
    let Some(h) = t.handles.get(&v) else {
        return Err("is unknown".into());
    };
    if let Some(why) = h.pinned {
        // An export its job evicts (every descriptor of it paired): `evict_shared` only.
        if !(why == EXPORTED && h.share.evict && shared::evicting_exports()) {
            return Err(why.to_owned());
        }
    }
    if h.device.is_none() {
        return Err("is not device memory".into());
    }
    // Every byte must be reachable through a mapping.
    let mut spans: Vec<(u64, u64)> = t
        .mappings
        .values()
        .filter(|m| m.handle == v)
        .map(|m| (m.offset, m.offset + m.size))
        .collect();
    spans.sort_unstable();
    let mut covered = 0u64;
    for (lo, hi) in spans {
        if lo > covered {
            break;
        }
        covered = covered.max(hi);
    }
    if covered < h.size {
        return Err(format!("is mapped over {covered} of its {} bytes", h.size));
    }
    Ok(())
}

/// The ranges to save of handle `v`: one mapping per distinct span of the handle.
fn ranges_of(t: &Table, v: u64) -> Vec<(u64, u64)> {
    let mut seen = std::collections::HashSet::new();
    t.mappings
        .iter()
        .filter(|(_, m)| m.handle == v && seen.insert((m.offset, m.size)))
        .map(|(&va, m)| (va, m.size))
        .collect()
}

/// What a pause or resume of the handles did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Moved {
    /// Handles evicted or restored.
    pub handles: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Handles left on the device (see the module docs).
    pub kept: usize,
    /// Their bytes.
    pub kept_bytes: u64,
    /// Of the time taken, the copies between device and host (the rest: unmapping,
    /// releasing, mapping again).
    pub copy_ms: f64,
}

/// Evicts every evictable handle (the gate closed, the devices synchronised): bytes to
/// host memory through the process's pinned staging, mappings removed, real handles
/// released. On failure, what was evicted is restored. `copied` receives bytes copied.
pub fn evict(copied: &mut dyn FnMut(u64)) -> Result<Moved, String> {
    let mut t = TABLE.lock();
    let mut moved = Moved::default();

    let mut by_device: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    // Handles left on the device, by reason: (count, bytes, first handle).
    let mut kept: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    let ids: Vec<u64> = t.handles.keys().copied().collect();
    for v in ids {
        let h = &t.handles[&v];
        if h.real.is_none() {
            continue;
        }
        match evictable(&t, v) {
            Ok(()) => by_device.entry(h.device.unwrap_or(0)).or_default().push(v),
            Err(why) => {
                if h.device.is_some() {
                    moved.kept += 1;
                    moved.kept_bytes += h.size;
                    let k = kept.entry(why).or_insert((0, 0, v));
                    k.0 += 1;
                    k.1 += h.size;
                }
            }
        }
    }
    // One line per reason, not per handle: NCCL alone shares a hundred buffers a rank.
    for (why, (n, bytes, first)) in kept {
        if why == EXPORTED || why == IMPORTED {
            log::info(format_args!(
                "pause: {n} driver handles ({bytes} bytes, the first {first:#x}) {why}: left on \
                 the device (memory shared with other processes; `cudaw-ckpt pause --job` \
                 evicts it once every process sharing it is paused)"
            ));
        } else {
            log::warn(format_args!(
                "pause: {n} driver handles ({bytes} bytes, the first {first:#x}) {why}: left on \
                 the device"
            ));
        }
    }
    let mut done: Vec<u64> = Vec::new();
    let r = (|| -> Result<(), String> {
        for (dev, vs) in &by_device {
            let m = memory::device_without_runtime(*dev)
                .map_err(|e| format!("device {dev}: error {e}"))?;
            let backend = m.vmm.backend();
            backend.make_current().map_err(|e| e.to_string())?;
            // Ranges with an id of their own go where the pause puts the VMM's bytes (the
            // host arena, where there is one and it has room); the others (a handle mapped
            // over more than 16 spans) into host memory of their own.
            let (mut arena, mut other) = (Vec::new(), Vec::new());
            for &v in vs {
                for (i, (va, len)) in ranges_of(&t, v).into_iter().enumerate() {
                    let id = range_id(v, i);
                    let r = StagingRange {
                        id: AllocationId(id.unwrap_or(v)),
                        addr: va,
                        len,
                    };
                    match id {
                        Some(id) => arena.push((r, v, id)),
                        None => other.push((r, v, 0)),
                    }
                }
            }
            let copy_started = std::time::Instant::now();
            let only = |rs: &[(StagingRange, u64, u64)]| -> Vec<StagingRange> {
                rs.iter().map(|(r, _, _)| *r).collect()
            };
            let failed = |e: vmm::StagingError| {
                format!("copying driver handles of device {dev} to host: {e}")
            };
            let mut copies = if arena.is_empty() {
                Vec::new()
            } else {
                crate::staging::save_for_pause(backend, &only(&arena)).map_err(failed)?
            };
            if !other.is_empty() {
                match staging().save(backend, &only(&other)) {
                    Ok(c) => copies.extend(c),
                    Err(e) => {
                        // The bytes the arena took are nobody's.
                        for (_, _, id) in &arena {
                            crate::staging::forget(backend, AllocationId(*id));
                        }
                        return Err(failed(e));
                    }
                }
            }
            moved.copy_ms += copy_started.elapsed().as_secs_f64() * 1e3;
            let arena_ids: Vec<u64> = arena.iter().map(|(_, _, id)| *id).collect();
            let ranges: Vec<(StagingRange, u64, u64)> = arena.into_iter().chain(other).collect();
            copied(ranges.iter().map(|(r, _, _)| r.len).sum());
            let held = held_copies(&ranges, copies).inspect_err(|_| {
                // Nothing of this device is evicted: the arena's bytes are nobody's.
                for id in &arena_ids {
                    crate::staging::forget(backend, AllocationId(*id));
                }
            })?;
            // Handles whose every range is in the arena.
            let mut not_all: std::collections::HashSet<u64> = std::collections::HashSet::new();
            for ((r, v, id), bytes) in ranges.iter().zip(held) {
                if matches!(bytes, Held::Memory(_)) {
                    not_all.insert(*v);
                }
                let h = t.handles.get_mut(v).expect("live");
                h.saved.push(Saved {
                    addr: r.addr,
                    id: *id,
                    len: r.len,
                    bytes,
                });
            }
            let in_arena: Vec<u64> = vs
                .iter()
                .copied()
                .filter(|v| !not_all.contains(v))
                .collect();
            if !in_arena.is_empty() {
                let bytes: u64 = in_arena.iter().map(|v| t.handles[v].size).sum();
                log::info(format_args!(
                    "pause: device {dev}: {} of {} driver handles ({bytes} bytes) left in the host arena",
                    in_arena.len(),
                    vs.len()
                ));
            }
            // With the arena on, what did not fit is said too (it went to host memory, at
            // the slower staging speed).
            if crate::config::get().staging.host_arena && !not_all.is_empty() {
                let bytes: u64 = not_all.iter().map(|v| t.handles[v].size).sum();
                log::info(format_args!(
                    "pause: device {dev}: {} of {} driver handles ({bytes} bytes) went to host memory: \
                     the host arena had no room for them (or not yet: it is made once the memory holds still)",
                    not_all.len(),
                    vs.len()
                ));
            }
            for &v in vs {
                unmap_all(&t, v).map_err(|(va, size, rc)| {
                    format!("unmapping {size} bytes at {va:#x}: CUresult {rc}")
                })?;
                let h = t.handles.get_mut(&v).expect("live");
                if !h.real_released {
                    let rc = real_release(h.real.expect("resident"));
                    if rc != CU_SUCCESS {
                        log::warn(format_args!(
                            "pause: releasing driver handle {v:#x}: CUresult {rc}"
                        ));
                    }
                }
                h.real = None;
                // The descriptors kept would hold the memory: the job's importers have
                // let theirs go too.
                h.share.fds.clear();
                if h.charged > 0 {
                    memory::uncharge(*dev, h.charged);
                    h.charged = 0;
                }
                moved.handles += 1;
                moved.bytes += h.size;
                done.push(v);
            }
        }
        Ok(())
    })();
    // Handles whose bytes were saved but that stayed mapped keep nothing saved (nor
    // anything in the host arena).
    for h in t.handles.values_mut().filter(|h| h.real.is_some()) {
        forget_in_arena(h.device, &h.saved);
        h.saved.clear();
    }
    if let Err(e) = r {
        drop(t);
        if let Err(e2) = restore(&mut staging()) {
            log::error(format_args!(
                "pause: putting driver handles back failed: {e2}"
            ));
        }
        return Err(e);
    }
    Ok(moved)
}

/// Where the staging put each of `ranges` ((range, handle, range id or 0)): in host memory,
/// or in the host arena (only a range with an id of its own); `Err` on anything else.
fn held_copies(
    ranges: &[(StagingRange, u64, u64)],
    copies: Vec<HostCopy>,
) -> Result<Vec<Held>, String> {
    if copies.len() != ranges.len() {
        return Err(format!(
            "the staging returned {} copies of driver handles' ranges, expected {}",
            copies.len(),
            ranges.len()
        ));
    }
    ranges
        .iter()
        .zip(copies)
        .map(|((r, v, id), c)| match c {
            HostCopy::Memory(b) => Ok(Held::Memory(b)),
            HostCopy::Retained if *id != 0 => Ok(Held::Arena),
            other => {
                let kind = match other {
                    HostCopy::File { .. } => "a file",
                    _ => "the staging itself, under no id of the range's",
                };
                Err(format!(
                    "the bytes of driver handle {v:#x} ({} bytes at {:#x}) went to {kind}, not to host memory or the host arena",
                    r.len, r.addr
                ))
            }
        })
        .collect()
}

/// The host arena of `device`'s context forgets the ranges of `saved` it holds.
fn forget_in_arena(device: Option<i32>, saved: &[Saved]) {
    for s in saved.iter().filter(|s| matches!(s.bytes, Held::Arena)) {
        forget_range(device, s.id);
    }
}

/// The host arena of `device`'s context forgets range `id`.
fn forget_range(device: Option<i32>, id: u64) {
    if let Some(m) = device.and_then(|d| memory::device_without_runtime(d).ok()) {
        crate::staging::forget(m.vmm.backend(), AllocationId(id));
    }
}

/// The ids of device `ordinal`'s evicted ranges whose bytes are in the host arena: what a
/// resume must not let the arena forget before it has loaded them
/// ([`crate::staging::restored`]).
pub fn in_arena(ordinal: i32) -> std::collections::HashSet<u64> {
    let t = TABLE.lock();
    t.handles
        .values()
        .filter(|h| h.device == Some(ordinal))
        .flat_map(|h| h.saved.iter())
        .filter(|s| matches!(s.bytes, Held::Arena))
        .map(|s| s.id)
        .collect()
}

/// Host arena bytes device `ordinal`'s driver handles need for a pause (the handles a
/// pause evicts, exports included: each distinct mapped span as [`evict`] saves it, up to
/// 16 a handle, rounded up as the arena places it).
pub fn arena_demand(ordinal: i32) -> u64 {
    demand_of(&TABLE.lock(), ordinal)
}

fn demand_of(t: &Table, ordinal: i32) -> u64 {
    // Only what a pause can put there: handles it evicts (and exports, which a job pause
    // evicts), not those bound to multicast or not wholly mapped; at most 16 spans a
    // handle (the ranges past those have no arena id).
    let counted = |v: u64| {
        t.handles.get(&v).is_some_and(|h| {
            h.device == Some(ordinal) && (h.pinned == Some(EXPORTED) || evictable(t, v).is_ok())
        })
    };
    let mut seen = std::collections::HashSet::new();
    let mut spans: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    t.mappings
        .values()
        .filter(|m| counted(m.handle) && seen.insert((m.handle, m.offset, m.size)))
        .filter(|m| {
            let n = spans.entry(m.handle).or_default();
            *n += 1;
            range_id(m.handle, *n - 1).is_some()
        })
        .map(|m| m.size.next_multiple_of(driver::ARENA_ALIGN))
        .sum()
}

/// Bytes of evicted handles.
pub fn evicted_bytes() -> u64 {
    TABLE
        .lock()
        .handles
        .values()
        .filter(|h| h.real.is_none())
        .map(|h| h.size)
        .sum()
}

/// Why an exported handle is pinned.
const EXPORTED: &str = "was exported to a shareable handle";
/// Why an imported handle is pinned.
const IMPORTED: &str = "was imported from a shareable handle";

/// Whether `h` is memory shared with other processes (exported or imported).
fn is_shared(h: &Handle) -> bool {
    matches!(h.pinned, Some(EXPORTED) | Some(IMPORTED))
}

/// The driver handles of device memory a pause cannot evict (exported, imported, bound to a
/// multicast object, not fully mapped), which an image cannot hold: (count, bytes, the first
/// one's reason). `None` when every one can be evicted. With `allow_shared`, memory shared
/// with other processes is left out (a job dump leaves it on the device).
pub fn unevictable(allow_shared: bool) -> Option<(usize, u64, String)> {
    let t = TABLE.lock();
    let mut out: Option<(usize, u64, String)> = None;
    for (&v, h) in t
        .handles
        .iter()
        .filter(|(_, h)| h.device.is_some() && !(allow_shared && is_shared(h)))
    {
        let why = match evictable(&t, v) {
            Ok(()) if ranges_of(&t, v).len() <= 16 => continue,
            Ok(()) => "is mapped over more than 16 distinct spans".to_owned(),
            Err(why) => why,
        };
        match &mut out {
            Some((n, b, _)) => {
                *n += 1;
                *b += h.size;
            }
            None => out = Some((1, h.size, format!("handle {v:#x} ({} bytes) {why}", h.size))),
        }
    }
    out
}

/// Devices with evicted handles.
pub fn evicted_devices() -> Vec<i32> {
    let t = TABLE.lock();
    let mut d: Vec<i32> = t
        .handles
        .values()
        .filter(|h| h.real.is_none())
        .filter_map(|h| h.device)
        .collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// The image records of device `dev`'s evicted handles: one per saved range, in handle
/// then address order (what dump writes and restore compares with the image's).
pub fn image_records(dev: i32) -> Vec<ckpt::AllocationRecord> {
    let t = TABLE.lock();
    let mut out = Vec::new();
    for (&v, h) in &t.handles {
        if h.real.is_some() || h.device != Some(dev) {
            continue;
        }
        for s in &h.saved {
            let offset = t.mappings.get(&s.addr).map_or(0, |m| m.offset);
            out.push(ckpt::AllocationRecord {
                id: s.id,
                base: s.addr,
                size: s.len,
                order: v & !TAG,
                tag: 0,
                handle: Some(ckpt::HandleRange {
                    handle: v,
                    handle_size: h.size,
                    offset,
                    prop: h.prop,
                }),
                device: dev as u32,
            });
        }
    }
    out
}

/// Calls `f` with the saved bytes of range `id`, from host memory or the host arena
/// (`None`: they are in the image that holds the process's memory; the range unknown, or
/// its bytes missing from the arena: `Err`).
pub fn with_saved<R>(id: u64, f: impl FnOnce(Option<&[u8]>) -> R) -> Result<R, String> {
    let t = TABLE.lock();
    let (h, s) = t
        .handles
        .values()
        .flat_map(|h| h.saved.iter().map(move |s| (h, s)))
        .find(|(_, s)| s.id == id)
        .ok_or_else(|| format!("driver handle range {id:#x} is not saved"))?;
    match &s.bytes {
        Held::Memory(b) => Ok(f(Some(b))),
        Held::Image => Ok(f(None)),
        Held::Arena => {
            let dev = h.device.unwrap_or(0);
            let m = memory::device_without_runtime(dev)
                .map_err(|e| format!("driver handle range {id:#x}: device {dev}: error {e}"))?;
            crate::staging::with_retained(m.vmm.backend(), AllocationId(id), |b| f(Some(b)))
                .ok_or_else(|| {
                    format!(
                        "driver handle range {id:#x} ({} bytes at {:#x}): not in the host arena of device {dev}",
                        s.len, s.addr
                    )
                })
        }
    }
}

/// After a dump: the bytes of these ranges live only in the image (host copies freed, the
/// host arena's forgotten).
pub fn mark_in_image(ids: &[u64]) {
    let mut t = TABLE.lock();
    for h in t.handles.values_mut() {
        let device = h.device;
        for s in h.saved.iter_mut().filter(|s| ids.contains(&s.id)) {
            if matches!(s.bytes, Held::Arena) {
                forget_range(device, s.id);
            }
            s.bytes = Held::Image;
        }
    }
}

/// Restores every evicted handle: a new real handle, the same mappings and access, the
/// bytes, loaded through `loader` (from host memory, or, for ranges a dump left in an image
/// or every range of a restore, from the image). On failure every handle stays evicted
/// (resume again retries).
pub fn restore(loader: &mut dyn Staging<DriverBackend>) -> Result<Moved, String> {
    Ok(load(loader)?.commit(loader))
}

/// [`restore`] without its commit: every evicted handle re-created, mapped and loaded, but
/// still counted evicted with its saved bytes kept until [`PendingHandles::commit`];
/// dropping the [`PendingHandles`] unmaps and releases the new handles again, every
/// handle evicted as before. A restore from an image commits only once the image's digest
/// matched.
pub fn load(loader: &mut dyn Staging<DriverBackend>) -> Result<PendingHandles, String> {
    let t = TABLE.lock();
    // Imports come back from their exporters' new descriptors ([`shared::reimport`]).
    let ids: Vec<u64> = t
        .handles
        .iter()
        .filter(|(_, h)| h.real.is_none() && h.pinned != Some(IMPORTED))
        .map(|(&v, _)| v)
        .collect();
    load_handles(t, &ids, loader, false)
}

/// Re-creates, maps and loads the evicted handles `ids`; with `keep_unreleased`, a handle
/// the program had released is not released again yet (its exporter exports it first).
/// All or nothing: a failure leaves every one of them evicted.
fn restore_handles(
    t: &mut Table,
    ids: &[u64],
    loader: &mut dyn Staging<DriverBackend>,
    keep_unreleased: bool,
) -> Result<Moved, String> {
    let made = remake(t, ids, loader)?;
    Ok(commit_made(t, made, loader, keep_unreleased))
}

/// [`restore_handles`] holding the table until the commit.
fn load_handles(
    mut t: parking_lot::MutexGuard<'static, Table>,
    ids: &[u64],
    loader: &mut dyn Staging<DriverBackend>,
    keep_unreleased: bool,
) -> Result<PendingHandles, String> {
    let made = remake(&mut t, ids, loader)?;
    Ok(PendingHandles {
        table: t,
        made,
        keep_unreleased,
    })
}

/// Evicted handles re-created, mapped and loaded, not yet committed ([`load`]): dropped,
/// they are undone and stay evicted.
#[must_use = "dropping pending handles rolls their load back"]
pub struct PendingHandles {
    table: parking_lot::MutexGuard<'static, Table>,
    made: Vec<(i32, Vec<Remade>)>,
    keep_unreleased: bool,
}

impl PendingHandles {
    /// Handles and bytes loaded.
    pub fn moved(&self) -> Moved {
        let mut m = Moved::default();
        for r in self.made.iter().flat_map(|(_, made)| made) {
            m.handles += 1;
            m.bytes += self.table.handles[&r.v].size;
        }
        m
    }

    /// The handles loaded are the program's again: their saved bytes go (host copies to
    /// `loader`'s recycling). Cannot fail.
    pub fn commit(mut self, loader: &mut dyn Staging<DriverBackend>) -> Moved {
        let made = std::mem::take(&mut self.made);
        let keep = self.keep_unreleased;
        commit_made(&mut self.table, made, loader, keep)
    }
}

impl Drop for PendingHandles {
    fn drop(&mut self) {
        for (dev, made) in std::mem::take(&mut self.made) {
            unmake(dev, made);
        }
    }
}

/// Device by device ([`remake_device`]): the handles made and mapped in a few growing
/// groups, each group's bytes loaded in one staging call while the next group is made
/// (not a wait per handle: PyTorch's expandable segments are hundreds of handles). A
/// failure undoes every device's handles (they stay evicted).
fn remake(
    t: &mut Table,
    ids: &[u64],
    loader: &mut dyn Staging<DriverBackend>,
) -> Result<Vec<(i32, Vec<Remade>)>, String> {
    let mut by_device: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    for &v in ids {
        by_device
            .entry(t.handles[&v].device.unwrap_or(0))
            .or_default()
            .push(v);
    }
    let mut done: Vec<(i32, Vec<Remade>)> = Vec::new();
    for (dev, vs) in by_device {
        match remake_device(t, dev, &vs, loader) {
            Ok(made) => done.push((dev, made)),
            Err(e) => {
                for (dev, made) in done {
                    unmake(dev, made);
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// A handle made again and mapped, its bytes not yet loaded.
struct Remade {
    v: u64,
    real: u64,
    mapped: Vec<(u64, u64)>,
    charged: u64,
}

/// Undoes `made` (unmapped, released, uncharged): they stay evicted.
fn unmake(dev: i32, made: Vec<Remade>) {
    for r in made {
        for (va, size) in r.mapped {
            let _ = real_unmap(va, size);
        }
        let _ = real_release(r.real);
        if r.charged > 0 {
            memory::uncharge(dev, r.charged);
        }
    }
}

/// What re-making one evicted handle takes, read from the table once (the threads that
/// make handles share it).
struct Want {
    v: u64,
    size: u64,
    prop: [u8; PROP_BYTES],
    maps: Vec<(u64, Mapping)>,
}

/// Makes and maps the handles `wants` of device `dev` on the calling thread (the device's
/// context current), without access (set for all of them at once after), into `made`:
/// the first failure (where it stopped).
fn make_some(dev: i32, wants: &[Want], made: &mut Vec<Remade>) -> Option<String> {
    for w in wants {
        let mut charged = 0;
        if let Ok(b) = memory::budget(dev) {
            if let Err(e) = b.try_acquire(w.size) {
                return Some(format!("driver handle {:#x} ({} bytes): {e}", w.v, w.size));
            }
            charged = w.size;
        }
        let r = match real_create(w.size, &w.prop) {
            Ok(r) => r,
            Err(rc) => {
                if charged > 0 {
                    memory::uncharge(dev, charged);
                }
                return Some(format!(
                    "re-creating driver handle {:#x} ({} bytes): CUresult {rc}",
                    w.v, w.size
                ));
            }
        };
        let mut mapped = Vec::new();
        let fail = map_only(&w.maps, r, &mut mapped).err();
        made.push(Remade {
            v: w.v,
            real: r,
            mapped,
            charged,
        });
        if fail.is_some() {
            return fail;
        }
    }
    None
}

/// Maps handle `r` at each of `maps` (no access set: [`set_access_runs`]).
fn map_only(maps: &[(u64, Mapping)], r: u64, mapped: &mut Vec<(u64, u64)>) -> Result<(), String> {
    for (va, m) in maps {
        let rc = real_map(*va, m.size, m.offset, r);
        if rc != CU_SUCCESS {
            return Err(format!(
                "mapping {} bytes at {va:#x}: CUresult {rc}",
                m.size
            ));
        }
        mapped.push((*va, m.size));
    }
    Ok(())
}

/// Runs of `entries` (address, bytes, descriptors) in order: each run joins entries that
/// follow one another in memory with the same descriptors, as the range of their indices.
fn joined_runs(entries: &[(u64, u64, Vec<u8>)]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, (a, _, d)) in entries.iter().enumerate() {
        match runs.last_mut() {
            Some(r)
                if {
                    let (pa, pn, pd) = &entries[r.end - 1];
                    pa.checked_add(*pn) == Some(*a) && pd == d
                } =>
            {
                r.end = i + 1
            }
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// Applies `set` to each run of `entries` that follow one another in memory with the same
/// descriptors ([`joined_runs`]) in one call; a run whose call fails, entry by entry, so
/// that a failure names the entry.
fn set_in_runs(
    entries: &[(u64, u64, Vec<u8>)],
    set: impl Fn(u64, u64, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    for run in joined_runs(entries) {
        let (a, _, d) = &entries[run.start];
        let (la, ln, _) = &entries[run.end - 1];
        if run.len() > 1 && set(*a, la + ln - a, d).is_ok() {
            continue;
        }
        for (pa, pn, pd) in &entries[run] {
            set(*pa, *pn, pd)?;
        }
    }
    Ok(())
}

/// Sets the program's access on the handles `wants` mapped again, in the program's order,
/// then grants the peers that reach device `dev`'s memory theirs ([`grant_peers`]): one
/// call per run of entries that follow one another in memory with the same settings
/// (PyTorch's expandable segments map hundreds of handles end to end, each with the same
/// access).
fn set_access_runs(wants: &[Want], dev: i32) -> Result<(), String> {
    let maps = || wants.iter().flat_map(|w| &w.maps);
    let program: Vec<(u64, u64, Vec<u8>)> =
        maps().flat_map(|(_, m)| m.access.iter().cloned()).collect();
    set_in_runs(&program, set_access_again)?;
    let spans: Vec<(u64, u64, Vec<u8>)> = maps().map(|(va, m)| (*va, m.size, Vec::new())).collect();
    set_in_runs(&spans, |va, size, _| grant_peers(va, size, dev))
}

/// The groups `n` handles are re-made and loaded in ([`remake_device`]): the first a
/// 32nd of them (at least one), each next one four times the one before, the last what is
/// left. Making a handle costs about 80 µs on an H200 (`cuMemCreate`, `cuMemMap`, its share
/// of `cuMemSetAccess`), loading PyTorch's 20 MiB segment about 450 µs: a group is made
/// well within the time the one before takes to load.
fn remake_groups(n: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut at, mut size) = (0, n.div_ceil(32).max(1));
    while at < n {
        let end = (at + size).min(n);
        groups.push(at..end);
        at = end;
        size = size.saturating_mul(4);
    }
    groups
}

/// Makes and maps the handles `wants` of device `dev` into `made`, and sets their access:
/// the first failure. A panic is a failure too, `made` holding what was made before it
/// (for the caller to undo).
fn make_group(dev: i32, wants: &[Want], made: &mut Vec<Remade>) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        make_some(dev, wants, made).or_else(|| set_access_runs(wants, dev).err())
    }))
    .unwrap_or_else(|_| Some("making driver handles panicked".into()))
}

/// Makes, maps and loads the handles `vs` of device `dev` (undone on failure), in groups
/// ([`remake_groups`]): a helper thread makes each group while the one before loads, so
/// that only the first, small, group's making comes before the copies (PyTorch's
/// expandable segments are hundreds of handles: made one after the other first, they
/// added a fifth to a resume of 5.9 GB on an H200).
fn remake_device(
    t: &mut Table,
    dev: i32,
    vs: &[u64],
    loader: &mut dyn Staging<DriverBackend>,
) -> Result<Vec<Remade>, String> {
    let m = memory::device_without_runtime(dev).map_err(|e| format!("device {dev}: error {e}"))?;
    let backend = m.vmm.backend();
    backend.make_current().map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let wants: Vec<Want> = vs
        .iter()
        .map(|&v| {
            let h = &t.handles[&v];
            Want {
                v,
                size: h.size,
                prop: h.prop,
                maps: mappings_of(t, v),
            }
        })
        .collect();
    let groups = remake_groups(wants.len());
    let mut made: Vec<Remade> = Vec::with_capacity(wants.len());
    let mut failed = make_group(
        dev,
        &wants[groups.first().cloned().unwrap_or(0..0)],
        &mut made,
    );
    let before_copies = started.elapsed();
    let t = &*t;
    for (g, group) in groups.iter().enumerate() {
        if failed.is_some() {
            break;
        }
        let next = groups.get(g + 1).map(|r| &wants[r.clone()]);
        let (loaded, next_made) = std::thread::scope(|s| {
            let helper = next.map(|w| {
                s.spawn(move || {
                    let mut part = Vec::with_capacity(w.len());
                    let fail = match backend.make_current() {
                        Ok(()) => make_group(dev, w, &mut part),
                        Err(e) => Some(e.to_string()),
                    };
                    (part, fail)
                })
            });
            let ranges: Vec<LoadRange<'_>> = made[group.clone()]
                .iter()
                .flat_map(|r| t.handles[&r.v].saved.iter())
                .map(|s| LoadRange {
                    id: AllocationId(s.id),
                    addr: s.addr,
                    len: s.len,
                    source: match &s.bytes {
                        Held::Memory(b) => Source::Memory(b),
                        Held::Arena => Source::Retained,
                        Held::Image => Source::File { offset: 0 },
                    },
                })
                .collect();
            let loaded = loader.load(backend, &ranges);
            let next_made = helper.map(|h| {
                h.join().unwrap_or_else(|_| {
                    (
                        Vec::new(),
                        Some("the thread making handles panicked".into()),
                    )
                })
            });
            (loaded, next_made)
        });
        if let Some((part, fail)) = next_made {
            made.extend(part);
            failed = failed.or(fail);
        }
        if let Err(e) = loaded {
            failed = Some(format!(
                "copying {} driver handles of device {dev} back: {e}",
                wants.len()
            ));
        }
    }
    if let Some(f) = failed {
        unmake(dev, made);
        return Err(f);
    }
    log::info(format_args!(
        "device {dev}: {} driver handles made and loaded in {:.1} ms, {} groups, the first made in {:.1} ms",
        made.len(),
        started.elapsed().as_secs_f64() * 1e3,
        groups.len(),
        before_copies.as_secs_f64() * 1e3
    ));
    Ok(made)
}

/// The handles `made` (loaded) are the program's again.
fn commit_made(
    t: &mut Table,
    made: Vec<(i32, Vec<Remade>)>,
    loader: &mut dyn Staging<DriverBackend>,
    keep_unreleased: bool,
) -> Moved {
    let mut moved = Moved::default();
    let mut copies = Vec::new();
    for r in made.into_iter().flat_map(|(_, made)| made) {
        let h = t.handles.get_mut(&r.v).expect("live");
        // Their host copies go back to the staging, for the next pause's bytes; their
        // places in the host arena are free (the loader read them, or the image).
        forget_in_arena(h.device, &h.saved);
        copies.extend(h.saved.drain(..).filter_map(|s| match s.bytes {
            Held::Memory(b) => Some(b),
            _ => None,
        }));
        h.real = Some(r.real);
        h.charged = r.charged;
        // An export stays unreleased until exported again (its importers need it).
        if h.refs == 0 && !keep_unreleased && h.pinned != Some(EXPORTED) {
            // The program released it while mapped: the driver frees it at its last unmap.
            let _ = real_release(r.real);
            h.real_released = true;
        } else {
            h.real_released = false;
        }
        moved.handles += 1;
        moved.bytes += h.size;
    }
    loader.recycle(copies);
    moved
}

// After `call!`, which it uses.
pub mod shared;

#[cfg(test)]
mod tests {
    use super::*;

    /// A live handle of `size` bytes on `device`, as cuMemCreate makes one.
    fn handle(device: Option<i32>, size: u64) -> Handle {
        Handle {
            real: Some(7),
            size,
            prop: [0; PROP_BYTES],
            device,
            charged: 0,
            refs: 1,
            real_released: false,
            pinned: None,
            saved: Vec::new(),
            share: shared::Share::default(),
        }
    }

    #[test]
    fn handles_are_remade_in_groups_growing_fourfold_covering_each_once() {
        assert!(remake_groups(0).is_empty());
        assert_eq!(remake_groups(1), vec![0..1]);
        assert_eq!(remake_groups(5), vec![0..1, 1..5]);
        // PyTorch's 283 handles of 5.9 GB: 9 made before any copy.
        assert_eq!(remake_groups(283), vec![0..9, 9..45, 45..189, 189..283]);
        for n in 0..2000 {
            let g = remake_groups(n);
            let mut at = 0;
            for r in &g {
                assert_eq!(r.start, at);
                assert!(r.end > r.start);
                at = r.end;
            }
            assert_eq!(at, n);
        }
    }

    #[test]
    fn access_runs_join_neighbours_with_the_same_settings_in_order() {
        let (rw, ro) = (vec![1u8], vec![2u8]);
        let e = |a: u64, n: u64, d: &Vec<u8>| (a, n, d.clone());
        // Three handles end to end, a gap, one more; then another setting; then one that
        // follows the last but goes back in the program's order.
        let list = vec![
            e(0, 10, &rw),
            e(10, 10, &rw),
            e(20, 5, &rw),
            e(30, 5, &rw),
            e(35, 5, &ro),
            e(40, 5, &ro),
            e(0, 5, &ro),
        ];
        assert_eq!(joined_runs(&list), vec![0..3, 3..4, 4..6, 6..7]);
        assert!(joined_runs(&[]).is_empty());
        // An address at the end of the address space joins nothing.
        assert_eq!(
            joined_runs(&[e(u64::MAX - 1, 1, &rw), e(0, 1, &rw)]),
            vec![0..1, 1..2]
        );
    }

    #[test]
    fn device_of_reads_the_location() {
        let mut p = [0u8; PROP_BYTES];
        p[8..12].copy_from_slice(&LOCATION_DEVICE.to_ne_bytes());
        p[12..16].copy_from_slice(&3i32.to_ne_bytes());
        assert_eq!(device_of(&p), Some(3));
        p[8..12].copy_from_slice(&2u32.to_ne_bytes());
        assert_eq!(device_of(&p), None);
    }

    #[test]
    fn access_descriptors_say_who_may_access() {
        let mut descs = access_desc(0, PROT_READWRITE).to_vec();
        descs.extend_from_slice(&access_desc(2, PROT_NONE));
        assert!(grants(&descs, 0));
        assert!(!grants(&descs, 1));
        assert!(!grants(&descs, 2), "PROT_NONE grants nothing");
        descs.extend_from_slice(&access_desc(1, PROT_READWRITE));
        assert!(grants(&descs, 1));
    }

    #[test]
    fn range_ids_never_meet_the_vmms_ids_nor_each_other() {
        let mut seen = std::collections::HashSet::new();
        for n in [1u64, 2, 3, 1000, (1 << 48) - 1] {
            for i in 0..16 {
                let id = range_id(TAG | n, i).expect("an id");
                assert!(is_range_id(id) && id >= TAG, "{id:#x}");
                assert!(seen.insert(id), "{id:#x} twice");
            }
            assert_eq!(
                range_id(TAG | n, 0),
                Some(TAG | n),
                "the handle itself first"
            );
            assert_eq!(range_id(TAG | n, 16), None, "past 16 ranges");
        }
        // A counter that reached the range bits, or no virtual handle: no id.
        assert_eq!(range_id(TAG | (1 << 48), 0), None);
        assert_eq!(range_id(7, 0), None);
        // The VMM numbers its allocations from 0 up: far below any range id.
        for id in [0u64, 1, 1 << 40, 1 << 62, TAG - 1] {
            assert!(!is_range_id(id), "{id:#x}");
        }
    }

    #[test]
    fn copies_go_to_host_memory_or_the_arena_under_a_range_id_only() {
        let r = |id| {
            (
                StagingRange {
                    id: AllocationId(id),
                    addr: 0x1000,
                    len: 4,
                },
                TAG | 1,
                id,
            )
        };
        let ranges = [r(TAG | 1), r(0)];
        let held = held_copies(
            &ranges,
            vec![HostCopy::Retained, HostCopy::Memory(vec![1, 2, 3, 4])],
        )
        .unwrap();
        assert!(matches!(held[0], Held::Arena));
        assert!(matches!(&held[1], Held::Memory(b) if b == &[1, 2, 3, 4]));
        // A range with no id of its own cannot be in the arena; a file is no place; the
        // count must match.
        let e = held_copies(&ranges, vec![HostCopy::Retained, HostCopy::Retained]).unwrap_err();
        assert!(e.contains("under no id of the range's"), "{e}");
        let e = held_copies(&ranges[..1], vec![HostCopy::File { offset: 0 }]).unwrap_err();
        assert!(e.contains("went to a file"), "{e}");
        let e = held_copies(&ranges, vec![HostCopy::Retained]).unwrap_err();
        assert!(
            e.contains("returned 1 copies of driver handles' ranges, expected 2"),
            "{e}"
        );
    }

    #[test]
    fn the_arena_demand_counts_each_mapped_span_once_per_device() {
        let mut t = Table::default();
        let m = |handle, offset, size| Mapping {
            size,
            offset,
            handle,
            access: Vec::new(),
        };
        t.handles.insert(TAG | 1, handle(Some(0), 4 << 20));
        t.handles.insert(TAG | 2, handle(Some(1), 2 << 20));
        t.handles.insert(TAG | 3, handle(None, 2 << 20));
        t.handles.insert(TAG | 4, handle(Some(0), 5000));
        // Handle 1 in two halves, the first mapped twice (one span, saved once).
        t.mappings.insert(0x1000_0000, m(TAG | 1, 0, 2 << 20));
        t.mappings.insert(0x2000_0000, m(TAG | 1, 2 << 20, 2 << 20));
        t.mappings.insert(0x3000_0000, m(TAG | 1, 0, 2 << 20));
        t.mappings.insert(0x4000_0000, m(TAG | 2, 0, 2 << 20));
        t.mappings.insert(0x5000_0000, m(TAG | 3, 0, 2 << 20));
        t.mappings.insert(0x6000_0000, m(TAG | 4, 0, 5000));
        // Handle 5 mapped over half its size: a pause leaves it on the device, so it takes
        // no arena place.
        t.handles.insert(TAG | 5, handle(Some(0), 4 << 20));
        t.mappings.insert(0x7000_0000, m(TAG | 5, 0, 2 << 20));
        assert_eq!(demand_of(&t, 0), (4 << 20) + 8192, "rounded to ARENA_ALIGN");
        assert_eq!(demand_of(&t, 1), 2 << 20);
        assert_eq!(demand_of(&t, 2), 0);
    }

    #[test]
    fn partly_mapped_handles_are_not_evictable() {
        let mut t = Table::default();
        let h = handle(Some(0), 4 << 20);
        t.handles.insert(TAG | 1, h);
        let m = |offset| Mapping {
            size: 2 << 20,
            offset,
            handle: TAG | 1,
            access: Vec::new(),
        };
        t.mappings.insert(0x1000_0000, m(0));
        assert!(evictable(&t, TAG | 1).is_err());
        t.mappings.insert(0x2000_0000, m(2 << 20));
        assert!(evictable(&t, TAG | 1).is_ok());
        assert_eq!(ranges_of(&t, TAG | 1).len(), 2);
    }
}
