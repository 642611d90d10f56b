//! Device memory over host memory: reservations are real inaccessible address ranges,
//! physical memory lives in one shared memory file, mappings map pieces of that file at
//! reserved addresses. Touching memory that is not mapped with access faults, as on a GPU.
//!
//! [`Memory`] is plain state behind the machine's memory lock; it validates every argument
//! the way the driver does and returns the driver's error codes.
//!
//! Several devices share one address space (unified addressing), as on a GPU machine:
//! reservations belong to no device, physical memory (and a `cuMemAlloc` allocation)
//! belongs to one and counts against its capacity. Who may touch what is decided per
//! device: a mapping carries an access right for each device (`cuMemSetAccess`), and a
//! `cuMemAlloc` allocation is reachable from its own device and from devices that enabled
//! peer access to it ([`Memory::enable_peer`]). The host protection of a range is the widest
//! right any device has, so host code and copies fault where no device may go.
//!
//! Memory shared between processes (what NCCL does between the ranks of a job): a
//! `cuMemCreate` whose requested handle types include `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`
//! gets a memory file of its own instead of a piece of the common one ([`Memory::export_fd`],
//! [`Memory::import_fd`]). The file holds the allocation's bytes, then one page, the
//! [`Trailer`], that says what the memory is (size, device, properties); mappings cover the
//! bytes only. Its length is sealed, so no process can shrink it under another's mappings.
//! The memory is gone once no process holds a handle, a mapping or a descriptor of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::error::{CuError, CuResult};
use crate::os;

/// The VMM allocation granularity (minimum and recommended), as on an H100.
pub const GRANULARITY: u64 = 2 << 20;
/// The granularity of `cuMemAlloc` allocations.
pub const LINEAR_GRANULARITY: u64 = 64 << 10;
/// The span of the physical memory file's offsets (sparse; only touched pages cost).
const PHYSICAL_SPAN: u64 = 1 << 46;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, as a bit of `requestedHandleTypes`.
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// The bytes of a shareable memory file after the allocation's own: one page.
pub const TRAILER_BYTES: u64 = 4096;

/// What a `cuMemCreate` asked for besides its size and device; kept with the allocation
/// (and in its memory file, for importers) and given back by
/// `cuMemGetAllocationPropertiesFromHandle`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested {
    /// `requestedHandleTypes` (a bit set of `CUmemAllocationHandleType`).
    pub handle_types: u32,
    /// `allocFlags`, byte for byte.
    pub alloc_flags: [u8; 8],
}

/// A physical allocation's properties (`cuMemGetAllocationPropertiesFromHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Properties {
    /// `location.id`: the device ordinal in this process; for imported memory of a device
    /// this process does not see, the ordinal the creating process gave.
    pub ordinal: i32,
    /// What the creator asked for.
    pub requested: Requested,
    /// Its size in bytes.
    pub size: u64,
}

/// The page after a shareable allocation's bytes in its memory file: what an importer
/// needs to know, written once by the creator. Little-endian:
///
/// | bytes | field |
/// | --- | --- |
/// | 0..8 | magic `SIMGPUFD` |
/// | 8..12 | version, 1 |
/// | 12..16 | physical device (`SIMGPU_DEVICES` numbering, whatever the visibility) |
/// | 16..24 | size of the allocation in bytes |
/// | 24..28 | `requestedHandleTypes` |
/// | 28..36 | `allocFlags` |
/// | 36..40 | the creator's device ordinal (`location.id`), signed |
///
/// The rest of the page is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// The physical device the memory lives on.
    pub physical: u32,
    /// The allocation's size.
    pub size: u64,
    /// What the creator asked for.
    pub requested: Requested,
    /// The creator's ordinal of the device.
    pub ordinal: i32,
}

impl Trailer {
    /// `SIMGPUFD`.
    pub const MAGIC: [u8; 8] = *b"SIMGPUFD";
    /// The only version this simgpu reads and writes.
    pub const VERSION: u32 = 1;
    /// The bytes that carry fields.
    pub const USED: usize = 40;

    /// The trailer page.
    pub fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; TRAILER_BYTES as usize];
        page[0..8].copy_from_slice(&Self::MAGIC);
        page[8..12].copy_from_slice(&Self::VERSION.to_le_bytes());
        page[12..16].copy_from_slice(&self.physical.to_le_bytes());
        page[16..24].copy_from_slice(&self.size.to_le_bytes());
        page[24..28].copy_from_slice(&self.requested.handle_types.to_le_bytes());
        page[28..36].copy_from_slice(&self.requested.alloc_flags);
        page[36..40].copy_from_slice(&self.ordinal.to_le_bytes());
        page
    }

    /// Reads the first [`Trailer::USED`] bytes of a trailer page; the error says which
    /// field is wrong, what it holds and what was expected.
    pub fn decode(bytes: &[u8]) -> Result<Trailer, String> {
        if bytes.len() < Self::USED {
            return Err(format!(
                "trailer is {} bytes, expected at least {}",
                bytes.len(),
                Self::USED
            ));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        if bytes[0..8] != Self::MAGIC {
            return Err(format!(
                "magic is {:02x?}, expected \"SIMGPUFD\"",
                &bytes[0..8]
            ));
        }
        let version = u32_at(8);
        if version != Self::VERSION {
            return Err(format!("version is {version}, expected {}", Self::VERSION));
        }
        Ok(Trailer {
            physical: u32_at(12),
            size: u64::from_le_bytes(bytes[16..24].try_into().expect("8")),
            requested: Requested {
                handle_types: u32_at(24),
                alloc_flags: bytes[28..36].try_into().expect("8"),
            },
            ordinal: u32_at(36) as i32,
        })
    }
}

/// Access a mapping allows (`CUmemAccess_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
    None,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
    Read,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
    ReadWrite,
}

impl Access {
    /// From the driver's flag value.
    pub fn from_flags(flags: u32) -> CuResult<Self> {
        match flags {
            0 => Ok(Access::None),
            1 => Ok(Access::Read),
            3 => Ok(Access::ReadWrite),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn prot(self) -> i32 {
        match self {
            Access::None => os::PROT_NONE,
            Access::Read => os::PROT_READ,
            Access::ReadWrite => os::PROT_RW,
        }
    }
}

#[derive(Debug)]
struct Reservation {
    size: u64,
    /// Mappings inside this reservation, by start address.
    mappings: BTreeMap<u64, Mapping>,
}

#[derive(Debug, Clone)]
struct Mapping {
    size: u64,
    handle: u64,
    /// Each device's access, by device.
    access: Vec<Access>,
    /// The mapping of a `cuMemAlloc` allocation (reached by peer access, not by rights).
    linear: bool,
}

/// Who touches device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accessor {
    /// A copy or memset: any device that may touch the memory will do.
    AnyDevice,
    /// A kernel running on this device.
    Device(usize),
}

#[derive(Debug)]
struct Physical {
    /// The device it lives on; `None` for imported memory of a device this process does
    /// not see.
    device: Option<usize>,
    /// Whether it counts against `device`'s memory here (imported memory counts in the
    /// process that created it).
    charged: bool,
    backing: Backing,
    size: u64,
    mappings: u32,
    /// `cuMemRelease` was called; freed when the last mapping goes.
    released: bool,
    requested: Requested,
    /// `location.id` for `cuMemGetAllocationPropertiesFromHandle`.
    ordinal: i32,
}

/// Where a physical allocation's bytes are.
#[derive(Debug)]
enum Backing {
    /// At this offset of the common physical memory file.
    Pool { offset: u64 },
    /// At offset 0 of a memory file of its own, followed by its [`Trailer`].
    Shareable(OwnedFd),
    /// In host memory, off the device: the driver's process checkpoint
    /// ([`Memory::checkpoint`]) moved it there; [`Memory::restore`] brings it back.
    Host(Vec<u8>),
}

/// The simulated device's memory.
#[derive(Debug)]
pub struct Memory {
    /// Each device's memory, and how much of it is in use.
    capacity: Vec<u64>,
    /// Each device's physical device number (`CUDA_VISIBLE_DEVICES` maps ordinals to them).
    physical_ids: Vec<usize>,
    used: Vec<u64>,
    /// Peer access enabled: (accessing device, device whose `cuMemAlloc` memory it reaches).
    peers: BTreeSet<(usize, usize)>,
    file: OwnedFd,
    /// Free ranges of the physical file: offset → length.
    free_offsets: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, Reservation>,
    physicals: HashMap<u64, Physical>,
    next_handle: u64,
    /// `cuMemAlloc` allocations: address → (size, physical handle).
    linear: BTreeMap<u64, (u64, u64)>,
    /// Pinned host memory: address → (size, allocated by us rather than registered).
    host: BTreeMap<u64, (u64, bool)>,
    /// The driver's process checkpoint holds the memory in host memory
    /// ([`Memory::checkpoint`]): the devices it was on.
    checkpointed: Option<Vec<usize>>,
}

/// What [`Memory::checkpoint`] moved to host memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpointed {
    /// Physical allocations moved.
    pub allocations: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The devices (ordinals) whose memory it held.
    pub devices: Vec<usize>,
}

/// The widest of the devices' rights: what host code may do with the range.
fn widest(access: &[Access]) -> Access {
    access.iter().fold(Access::None, |w, &a| match (w, a) {
        (Access::ReadWrite, _) | (_, Access::ReadWrite) => Access::ReadWrite,
        (Access::Read, _) | (_, Access::Read) => Access::Read,
        _ => Access::None,
    })
}

fn round_up(value: u64, to: u64) -> CuResult<u64> {
    value
        .checked_next_multiple_of(to)
        .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
}

fn os_err(e: std::io::Error) -> CuError {
    if e.raw_os_error() == Some(libc::ENOMEM) {
        CuError::CUDA_ERROR_OUT_OF_MEMORY
    } else {
        say!("simgpu: system call failed: {e}");
        CuError::CUDA_ERROR_UNKNOWN
    }
}

impl Memory {
    /// One device with `capacity` bytes of memory.
    pub fn new(capacity: u64) -> CuResult<Self> {
        Self::with_devices(&[capacity])
    }

    /// Devices `0..capacities.len()`, each with its capacity in bytes.
    pub fn with_devices(capacities: &[u64]) -> CuResult<Self> {
        let physical: Vec<usize> = (0..capacities.len()).collect();
        Self::with_physical_devices(capacities, &physical)
    }

    /// Devices `0..capacities.len()`, each with its capacity in bytes; ordinal `i` is
    /// physical device `physical[i]` (what memory shared with other processes records).
    pub fn with_physical_devices(capacities: &[u64], physical: &[usize]) -> CuResult<Self> {
        if physical.len() != capacities.len() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let file = os::memfd("simgpu-device-memory", PHYSICAL_SPAN).map_err(os_err)?;
        Ok(Memory {
            capacity: capacities.to_vec(),
            physical_ids: physical.to_vec(),
            used: vec![0; capacities.len()],
            peers: BTreeSet::new(),
            file,
            free_offsets: BTreeMap::from([(0, PHYSICAL_SPAN)]),
            reservations: BTreeMap::new(),
            physicals: HashMap::new(),
            next_handle: 1,
            linear: BTreeMap::new(),
            host: BTreeMap::new(),
            checkpointed: None,
        })
    }

    /// How many devices there are.
    pub fn devices(&self) -> usize {
        self.capacity.len()
    }

    fn check_device_index(&self, device: usize) -> CuResult<()> {
        if device < self.devices() {
            Ok(())
        } else {
            Err(CuError::CUDA_ERROR_INVALID_DEVICE)
        }
    }

    /// Free and total bytes of `device` (`cuMemGetInfo`).
    pub fn info(&self, device: usize) -> CuResult<(u64, u64)> {
        self.check_device_index(device)?;
        Ok((
            self.capacity[device] - self.used[device],
            self.capacity[device],
        ))
    }

    /// `cuCtxEnablePeerAccess`: `from` may reach `to`'s `cuMemAlloc` memory.
    pub fn enable_peer(&mut self, from: usize, to: usize) -> CuResult<()> {
        self.check_device_index(from)?;
        self.check_device_index(to)?;
        if from == to {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        if !self.peers.insert((from, to)) {
            return Err(CuError::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    }

    /// `cuCtxDisablePeerAccess`.
    pub fn disable_peer(&mut self, from: usize, to: usize) -> CuResult<()> {
        self.check_device_index(from)?;
        self.check_device_index(to)?;
        if from == to {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        if !self.peers.remove(&(from, to)) {
            return Err(CuError::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    }

    /// Whether `from` has peer access to `to` (or is `to`).
    pub fn peer_enabled(&self, from: usize, to: usize) -> bool {
        from == to || self.peers.contains(&(from, to))
    }

    /// `cuMemAddressReserve`: `size` a multiple of the granularity, `alignment` 0 (the
    /// granularity) or a power of two, `hint` an address to try first.
    pub fn reserve(&mut self, size: u64, alignment: u64, hint: u64) -> CuResult<u64> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let align = match alignment {
            0 => GRANULARITY,
            a if a.is_power_of_two() => a.max(GRANULARITY),
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        self.reserve_unchecked(size, align, hint)
    }

    fn reserve_unchecked(&mut self, size: u64, align: u64, hint: u64) -> CuResult<u64> {
        let base = os::reserve(size, align, hint).map_err(os_err)?;
        self.reservations.insert(
            base,
            Reservation {
                size,
                mappings: BTreeMap::new(),
            },
        );
        Ok(base)
    }

    /// `cuMemAddressFree`: the exact range of one reservation with nothing mapped in it.
    pub fn free_reservation(&mut self, base: u64, size: u64) -> CuResult<()> {
        match self.reservations.get(&base) {
            Some(r) if r.size == size && r.mappings.is_empty() => {}
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        self.reservations.remove(&base);
        // SAFETY: the range is a reservation this object made and just forgot; nothing is
        // mapped in it.
        unsafe { os::release(base, size) }.map_err(os_err)
    }

    /// `cuMemCreate` on `device`: `size` a multiple of the granularity. Returns the handle.
    pub fn create(&mut self, device: usize, size: u64) -> CuResult<u64> {
        self.create_requested(device, size, Requested::default())
    }

    /// `cuMemCreate` with what the properties asked for: memory that may be exported as a
    /// file descriptor (`requested.handle_types` has [`HANDLE_TYPE_POSIX_FD`]) gets a
    /// memory file of its own.
    pub fn create_requested(
        &mut self,
        device: usize,
        size: u64,
        requested: Requested,
    ) -> CuResult<u64> {
        self.check_device_index(device)?;
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.create_unchecked(device, size, requested)
    }

    fn create_unchecked(
        &mut self,
        device: usize,
        size: u64,
        requested: Requested,
    ) -> CuResult<u64> {
        if self.used[device]
            .checked_add(size)
            .is_none_or(|u| u > self.capacity[device])
        {
            return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let physical = self.physical_ids[device];
        let backing = if requested.handle_types & HANDLE_TYPE_POSIX_FD != 0 {
            let trailer = Trailer {
                physical: physical as u32,
                size,
                requested,
                ordinal: device as i32,
            };
            let name = format!("simgpu-shareable-dev{physical}");
            Backing::Shareable(os::sealed_memfd(&name, size, &trailer.encode()).map_err(os_err)?)
        } else {
            Backing::Pool {
                offset: self.take_offsets(size)?,
            }
        };
        let handle = self.insert_physical(Physical {
            device: Some(device),
            charged: true,
            backing,
            size,
            mappings: 0,
            released: false,
            requested,
            ordinal: device as i32,
        });
        self.used[device] += size;
        Ok(handle)
    }

    fn insert_physical(&mut self, physical: Physical) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.physicals.insert(handle, physical);
        handle
    }

    /// `cuMemExportToShareableHandle` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: a new
    /// descriptor (close-on-exec) of the allocation's memory file, each call its own, for
    /// the caller to pass on and close. CUDA_ERROR_INVALID_VALUE for a handle that is not
    /// live or was not created with that handle type requested.
    pub fn export_fd(&self, handle: u64) -> CuResult<OwnedFd> {
        match self.physicals.get(&handle) {
            Some(Physical {
                released: false,
                backing: Backing::Shareable(file),
                ..
            }) => os::dup_raw(file.as_raw_fd()).map_err(os_err),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemImportFromShareableHandle` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: a
    /// new handle (each call its own, each to be released) to the memory `fd` refers to,
    /// which another process (or this one) exported. The handle keeps its own descriptor:
    /// the caller may close `fd` afterwards. The memory counts against the device of the
    /// process that created it, not here. CUDA_ERROR_INVALID_VALUE, with the reason on
    /// standard error, when `fd` is not an open descriptor of a simgpu shareable memory file.
    pub fn import_fd(&mut self, fd: i32) -> CuResult<u64> {
        let refuse = |why: String| {
            say!(
                "simgpu: cuMemImportFromShareableHandle: file descriptor {fd} {why}; \
                 returning CUDA_ERROR_INVALID_VALUE"
            );
            CuError::CUDA_ERROR_INVALID_VALUE
        };
        let file = os::dup_raw(fd).map_err(|e| refuse(format!("cannot be used ({e})")))?;
        let len = os::sealed_len(&file)
            .map_err(|e| refuse(format!("cannot be examined ({e})")))?
            .ok_or_else(|| {
                refuse("is not a simgpu shareable memory file (not a sealed memory file)".into())
            })?;
        if len < TRAILER_BYTES + GRANULARITY {
            return Err(refuse(format!(
                "is not a simgpu shareable memory file (length {len} bytes, expected at \
                 least {})",
                TRAILER_BYTES + GRANULARITY
            )));
        }
        let mut bytes = [0u8; Trailer::USED];
        let got = os::read_at(&file, &mut bytes, len - TRAILER_BYTES)
            .map_err(|e| refuse(format!("cannot be read ({e})")))?;
        let trailer = Trailer::decode(&bytes[..got])
            .map_err(|e| refuse(format!("is not a simgpu shareable memory file: {e}")))?;
        if trailer.size.checked_add(TRAILER_BYTES) != Some(len)
            || !trailer.size.is_multiple_of(GRANULARITY)
        {
            return Err(refuse(format!(
                "is not a simgpu shareable memory file: its trailer gives size {} bytes, \
                 expected the file's length {len} less {TRAILER_BYTES}, a multiple of {GRANULARITY}",
                trailer.size
            )));
        }
        let device = self
            .physical_ids
            .iter()
            .position(|&p| p == trailer.physical as usize);
        Ok(self.insert_physical(Physical {
            device,
            charged: false,
            backing: Backing::Shareable(file),
            size: trailer.size,
            mappings: 0,
            released: false,
            requested: trailer.requested,
            ordinal: device.map_or(trailer.ordinal, |d| d as i32),
        }))
    }

    /// `cuMemGetAllocationPropertiesFromHandle` of a live handle (created or imported).
    pub fn properties(&self, handle: u64) -> CuResult<Properties> {
        match self.physicals.get(&handle) {
            Some(p) if !p.released => Ok(Properties {
                ordinal: p.ordinal,
                requested: p.requested,
                size: p.size,
            }),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn take_offsets(&mut self, size: u64) -> CuResult<u64> {
        let (&start, &len) = self
            .free_offsets
            .iter()
            .find(|(_, &len)| len >= size)
            .ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        self.free_offsets.remove(&start);
        if len > size {
            self.free_offsets.insert(start + size, len - size);
        }
        Ok(start)
    }

    fn give_offsets(&mut self, mut start: u64, mut len: u64) {
        if let Err(e) = os::punch_hole(&self.file, start, len) {
            say!("simgpu: could not give physical pages back: {e}");
        }
        if let Some((&prev, &plen)) = self.free_offsets.range(..start).next_back() {
            if prev + plen == start {
                self.free_offsets.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        if let Some(&next_len) = self.free_offsets.get(&(start + len)) {
            self.free_offsets.remove(&(start + len));
            len += next_len;
        }
        self.free_offsets.insert(start, len);
    }

    /// `cuMemRelease`. A handle still mapped is freed when its last mapping goes (as the
    /// driver does: programs release right after mapping).
    pub fn release(&mut self, handle: u64) -> CuResult<()> {
        let physical = match self.physicals.get_mut(&handle) {
            Some(p) if !p.released => p,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        physical.released = true;
        if physical.mappings == 0 {
            self.free_physical(handle);
        }
        Ok(())
    }

    fn free_physical(&mut self, handle: u64) {
        if let Some(p) = self.physicals.remove(&handle) {
            let on_device = !matches!(p.backing, Backing::Host(_));
            if let (true, Some(device), true) = (p.charged, p.device, on_device) {
                self.used[device] -= p.size;
            }
            match p.backing {
                Backing::Pool { offset } => self.give_offsets(offset, p.size),
                // Closing this process's descriptor: the file (and its pages) goes with
                // the last descriptor and mapping of any process.
                Backing::Shareable(file) => drop(file),
                Backing::Host(bytes) => drop(bytes),
            }
        }
    }

    /// The device of a live (not released) physical allocation; CUDA_ERROR_INVALID_DEVICE
    /// for imported memory of a device this process does not see.
    pub fn physical_device(&self, handle: u64) -> CuResult<usize> {
        match self.physicals.get(&handle) {
            Some(p) if !p.released => p.device.ok_or(CuError::CUDA_ERROR_INVALID_DEVICE),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// The size of a live (not released) physical allocation.
    pub fn physical_size(&self, handle: u64) -> CuResult<u64> {
        match self.physicals.get(&handle) {
            Some(p) if !p.released => Ok(p.size),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn reservation_of(&self, addr: u64, size: u64) -> CuResult<u64> {
        let (&base, r) = self
            .reservations
            .range(..=addr)
            .next_back()
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let end = addr
            .checked_add(size)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        if end > base + r.size {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(base)
    }

    /// `cuMemMap`: the whole of `handle` (or its first `size` bytes) at `addr`, inside one
    /// reservation, over nothing already mapped. `offset` must be 0, as in the driver.
    pub fn map(&mut self, addr: u64, size: u64, offset: u64, handle: u64) -> CuResult<()> {
        if offset != 0
            || size == 0
            || !addr.is_multiple_of(GRANULARITY)
            || !size.is_multiple_of(GRANULARITY)
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.map_unchecked(addr, size, handle, false)
    }

    fn map_unchecked(&mut self, addr: u64, size: u64, handle: u64, linear: bool) -> CuResult<()> {
        let physical = match self.physicals.get(&handle) {
            Some(p) if !p.released && size <= p.size => p,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        let (file, file_offset) = match &physical.backing {
            Backing::Pool { offset } => (&self.file, *offset),
            Backing::Shareable(file) => (file, 0),
            Backing::Host(_) => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        let base = self.reservation_of(addr, size)?;
        let reservation = &self.reservations[&base];
        let overlaps_before = reservation
            .mappings
            .range(..addr)
            .next_back()
            .is_some_and(|(&a, m)| a + m.size > addr);
        let overlaps_after = reservation
            .mappings
            .range(addr..addr + size)
            .next()
            .is_some();
        if overlaps_before || overlaps_after {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the range lies inside a reservation this object owns and nothing is
        // mapped there, so no live reference points into it.
        unsafe { os::map_file(addr, size, file, file_offset) }.map_err(os_err)?;
        let reservation = self.reservations.get_mut(&base).expect("found above");
        reservation.mappings.insert(
            addr,
            Mapping {
                size,
                handle,
                access: vec![Access::None; self.capacity.len()],
                linear,
            },
        );
        self.physicals
            .get_mut(&handle)
            .expect("found above")
            .mappings += 1;
        Ok(())
    }

    /// The mappings that exactly tile `[addr, addr + size)`, or INVALID_VALUE.
    fn tiling(&self, addr: u64, size: u64) -> CuResult<(u64, Vec<u64>)> {
        if size == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let base = self.reservation_of(addr, size)?;
        let mut starts = Vec::new();
        let mut at = addr;
        for (&a, m) in self.reservations[&base].mappings.range(addr..addr + size) {
            if a != at {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            starts.push(a);
            at = a + m.size;
        }
        if at != addr + size {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok((base, starts))
    }

    /// `cuMemUnmap`: whole mappings covering exactly `[addr, addr + size)`. Afterwards the
    /// range faults when touched.
    ///
    /// # Safety
    /// No Rust reference may point into the range (device memory is only ever touched
    /// through raw copies, which the caller has finished).
    pub unsafe fn unmap(&mut self, addr: u64, size: u64) -> CuResult<()> {
        let (base, starts) = self.tiling(addr, size)?;
        // SAFETY: the range is inside our reservation and the caller guarantees nothing
        // references it.
        unsafe { os::make_inaccessible(addr, size) }.map_err(os_err)?;
        for start in starts {
            let reservation = self.reservations.get_mut(&base).expect("found by tiling");
            let mapping = reservation
                .mappings
                .remove(&start)
                .expect("found by tiling");
            let physical = self
                .physicals
                .get_mut(&mapping.handle)
                .expect("mapped handle");
            physical.mappings -= 1;
            if physical.released && physical.mappings == 0 {
                self.free_physical(mapping.handle);
            }
        }
        Ok(())
    }

    /// `cuMemSetAccess`: whole mappings covering exactly `[addr, addr + size)`; each
    /// `(device, access)` sets that device's right, the others keep theirs.
    ///
    /// # Safety
    /// When access is reduced, no Rust reference may point into the range.
    pub unsafe fn set_access(
        &mut self,
        addr: u64,
        size: u64,
        rights: &[(usize, Access)],
    ) -> CuResult<()> {
        for &(device, _) in rights {
            self.check_device_index(device)?;
        }
        let (base, starts) = self.tiling(addr, size)?;
        let reservation = self.reservations.get_mut(&base).expect("found by tiling");
        for start in &starts {
            let mapping = reservation
                .mappings
                .get_mut(start)
                .expect("found by tiling");
            for &(device, access) in rights {
                mapping.access[device] = access;
            }
            let widest = widest(&mapping.access);
            // SAFETY: the mapping is ours; the caller guarantees no reference into it is
            // invalidated.
            unsafe { os::protect(*start, mapping.size, widest.prot()) }.map_err(os_err)?;
        }
        Ok(())
    }

    /// `cuMemGetAccess`: `device`'s right on the mapping holding `addr`.
    pub fn access_of(&self, addr: u64, device: usize) -> CuResult<Access> {
        self.check_device_index(device)?;
        let (_, mapping) = self
            .mapping_at(addr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        Ok(mapping.access[device])
    }

    fn mapping_at(&self, addr: u64) -> Option<(u64, &Mapping)> {
        let (&base, r) = self.reservations.range(..=addr).next_back()?;
        if addr >= base + r.size {
            return None;
        }
        let (&a, m) = r.mappings.range(..=addr).next_back()?;
        (addr < a + m.size).then_some((a, m))
    }

    /// The device whose memory holds `addr`: the physical allocation mapped there.
    pub fn device_of(&self, addr: u64) -> Option<usize> {
        let (_, m) = self.mapping_at(addr)?;
        self.physicals.get(&m.handle).and_then(|p| p.device)
    }

    /// Whether `who` may read (or, with `write`, write) `[addr, addr + len)`: mapped
    /// memory the device has the right to (any device's right, for [`Accessor::AnyDevice`]),
    /// `cuMemAlloc` memory of its own device or of one it has peer access to, or pinned
    /// host memory.
    pub fn check_device(&self, addr: u64, len: u64, write: bool) -> CuResult<()> {
        self.check_access(addr, len, write, Accessor::AnyDevice)
    }

    /// [`Memory::check_device`] for `who`.
    pub fn check_access(&self, addr: u64, len: u64, write: bool, who: Accessor) -> CuResult<()> {
        if len == 0 {
            return Ok(());
        }
        let end = addr
            .checked_add(len)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        if self.check_host(addr, len) {
            return Ok(());
        }
        let base = self.reservation_of(addr, len)?;
        let mappings = &self.reservations[&base].mappings;
        let mut at = addr;
        let first = mappings.range(..=addr).next_back();
        let rest = mappings.range(addr + 1..end);
        let permits = |access: Access| match access {
            Access::ReadWrite => true,
            Access::Read => !write,
            Access::None => false,
        };
        for (&a, m) in first.into_iter().chain(rest) {
            let owner = self
                .physicals
                .get(&m.handle)
                .and_then(|p| p.device)
                .unwrap_or(usize::MAX);
            let allowed = match who {
                Accessor::AnyDevice => m.access.iter().any(|&x| permits(x)),
                Accessor::Device(d) if m.linear => {
                    self.peer_enabled(d, owner) && m.access.get(owner).is_some_and(|&x| permits(x))
                }
                Accessor::Device(d) => m.access.get(d).is_some_and(|&x| permits(x)),
            };
            if a > at || a + m.size <= at || !allowed {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            at = a + m.size;
            if at >= end {
                return Ok(());
            }
        }
        Err(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    fn check_host(&self, addr: u64, len: u64) -> bool {
        self.host
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &(size, _))| addr + len <= a + size)
    }

    /// `cuMemAlloc` on `device`: a private reservation, physical allocation and mapping
    /// that `device` (and its peers) may read and write.
    pub fn alloc(&mut self, device: usize, size: u64) -> CuResult<u64> {
        self.check_device_index(device)?;
        if size == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let size = round_up(size, LINEAR_GRANULARITY)?;
        let handle = self.create_unchecked(device, size, Requested::default())?;
        let addr = match self.reserve_unchecked(size, GRANULARITY, 0) {
            Ok(addr) => addr,
            Err(e) => {
                self.free_physical(handle);
                return Err(e);
            }
        };
        let mapped = self.map_unchecked(addr, size, handle, true).and_then(|()| {
            // SAFETY: the mapping was just made; nothing references it.
            unsafe { self.set_access(addr, size, &[(device, Access::ReadWrite)]) }
        });
        if let Err(e) = mapped {
            // SAFETY: the range was just reserved here; nothing references it.
            let _ = unsafe { self.unmap(addr, size) };
            let _ = self.free_reservation(addr, size);
            self.free_physical(handle);
            return Err(e);
        }
        self.physicals
            .get_mut(&handle)
            .expect("created above")
            .released = true;
        self.linear.insert(addr, (size, handle));
        Ok(addr)
    }

    /// `cuMemFree`: an address `alloc` returned.
    ///
    /// # Safety
    /// As [`Memory::unmap`].
    pub unsafe fn free(&mut self, addr: u64) -> CuResult<()> {
        let (size, _) = self
            .linear
            .remove(&addr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.unmap(addr, size) }?;
        self.free_reservation(addr, size)
    }

    /// `cuMemHostAlloc`: page-locked (here: ordinary) host memory the device can reach.
    pub fn host_alloc(&mut self, size: u64) -> CuResult<u64> {
        if size == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let size = round_up(size, 4096)?;
        let addr = os::alloc_rw(size).map_err(os_err)?;
        self.host.insert(addr, (size, true));
        Ok(addr)
    }

    /// `cuMemFreeHost`.
    ///
    /// # Safety
    /// Nothing may reference the memory any more.
    pub unsafe fn host_free(&mut self, addr: u64) -> CuResult<()> {
        match self.host.get(&addr) {
            Some(&(size, true)) => {
                self.host.remove(&addr);
                // SAFETY: our own allocation, unreferenced by the caller's promise.
                unsafe { os::release(addr, size) }.map_err(os_err)
            }
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemHostRegister`: records `[addr, addr + size)` as pinned.
    pub fn host_register(&mut self, addr: u64, size: u64) -> CuResult<()> {
        if addr == 0 || size == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let end = addr
            .checked_add(size)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let overlaps = self
            .host
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &(s, _))| a + s > addr);
        if overlaps {
            return Err(CuError::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.host.insert(addr, (size, false));
        Ok(())
    }

    /// Whether `addr` lies in page-locked host memory (`cuMemHostAlloc`, or a range
    /// registered with `cuMemHostRegister`).
    pub fn is_host(&self, addr: u64) -> bool {
        self.host
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &(s, _))| addr < a + s)
    }

    /// The driver's rule for the host side of a copy (seen on an H200, driver 580): a copy
    /// that starts in page-locked memory (`cuMemHostAlloc`, or a range registered with
    /// `cuMemHostRegister`, to its exact byte length, not rounded to pages) must end
    /// inside the same range, else `CUDA_ERROR_INVALID_VALUE`; one that starts in
    /// pageable memory may end anywhere.
    pub fn check_host_copy(&self, addr: u64, len: u64) -> CuResult<()> {
        let inside = self
            .host
            .range(..=addr)
            .next_back()
            .filter(|(&a, &(s, _))| addr < a + s);
        match inside {
            Some((&a, &(s, _))) if addr.checked_add(len).is_none_or(|end| end > a + s) => {
                Err(CuError::CUDA_ERROR_INVALID_VALUE)
            }
            _ => Ok(()),
        }
    }

    /// `cuMemHostUnregister`.
    pub fn host_unregister(&mut self, addr: u64) -> CuResult<()> {
        match self.host.get(&addr) {
            Some(&(_, false)) => {
                self.host.remove(&addr);
                Ok(())
            }
            _ => Err(CuError::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    /// Bytes of `device`'s memory this process holds now.
    pub fn used(&self, device: usize) -> u64 {
        self.used.get(device).copied().unwrap_or(0)
    }

    /// The physical device ordinal `device` is now.
    pub fn physical_id(&self, device: usize) -> Option<usize> {
        self.physical_ids.get(device).copied()
    }

    /// Whether the driver's process checkpoint holds the memory in host memory.
    pub fn is_checkpointed(&self) -> bool {
        self.checkpointed.is_some()
    }

    /// The driver's process checkpoint (`cuCheckpointProcessCheckpoint`): every physical
    /// allocation's bytes are copied to host memory and its device memory is freed (the
    /// devices' use drops to 0); every mapping becomes inaccessible address space at the
    /// same address, so nothing can read memory that was released. Reservations, handles
    /// and access rights are kept for [`Memory::restore`].
    ///
    /// CUDA_ERROR_NOT_SUPPORTED (said on standard error), nothing changed, when the process
    /// holds memory shared with other processes (exported or imported through a POSIX
    /// descriptor): its other holders would lose it.
    ///
    /// # Safety
    /// No Rust reference may point into device memory (every call of the process is held).
    pub unsafe fn checkpoint(&mut self) -> CuResult<Checkpointed> {
        if self.checkpointed.is_some() {
            return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
        }
        let shared = self
            .physicals
            .values()
            .filter(|p| matches!(p.backing, Backing::Shareable(_)))
            .count();
        if shared > 0 {
            say!(
                "simgpu: cuCheckpointProcessCheckpoint: the process holds {shared} allocations \
                 shared with other processes (POSIX descriptors), which a checkpoint cannot \
                 take; returning CUDA_ERROR_NOT_SUPPORTED"
            );
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        // Read everything first: a failure leaves the memory as it was.
        let mut saved: Vec<(u64, Vec<u8>)> = Vec::new();
        for (&handle, p) in &self.physicals {
            let Backing::Pool { offset } = p.backing else {
                continue;
            };
            let mut bytes = vec![0u8; p.size as usize];
            let got = os::read_at(&self.file, &mut bytes, offset).map_err(os_err)?;
            if got != bytes.len() {
                say!("simgpu: cuCheckpointProcessCheckpoint: short read of the device memory file");
                return Err(CuError::CUDA_ERROR_UNKNOWN);
            }
            saved.push((handle, bytes));
        }
        let mut devices: Vec<usize> = (0..self.devices()).filter(|&d| self.used[d] > 0).collect();
        let mut bytes = 0;
        let allocations = saved.len();
        for reservation in self.reservations.values() {
            for (&addr, m) in &reservation.mappings {
                // SAFETY: the mapping lies in our reservation; the caller holds every call,
                // so nothing references it.
                unsafe { os::make_inaccessible(addr, m.size) }.map_err(os_err)?;
            }
        }
        for (handle, data) in saved {
            let p = self.physicals.get_mut(&handle).expect("read above");
            let Backing::Pool { offset } = p.backing else {
                continue;
            };
            let (size, device) = (p.size, p.device);
            bytes += size;
            p.backing = Backing::Host(data);
            if let Some(d) = device {
                self.used[d] -= size;
            }
            self.give_offsets(offset, size);
        }
        devices.dedup();
        self.checkpointed = Some(devices.clone());
        Ok(Checkpointed {
            allocations,
            bytes,
            devices,
        })
    }

    /// Undoes [`Memory::checkpoint`] (`cuCheckpointProcessRestore`): every allocation comes
    /// back from host memory at its addresses, with its access rights. `remap` lists
    /// `(ordinal, physical device, its capacity)`: device `ordinal` becomes that physical
    /// device (restore onto another GPU) before the memory comes back to it. Checks first
    /// that each device has room (CUDA_ERROR_OUT_OF_MEMORY, nothing changed).
    ///
    /// # Safety
    /// As [`Memory::checkpoint`].
    pub unsafe fn restore(&mut self, remap: &[(usize, usize, u64)]) -> CuResult<Checkpointed> {
        let Some(devices) = self.checkpointed.clone() else {
            return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
        };
        for &(ordinal, _, _) in remap {
            self.check_device_index(ordinal)?;
        }
        let mut capacity = self.capacity.clone();
        for &(ordinal, _, cap) in remap {
            capacity[ordinal] = cap;
        }
        let mut need = vec![0u64; self.devices()];
        for p in self.physicals.values() {
            if let (Backing::Host(_), Some(d)) = (&p.backing, p.device) {
                need[d] += p.size;
            }
        }
        for d in 0..self.devices() {
            if self.used[d] + need[d] > capacity[d] {
                say!(
                    "simgpu: cuCheckpointProcessRestore: device {d} needs {} bytes, has {} \
                     free; returning CUDA_ERROR_OUT_OF_MEMORY",
                    need[d],
                    capacity[d].saturating_sub(self.used[d])
                );
                return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        for &(ordinal, physical, cap) in remap {
            self.physical_ids[ordinal] = physical;
            self.capacity[ordinal] = cap;
        }
        let handles: Vec<u64> = self
            .physicals
            .iter()
            .filter(|(_, p)| matches!(p.backing, Backing::Host(_)))
            .map(|(&h, _)| h)
            .collect();
        let mut bytes = 0;
        for &handle in &handles {
            let size = self.physicals[&handle].size;
            let offset = self.take_offsets(size)?;
            let p = self.physicals.get_mut(&handle).expect("listed above");
            let Backing::Host(data) = std::mem::replace(&mut p.backing, Backing::Pool { offset })
            else {
                unreachable!("listed as host-backed");
            };
            if let Some(d) = p.device {
                self.used[d] += size;
            }
            bytes += size;
            os::write_at(&self.file, &data, offset).map_err(os_err)?;
        }
        let mut remapped = Vec::new();
        for reservation in self.reservations.values() {
            for (&addr, m) in &reservation.mappings {
                remapped.push((addr, m.size, m.handle, widest(&m.access)));
            }
        }
        for (addr, size, handle, access) in remapped {
            let Some(Backing::Pool { offset }) = self.physicals.get(&handle).map(|p| &p.backing)
            else {
                continue;
            };
            // SAFETY: the range is our reservation's, inaccessible since the checkpoint;
            // nothing references it.
            unsafe { os::map_file(addr, size, &self.file, *offset) }.map_err(os_err)?;
            // SAFETY: as above; access only widens.
            unsafe { os::protect(addr, size, access.prot()) }.map_err(os_err)?;
        }
        self.checkpointed = None;
        Ok(Checkpointed {
            allocations: handles.len(),
            bytes,
            devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = GRANULARITY;

    fn write(addr: u64, bytes: &[u8]) {
        // SAFETY: tests write only ranges they mapped read/write.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    }

    fn read(addr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        // SAFETY: tests read only ranges they mapped with access.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), len) };
        out
    }

    #[test]
    fn reserve_create_map_access_round_trip() {
        let mut m = Memory::new(64 * G).unwrap();
        let base = m.reserve(8 * G, 0, 0).unwrap();
        assert_eq!(base % G, 0);
        let h = m.create(0, 2 * G).unwrap();
        assert_eq!(m.info(0).unwrap(), (62 * G, 64 * G));
        m.map(base + G, 2 * G, 0, h).unwrap();
        assert_eq!(
            m.check_device(base + G, 16, false),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );
        // SAFETY: fresh mapping, unreferenced.
        unsafe { m.set_access(base + G, 2 * G, &[(0, Access::ReadWrite)]) }.unwrap();
        m.check_device(base + G, 2 * G, true).unwrap();
        assert!(m.check_device(base, 16, false).is_err());
        write(base + G + 100, b"hello");
        assert_eq!(read(base + G + 100, 5), b"hello");

        // A second mapping of the same physical memory shares the bytes.
        let other = m.reserve(2 * G, 0, 0).unwrap();
        m.map(other, 2 * G, 0, h).unwrap();
        // SAFETY: fresh mapping, unreferenced.
        unsafe { m.set_access(other, 2 * G, &[(0, Access::Read)]) }.unwrap();
        assert_eq!(read(other + 100, 5), b"hello");
        assert!(m.check_device(other, 8, true).is_err());
        m.check_device(other, 8, false).unwrap();

        // Release while mapped defers the free to the last unmap.
        m.release(h).unwrap();
        assert_eq!(m.release(h), Err(CuError::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(m.info(0).unwrap().0, 62 * G);
        // SAFETY: no references into the ranges.
        unsafe {
            m.unmap(other, 2 * G).unwrap();
            m.unmap(base + G, 2 * G).unwrap();
        }
        assert_eq!(m.info(0).unwrap().0, 64 * G);
        m.free_reservation(other, 2 * G).unwrap();
        m.free_reservation(base, 8 * G).unwrap();
    }

    #[test]
    fn validation_uses_driver_codes() {
        let mut m = Memory::new(8 * G).unwrap();
        const INVAL: CuError = CuError::CUDA_ERROR_INVALID_VALUE;
        let inval = Err(INVAL);
        assert_eq!(m.reserve(G + 1, 0, 0), Err(INVAL));
        assert_eq!(m.reserve(G, 3, 0), Err(INVAL));
        assert_eq!(m.create(0, G / 2), Err(INVAL));
        assert_eq!(m.create(0, 10 * G), Err(CuError::CUDA_ERROR_OUT_OF_MEMORY));
        let base = m.reserve(4 * G, 0, 0).unwrap();
        let h = m.create(0, 2 * G).unwrap();
        // Outside the reservation, straddling its end, bad offset, unknown handle.
        assert_eq!(m.map(base + 3 * G, 2 * G, 0, h), inval);
        assert_eq!(m.map(base, 2 * G, G, h), inval);
        assert_eq!(m.map(base, 2 * G, 0, 99), inval);
        assert_eq!(m.map(base, 4 * G, 0, h), inval);
        m.map(base, 2 * G, 0, h).unwrap();
        // Double map over the same range.
        assert_eq!(m.map(base, 2 * G, 0, h), inval);
        assert_eq!(m.map(base + G, 2 * G, 0, h), inval);
        // A reservation with mappings cannot be freed; partial unmap is refused.
        assert_eq!(m.free_reservation(base, 4 * G), inval);
        // SAFETY: no references into the range.
        unsafe {
            assert_eq!(m.unmap(base, G), inval);
            assert_eq!(m.unmap(base + 2 * G, 2 * G), inval);
            m.unmap(base, 2 * G).unwrap();
        }
        m.release(h).unwrap();
        assert_eq!(m.info(0).unwrap().0, 8 * G);
        m.free_reservation(base, 4 * G).unwrap();
        assert_eq!(m.free_reservation(base, 4 * G), inval);
    }

    #[test]
    fn hint_is_honoured_when_free_and_physical_memory_is_reused() {
        let mut m = Memory::new(4 * G).unwrap();
        let a = m.reserve(2 * G, 0, 0).unwrap();
        m.free_reservation(a, 2 * G).unwrap();
        let b = m.reserve(2 * G, 0, a).unwrap();
        assert_eq!(a, b);
        for _ in 0..10 {
            let h = m.create(0, 4 * G).unwrap();
            m.map(b, 2 * G, 0, h).unwrap();
            // SAFETY: fresh mapping.
            unsafe { m.set_access(b, 2 * G, &[(0, Access::ReadWrite)]) }.unwrap();
            write(b, &[7; 64]);
            // SAFETY: no references into the range.
            unsafe { m.unmap(b, 2 * G) }.unwrap();
            m.release(h).unwrap();
        }
        assert_eq!(m.free_offsets.len(), 1);
        m.free_reservation(b, 2 * G).unwrap();
    }

    #[test]
    fn linear_and_host_memory() {
        let mut m = Memory::new(4 * G).unwrap();
        let p = m.alloc(0, 1000).unwrap();
        assert_eq!(m.info(0).unwrap().0, 4 * G - LINEAR_GRANULARITY);
        write(p, b"abc");
        m.check_device(p, 1000, true).unwrap();
        // SAFETY: no references into the allocation.
        unsafe {
            assert_eq!(m.free(p + 1), Err(CuError::CUDA_ERROR_INVALID_VALUE));
            m.free(p).unwrap();
        }
        assert_eq!(m.info(0).unwrap().0, 4 * G);
        assert_eq!(m.alloc(0, 5 * G), Err(CuError::CUDA_ERROR_OUT_OF_MEMORY));

        let h = m.host_alloc(100).unwrap();
        write(h, b"pinned");
        m.check_device(h, 100, true).unwrap();
        let mut buf = vec![0u8; 64];
        let addr = buf.as_mut_ptr() as u64;
        m.host_register(addr, 64).unwrap();
        assert_eq!(
            m.host_register(addr + 8, 8),
            Err(CuError::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        );
        // A copy starting in it must end in it (its exact bytes); one starting before it
        // may run into it (the driver on an H200, `probe`: invalid argument otherwise).
        m.check_host_copy(addr + 8, 56).unwrap();
        assert_eq!(
            m.check_host_copy(addr + 8, 57),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );
        m.check_host_copy(addr - 8, 72).unwrap();
        m.host_unregister(addr).unwrap();
        assert_eq!(
            m.host_unregister(addr),
            Err(CuError::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        );
        // SAFETY: no references into the allocation.
        unsafe { m.host_free(h) }.unwrap();
        buf[0] = 1;
    }

    #[test]
    fn each_device_has_its_memory_and_rights() {
        let mut m = Memory::with_devices(&[8 * G, 4 * G]).unwrap();
        assert_eq!(m.devices(), 2);
        assert_eq!(m.create(2, G), Err(CuError::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(m.info(2), Err(CuError::CUDA_ERROR_INVALID_DEVICE));
        let h1 = m.create(1, 2 * G).unwrap();
        assert_eq!(m.info(0).unwrap(), (8 * G, 8 * G));
        assert_eq!(m.info(1).unwrap(), (2 * G, 4 * G));
        assert_eq!(m.create(1, 4 * G), Err(CuError::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(m.physical_device(h1), Ok(1));

        // VMM memory on device 1, mapped, with access for device 1 only.
        let base = m.reserve(2 * G, 0, 0).unwrap();
        m.map(base, 2 * G, 0, h1).unwrap();
        assert_eq!(m.device_of(base + 5), Some(1));
        // SAFETY: fresh mapping, unreferenced.
        unsafe { m.set_access(base, 2 * G, &[(1, Access::ReadWrite)]) }.unwrap();
        write(base, b"one");
        m.check_access(base, 64, true, Accessor::Device(1)).unwrap();
        m.check_access(base, 64, true, Accessor::AnyDevice).unwrap();
        assert!(m
            .check_access(base, 64, false, Accessor::Device(0))
            .is_err());
        assert_eq!(m.access_of(base, 0), Ok(Access::None));
        // Device 0 gets read access; device 1 keeps its own.
        // SAFETY: access widens.
        unsafe { m.set_access(base, 2 * G, &[(0, Access::Read)]) }.unwrap();
        m.check_access(base, 64, false, Accessor::Device(0))
            .unwrap();
        assert!(m.check_access(base, 64, true, Accessor::Device(0)).is_err());
        assert_eq!(m.access_of(base, 1), Ok(Access::ReadWrite));
        assert_eq!(read(base, 3), b"one");
        // Peer access does not reach VMM memory: only rights do.
        m.enable_peer(0, 1).unwrap();
        assert!(m.check_access(base, 64, true, Accessor::Device(0)).is_err());
        // SAFETY: no references into the range.
        unsafe { m.set_access(base, 2 * G, &[(5, Access::Read)]) }.unwrap_err();
        // SAFETY: no references into the range.
        unsafe { m.unmap(base, 2 * G) }.unwrap();
        m.release(h1).unwrap();
        m.free_reservation(base, 2 * G).unwrap();
        m.disable_peer(0, 1).unwrap();

        // cuMemAlloc memory: its device, and devices with peer access to it.
        let p0 = m.alloc(0, 4096).unwrap();
        assert_eq!(m.device_of(p0), Some(0));
        assert_eq!(m.info(0).unwrap().0, 8 * G - LINEAR_GRANULARITY);
        m.check_access(p0, 4096, true, Accessor::Device(0)).unwrap();
        assert!(m
            .check_access(p0, 4096, false, Accessor::Device(1))
            .is_err());
        m.check_access(p0, 4096, true, Accessor::AnyDevice).unwrap();
        m.enable_peer(1, 0).unwrap();
        m.check_access(p0, 4096, true, Accessor::Device(1)).unwrap();
        // Peer access is one way.
        let p1 = m.alloc(1, 4096).unwrap();
        assert!(m.check_access(p1, 8, false, Accessor::Device(0)).is_err());
        assert_eq!(
            m.enable_peer(1, 0),
            Err(CuError::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        );
        assert_eq!(m.enable_peer(1, 1), Err(CuError::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(m.enable_peer(1, 9), Err(CuError::CUDA_ERROR_INVALID_DEVICE));
        m.disable_peer(1, 0).unwrap();
        assert_eq!(
            m.disable_peer(1, 0),
            Err(CuError::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
        );
        assert!(m.check_access(p0, 8, false, Accessor::Device(1)).is_err());
        // SAFETY: no references into the allocations.
        unsafe {
            m.free(p0).unwrap();
            m.free(p1).unwrap();
        }
        assert_eq!(m.info(0).unwrap().0, 8 * G);
        assert_eq!(m.info(1).unwrap().0, 4 * G);
    }

    const POSIX_FD: Requested = Requested {
        handle_types: HANDLE_TYPE_POSIX_FD,
        alloc_flags: [0, 1, 0, 0, 0, 0, 0, 0],
    };

    /// Whether host code could read the byte at `addr`: `write(2)` of it into a pipe
    /// fails with EFAULT where it is not readable (nothing faults in the test).
    fn readable(addr: u64) -> bool {
        let mut fds = [0; 2];
        // SAFETY: a valid out-array of two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the kernel checks the source address itself and reports EFAULT.
        let n = unsafe { libc::write(fds[1], addr as *const libc::c_void, 1) };
        // SAFETY: our own descriptors, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        n == 1
    }

    /// The (device, inode) of a descriptor.
    fn identity(fd: &OwnedFd) -> (u64, u64) {
        // SAFETY: a valid out-pointer; fstat only fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on an open descriptor.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        (st.st_dev, st.st_ino)
    }

    /// Whether this process still holds the file `(dev, ino)`: a descriptor or a mapping.
    fn still_held(file: (u64, u64)) -> bool {
        let by_fd = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|e| {
                std::fs::metadata(e.path()).is_ok_and(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.dev(), m.ino()) == file
                })
            });
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let by_map = maps.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 5
                && f[4] == file.1.to_string()
                && f.get(5).is_some_and(|n| n.contains("simgpu-shareable"))
        });
        by_fd || by_map
    }

    #[test]
    fn shareable_memory_is_seen_by_an_importer_at_another_address() {
        // Two simulated processes' memories: the exporter sees physical devices 0 and 1, the
        // importer physical device 1 alone (CUDA_VISIBLE_DEVICES=1).
        let mut exporter = Memory::with_devices(&[8 * G, 8 * G]).unwrap();
        let mut importer = Memory::with_physical_devices(&[8 * G], &[1]).unwrap();
        let h = exporter.create_requested(1, 2 * G, POSIX_FD).unwrap();
        assert_eq!(exporter.info(1).unwrap().0, 6 * G);
        let a = exporter.reserve(2 * G, 0, 0).unwrap();
        exporter.map(a, 2 * G, 0, h).unwrap();
        // SAFETY: fresh mapping, unreferenced.
        unsafe { exporter.set_access(a, 2 * G, &[(1, Access::ReadWrite)]) }.unwrap();
        write(a + 10, b"from the exporter");

        // Each export is a new descriptor of the same file.
        let fd1 = exporter.export_fd(h).unwrap();
        let fd2 = exporter.export_fd(h).unwrap();
        assert_ne!(fd1.as_raw_fd(), fd2.as_raw_fd());
        let file = identity(&fd1);
        assert_eq!(identity(&fd2), file);
        drop(fd2);

        let hi = importer.import_fd(fd1.as_raw_fd()).unwrap();
        // The importer's handle is its own; the descriptor can go.
        drop(fd1);
        // Not counted again in the importer.
        assert_eq!(importer.info(0).unwrap().0, 8 * G);
        assert_eq!(importer.physical_device(hi), Ok(0));
        assert_eq!(
            importer.properties(hi).unwrap(),
            Properties {
                ordinal: 0,
                requested: POSIX_FD,
                size: 2 * G
            }
        );
        assert_eq!(
            exporter.properties(h).unwrap(),
            Properties {
                ordinal: 1,
                requested: POSIX_FD,
                size: 2 * G
            }
        );
        let b = importer.reserve(4 * G, 0, 0).unwrap();
        // Mapped at another address, first without access.
        importer.map(b + 2 * G, 2 * G, 0, hi).unwrap();
        assert!(!readable(b + 2 * G));
        // SAFETY: fresh mapping, unreferenced.
        unsafe { importer.set_access(b + 2 * G, 2 * G, &[(0, Access::ReadWrite)]) }.unwrap();
        assert_eq!(read(b + 2 * G + 10, 17), b"from the exporter");
        write(b + 2 * G + 2 * G - 8, b"importer");
        assert_eq!(read(a + 2 * G - 8, 8), b"importer");
        // The trailer is not reachable through a mapping: the handle's size is the bytes.
        assert_eq!(
            importer.map(b, 4 * G, 0, hi),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );

        // The exporter lets go first: the importer keeps the bytes; the exporter's device
        // has its memory back.
        exporter.release(h).unwrap();
        // SAFETY: no references into the range.
        unsafe { exporter.unmap(a, 2 * G) }.unwrap();
        assert!(!readable(a + 10));
        assert_eq!(exporter.info(1).unwrap().0, 8 * G);
        assert_eq!(read(b + 2 * G + 10, 17), b"from the exporter");
        assert!(still_held(file));
        // Then the importer: released while mapped, freed at the unmap, and gone.
        importer.release(hi).unwrap();
        assert_eq!(
            importer.export_fd(hi).map(drop),
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        );
        // SAFETY: no references into the range.
        unsafe { importer.unmap(b + 2 * G, 2 * G) }.unwrap();
        assert!(!readable(b + 2 * G + 10));
        assert!(
            !still_held(file),
            "the memory file outlived every handle and mapping"
        );
        exporter.free_reservation(a, 2 * G).unwrap();
        importer.free_reservation(b, 4 * G).unwrap();
    }

    #[test]
    fn imported_memory_of_a_device_not_seen_keeps_the_creators_ordinal() {
        let mut exporter = Memory::with_physical_devices(&[4 * G], &[0]).unwrap();
        let mut importer = Memory::with_physical_devices(&[4 * G], &[1]).unwrap();
        let h = exporter.create_requested(0, 2 * G, POSIX_FD).unwrap();
        let fd = exporter.export_fd(h).unwrap();
        let hi = importer.import_fd(fd.as_raw_fd()).unwrap();
        // A second import is a second handle.
        let hj = importer.import_fd(fd.as_raw_fd()).unwrap();
        assert_ne!(hi, hj);
        assert_eq!(
            importer.physical_device(hi),
            Err(CuError::CUDA_ERROR_INVALID_DEVICE)
        );
        assert_eq!(importer.properties(hi).unwrap().ordinal, 0);
        // Device 0 of the importer (physical 1) is granted access and reads it.
        let b = importer.reserve(2 * G, 0, 0).unwrap();
        importer.map(b, 2 * G, 0, hi).unwrap();
        // SAFETY: fresh mapping, unreferenced.
        unsafe { importer.set_access(b, 2 * G, &[(0, Access::Read)]) }.unwrap();
        importer
            .check_access(b, 64, false, Accessor::Device(0))
            .unwrap();
        assert_eq!(importer.device_of(b), None);
        assert_eq!(importer.info(0).unwrap().0, 4 * G);
        // SAFETY: no references into the range.
        unsafe { importer.unmap(b, 2 * G) }.unwrap();
        importer.release(hi).unwrap();
        importer.release(hj).unwrap();
        exporter.release(h).unwrap();
        importer.free_reservation(b, 2 * G).unwrap();
    }

    #[test]
    fn export_and_import_refuse_what_the_driver_refuses() {
        const INVAL: CuError = CuError::CUDA_ERROR_INVALID_VALUE;
        let mut m = Memory::new(8 * G).unwrap();
        // Not created with the file-descriptor handle type: not exportable, and the
        // common memory file is not shared.
        let plain = m.create(0, 2 * G).unwrap();
        assert_eq!(m.export_fd(plain).map(drop), Err(INVAL));
        assert_eq!(m.export_fd(999).map(drop), Err(INVAL));
        assert_eq!(m.properties(plain).unwrap().requested, Requested::default());
        let h = m.create_requested(0, 2 * G, POSIX_FD).unwrap();
        assert_eq!(m.info(0).unwrap().0, 4 * G);
        // Not a descriptor; a memory file that is not sealed; one with another magic.
        assert_eq!(m.import_fd(-1), Err(INVAL));
        assert_eq!(m.import_fd(1 << 20), Err(INVAL));
        let unsealed = os::memfd("not-simgpu", 2 * G + TRAILER_BYTES).unwrap();
        assert_eq!(m.import_fd(unsealed.as_raw_fd()), Err(INVAL));
        let mut wrong = Trailer {
            physical: 0,
            size: 2 * G,
            requested: POSIX_FD,
            ordinal: 0,
        }
        .encode();
        wrong[0] = b'X';
        let other = os::sealed_memfd("not-simgpu", 2 * G, &wrong).unwrap();
        assert_eq!(m.import_fd(other.as_raw_fd()), Err(INVAL));
        // A trailer whose size disagrees with the file's length.
        let lying = Trailer {
            physical: 0,
            size: 4 * G,
            requested: POSIX_FD,
            ordinal: 0,
        };
        let liar = os::sealed_memfd("not-simgpu", 2 * G, &lying.encode()).unwrap();
        assert_eq!(m.import_fd(liar.as_raw_fd()), Err(INVAL));
        // Released: nothing to export.
        m.release(h).unwrap();
        m.release(plain).unwrap();
        assert_eq!(m.export_fd(h).map(drop), Err(INVAL));
        assert_eq!(m.properties(h), Err(INVAL));
        assert_eq!(m.info(0).unwrap().0, 8 * G);
    }

    #[test]
    fn trailer_round_trips_and_names_what_is_wrong() {
        let t = Trailer {
            physical: 3,
            size: 6 * G,
            requested: POSIX_FD,
            ordinal: -1,
        };
        let page = t.encode();
        assert_eq!(page.len() as u64, TRAILER_BYTES);
        assert_eq!(&page[..8], b"SIMGPUFD");
        assert_eq!(Trailer::decode(&page), Ok(t));
        let mut v2 = page.clone();
        v2[8] = 2;
        assert_eq!(
            Trailer::decode(&v2),
            Err("version is 2, expected 1".to_owned())
        );
        assert!(Trailer::decode(&page[..10])
            .unwrap_err()
            .contains("expected at least 40"));
    }
}
