//! [`Fatbin`]: the lazy index over every entry of an input, with a per-SM kernel cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;

use crate::container::{parse_containers, Compression, Container, Entry, EntryKind};
use crate::error::{Error, Result};
use crate::raw::{detect_image_kind, ImageKind};
use crate::select::select_entry;
use crate::{cubin, ptx, KernelInfo};

/// What [`Fatbin::parse`] found the input to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// A host ELF file; containers come from its `.nv_fatbin` / `__nv_relfatbin` sections.
    HostElf,
    /// One or several concatenated fatbin containers.
    Containers,
    /// A bare cubin (listed as one ELF entry in one pseudo-container).
    Cubin,
    /// Bare PTX text (listed as one PTX entry in one pseudo-container).
    Ptx,
}

/// Kernels the driver would load on one SM, indexed incrementally: entries are decompressed
/// in input order only as far as a lookup needs.
#[derive(Debug, Default)]
struct SmIndex {
    /// The entry chosen from each container (indices into `Fatbin::entries`).
    chosen: Vec<usize>,
    /// How many of `chosen` have been decompressed and indexed.
    scanned: usize,
    kernels: Vec<Arc<KernelInfo>>,
    by_name: HashMap<String, usize>,
    /// The first entry that failed to decompress or parse, if any.
    first_error: Option<Error>,
}

type SmSlot = Arc<Mutex<Option<SmIndex>>>;

/// An indexed input: containers and entry headers, read without decompressing anything.
///
/// Kernel layouts are parsed on first request and cached per SM; `Fatbin` is `Send + Sync`.
#[derive(Debug)]
pub struct Fatbin<'a> {
    kind: InputKind,
    containers: Vec<Container>,
    entries: Vec<Entry<'a>>,
    by_sm: Mutex<HashMap<u32, SmSlot>>,
}

impl<'a> Fatbin<'a> {
    /// Indexes any input: a host ELF file, concatenated fatbin containers, a cubin or PTX
    /// text (see [`InputKind`]). Reads headers only.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        match detect_image_kind(data) {
            Some(ImageKind::Fatbin) => Self::from_containers(data),
            Some(ImageKind::HostElf) => Self::from_host_elf(data),
            Some(ImageKind::Cubin) => Self::from_cubin(data),
            Some(ImageKind::Ptx) => Self::from_ptx(data),
            Some(ImageKind::Wrapper) | None => Err(Error::UnknownFormat {
                prefix: data.iter().take(8).copied().collect(),
            }),
        }
    }

    /// Indexes one or several concatenated containers (zero padding between them allowed).
    pub fn from_containers(data: &'a [u8]) -> Result<Self> {
        let mut containers = Vec::new();
        let mut entries = Vec::new();
        parse_containers(data, 0, false, &mut containers, &mut entries)?;
        Ok(Self::new(InputKind::Containers, containers, entries))
    }

    /// Indexes the `.nv_fatbin` and `__nv_relfatbin` sections of a host ELF64 little-endian
    /// file (executable, shared library or `-rdc` object). Offsets are file offsets.
    pub fn from_host_elf(data: &'a [u8]) -> Result<Self> {
        let mut containers = Vec::new();
        let mut entries = Vec::new();
        for section in fatbin_sections(data)? {
            let bytes = usize::try_from(section.offset)
                .ok()
                .zip(usize::try_from(section.size).ok())
                .and_then(|(start, len)| data.get(start..start.checked_add(len)?))
                .ok_or_else(|| Error::Elf {
                    offset: 0,
                    reason: "Invalid ELF section size or offset".into(),
                })?;
            parse_containers(
                bytes,
                section.offset,
                section.relocatable,
                &mut containers,
                &mut entries,
            )?;
        }
        Ok(Self::new(InputKind::HostElf, containers, entries))
    }

    /// Indexes a bare cubin as one ELF entry (SM from its `e_flags`).
    pub fn from_cubin(data: &'a [u8]) -> Result<Self> {
        let sm = cubin::parse_cubin(data)?.sm.unwrap_or(0);
        Ok(Self::single(InputKind::Cubin, EntryKind::Elf, sm, data))
    }

    /// Indexes bare PTX text as one PTX entry (SM from its `.target`).
    pub fn from_ptx(data: &'a [u8]) -> Result<Self> {
        let sm = ptx::parse_ptx(data)?.target_sm.unwrap_or(0);
        Ok(Self::single(InputKind::Ptx, EntryKind::Ptx, sm, data))
    }

    fn single(kind: InputKind, entry_kind: EntryKind, sm: u32, data: &'a [u8]) -> Self {
        let (container, entry) = single(entry_kind, sm, data);
        Self::new(kind, vec![container], vec![entry])
    }

    fn new(kind: InputKind, containers: Vec<Container>, entries: Vec<Entry<'a>>) -> Self {
        Fatbin {
            kind,
            containers,
            entries,
            by_sm: Mutex::new(HashMap::new()),
        }
    }

    /// What the input was.
    pub fn input_kind(&self) -> InputKind {
        self.kind
    }

    /// Every container, in input order.
    pub fn containers(&self) -> &[Container] {
        &self.containers
    }

    /// Every entry of every container, in input order.
    pub fn entries(&self) -> &[Entry<'a>] {
        &self.entries
    }

    /// The entries the driver can load: every entry, except that relocatable containers
    /// (`__nv_relfatbin`, device code kept for nvlink) are left out when the input also has
    /// ordinary ones — as in an `-rdc` executable, where the linked image is what runs (and
    /// what `cuobjdump -elf` lists).
    pub fn loadable_entries(&self) -> Vec<&Entry<'a>> {
        loadable_indices(&self.containers)
            .filter_map(|i| self.entries.get(i))
            .collect()
    }

    /// The entries of one container.
    pub fn container_entries(&self, container: usize) -> &[Entry<'a>] {
        self.containers
            .get(container)
            .and_then(|c| self.entries.get(c.entries.clone()))
            .unwrap_or_default()
    }

    /// For a device of SM `sm`: the entry the driver would run from each container (at most
    /// one per container, containers without a usable entry skipped). Relocatable containers
    /// (`__nv_relfatbin`) count only when the input has no other container, as in an `-rdc`
    /// object: in a linked program the driver loads the linked image.
    pub fn select(&self, sm: u32) -> Vec<&Entry<'a>> {
        self.select_indices(sm)
            .into_iter()
            .filter_map(|i| self.entries.get(i))
            .collect()
    }

    /// [`Fatbin::select`] as indices into [`Fatbin::entries`].
    fn select_indices(&self, sm: u32) -> Vec<usize> {
        select_indices(&self.containers, &self.entries, sm)
    }

    fn sm_slot(&self, sm: u32) -> SmSlot {
        let mut map = self.by_sm.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(sm).or_default())
    }

    /// Runs `f` on the SM's index (created on first use) under its lock; other SMs are not
    /// held up.
    fn with_index<R>(&self, sm: u32, f: impl FnOnce(&Self, &mut SmIndex) -> R) -> R {
        let slot = self.sm_slot(sm);
        let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
        let index = guard.get_or_insert_with(|| SmIndex {
            chosen: self.select_indices(sm),
            ..SmIndex::default()
        });
        f(self, index)
    }

    /// Decompresses and indexes the next chosen entry; `false` when all are done.
    fn scan_one(&self, index: &mut SmIndex) -> bool {
        let Some(&i) = index.chosen.get(index.scanned) else {
            return false;
        };
        index.scanned += 1;
        let Some(entry) = self.entries.get(i) else {
            return true;
        };
        match entry.kernels() {
            Ok(kernels) => {
                for k in kernels {
                    if !index.by_name.contains_key(&k.name) {
                        index.by_name.insert(k.name.clone(), index.kernels.len());
                        index.kernels.push(Arc::new(k));
                    }
                }
            }
            Err(e) => {
                index.first_error.get_or_insert(e);
            }
        }
        true
    }

    /// The layout of kernel `name` (mangled) as the driver would load it on SM `sm`, parsed
    /// on first request and cached. The chosen entries are decompressed in input order only
    /// until the name is found (all of them for a name that is absent); later requests are a
    /// hash lookup. `Ok(None)` if no chosen image has it; an error only if it was not found
    /// and some chosen entry failed to decompress or parse.
    pub fn kernel(&self, name: &str, sm: u32) -> Result<Option<Arc<KernelInfo>>> {
        self.with_index(sm, |this, index| loop {
            if let Some(&i) = index.by_name.get(name) {
                return Ok(index.kernels.get(i).cloned());
            }
            if !this.scan_one(index) {
                return match &index.first_error {
                    Some(e) => Err(e.clone()),
                    None => Ok(None),
                };
            }
        })
    }

    /// Every kernel the driver would load on SM `sm` (first occurrence of each name), in
    /// input order, decompressing every chosen entry not yet indexed. Fails if any chosen
    /// entry failed to decompress or parse.
    pub fn kernels_for_sm(&self, sm: u32) -> Result<Vec<Arc<KernelInfo>>> {
        self.with_index(sm, |this, index| {
            while this.scan_one(index) {}
            match &index.first_error {
                Some(e) => Err(e.clone()),
                None => Ok(index.kernels.clone()),
            }
        })
    }
}

/// The one pseudo-container and entry of a bare cubin or PTX text.
pub(crate) fn single(entry_kind: EntryKind, sm: u32, data: &[u8]) -> (Container, Entry<'_>) {
    let entry = Entry {
        container: 0,
        offset: 0,
        kind: entry_kind,
        header_size: 0,
        sm,
        flags: 0,
        version: (0, 0),
        identifier: None,
        compression: Compression::None,
        compressed_size: 0,
        uncompressed_size: 0,
        raw_payload: data,
    };
    let container = Container {
        offset: 0,
        len: data.len() as u64,
        version: 0,
        relocatable: false,
        entries: 0..1,
    };
    (container, entry)
}

/// Indices of the entries the driver can load (see [`Fatbin::loadable_entries`]).
pub(crate) fn loadable_indices(containers: &[Container]) -> impl Iterator<Item = usize> + '_ {
    let only_relocatable = containers.iter().all(|c| c.relocatable);
    containers
        .iter()
        .filter(move |c| only_relocatable || !c.relocatable)
        .flat_map(|c| c.entries.clone())
}

/// Indices of the entries the driver runs on SM `sm` (see [`Fatbin::select`]).
pub(crate) fn select_indices(
    containers: &[Container],
    entries: &[Entry<'_>],
    sm: u32,
) -> Vec<usize> {
    let only_relocatable = containers.iter().all(|c| c.relocatable);
    containers
        .iter()
        .filter(|c| only_relocatable || !c.relocatable)
        .filter_map(|c| {
            let entries = entries.get(c.entries.clone())?;
            select_entry(entries, sm).map(|i| c.entries.start + i)
        })
        .collect()
}

/// A `.nv_fatbin` or `__nv_relfatbin` section of a host ELF file.
pub(crate) struct FatbinSection {
    /// Its file offset.
    pub offset: u64,
    /// Its size in the file.
    pub size: u64,
    /// `__nv_relfatbin`.
    pub relocatable: bool,
}

/// The non-empty fatbin sections of a host ELF64 little-endian file, in section order;
/// [`Error::NoFatbin`] if it has none. Reads the ELF header, the section headers and the
/// section names only (through `data`, a slice or a [`object::ReadCache`]).
pub(crate) fn fatbin_sections<'d, R: object::ReadRef<'d>>(data: R) -> Result<Vec<FatbinSection>> {
    let elf_err = |e: object::read::Error| Error::Elf {
        offset: 0,
        reason: e.to_string(),
    };
    let header = FileHeader64::<LittleEndian>::parse(data).map_err(elf_err)?;
    let endian = header.endian().map_err(elf_err)?;
    let sections = header.sections(endian, data).map_err(elf_err)?;
    let mut found = Vec::new();
    let mut any = false;
    for section in sections.iter() {
        let relocatable = match sections.section_name(endian, section) {
            Ok(b".nv_fatbin") => false,
            Ok(b"__nv_relfatbin") => true,
            _ => continue,
        };
        // SHT_NOBITS holds no bytes: empty, as `SectionHeader::data` reads it.
        let Some((offset, size)) = section.file_range(endian) else {
            continue;
        };
        if size == 0 {
            continue;
        }
        any = true;
        found.push(FatbinSection {
            offset,
            size,
            relocatable,
        });
    }
    if !any {
        return Err(Error::NoFatbin);
    }
    Ok(found)
}
