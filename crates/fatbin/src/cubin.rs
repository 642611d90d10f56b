//! Cubin ELF: kernels and their `.nv.info.<kernel>` attributes (FATBIN.md §4).

/// Maps keyed by section and symbol names: PyTorch's cubins hash half a million names of
/// about 250 bytes, where SipHash cost a third of the parsing.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use object::elf::{FileHeader64, SHT_NOBITS, SHT_SYMTAB, STT_FUNC};
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::LittleEndian;

use crate::error::{Error, Result};
use crate::{KernelInfo, ParamInfo, Source};

/// `e_machine` of a cubin.
pub const EM_CUDA: u16 = 190;
/// `st_other` bit that marks a kernel entry symbol (cuobjdump prints `ENTRY`).
pub const STO_CUDA_ENTRY: u8 = 0x10;

/// `.nv.info` attribute codes this parser reads.
pub mod eiattr {
    /// `EIATTR_MAX_THREADS` (`__launch_bounds__` / `.maxntid`): three u32.
    pub const MAX_THREADS: u8 = 0x05;
    /// `EIATTR_PARAM_CBANK`: u32 symbol, u16 offset, u16 size.
    pub const PARAM_CBANK: u8 = 0x0a;
    /// `EIATTR_REQNTID` (`.reqntid`): three u32.
    pub const REQNTID: u8 = 0x10;
    /// `EIATTR_FRAME_SIZE`: u32 symbol, u32 bytes (in `.nv.info`).
    pub const FRAME_SIZE: u8 = 0x11;
    /// `EIATTR_KPARAM_INFO`: one parameter, 12 bytes.
    pub const KPARAM_INFO: u8 = 0x17;
    /// `EIATTR_CBANK_PARAM_SIZE`: total parameter bytes (u16).
    pub const CBANK_PARAM_SIZE: u8 = 0x19;
    /// `EIATTR_MAXREG_COUNT`: u16.
    pub const MAXREG_COUNT: u8 = 0x1b;
    /// `EIATTR_REGCOUNT`: u32 symbol, u32 registers (in `.nv.info`).
    pub const REGCOUNT: u8 = 0x2f;
    /// `EIATTR_KPARAM_INFO_V2`: one (possibly large) parameter, 12 bytes.
    pub const KPARAM_INFO_V2: u8 = 0x45;
}

/// Which cubin ELF flavour (where the SM sits in `e_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CubinFlavour {
    /// CUDA 13 (OSABI 0x41): SM in `e_flags` bits 8–15.
    V2,
    /// CUDA ≤ 12 (OSABI 0x33): SM in `e_flags` bits 0–7.
    Legacy,
    /// Any other OSABI byte; the SM is not known.
    Unknown(u8),
}

/// What a cubin holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cubin {
    /// The flavour (OSABI).
    pub flavour: CubinFlavour,
    /// SM from `e_flags`, when the flavour says where it is.
    pub sm: Option<u32>,
    /// `e_type`: 1 relocatable (`-rdc` objects), 2 executable.
    pub elf_type: u16,
    /// Every kernel (entry function), in symbol-table order, each with [`KernelInfo::sm`] set
    /// from `e_flags` and [`KernelInfo::source`] = [`Source::Elf`].
    pub kernels: Vec<KernelInfo>,
}

fn elf_err(reason: impl std::fmt::Display) -> Error {
    Error::Elf {
        offset: 0,
        reason: reason.to_string(),
    }
}

/// Parses a cubin ELF image.
pub fn parse_cubin(data: &[u8]) -> Result<Cubin> {
    let header = FileHeader64::<LittleEndian>::parse(data).map_err(elf_err)?;
    let endian = header.endian().map_err(elf_err)?;
    let machine = header.e_machine(endian).0;
    if machine != EM_CUDA {
        return Err(Error::InvalidField {
            field: "e_machine",
            offset: 0x12,
            found: machine.into(),
            expected: "190 (EM_CUDA)",
        });
    }
    let flags = header.e_flags(endian).0;
    let osabi = header.e_ident.os_abi.0;
    let (flavour, sm) = match osabi {
        0x41 => (CubinFlavour::V2, Some((flags >> 8) & 0xff)),
        0x33 => (CubinFlavour::Legacy, Some(flags & 0xff)),
        other => (CubinFlavour::Unknown(other), None),
    };
    let sections = header.sections(endian, data).map_err(elf_err)?;

    // Name-suffix → section index, for the per-kernel sections.
    let mut info: HashMap<&[u8], usize> = HashMap::default();
    let mut text: HashMap<&[u8], usize> = HashMap::default();
    let mut shared: HashMap<&[u8], usize> = HashMap::default();
    let mut global_info: Option<&[u8]> = None;
    for (index, section) in sections.iter().enumerate() {
        let Ok(name) = sections.section_name(endian, section) else {
            continue;
        };
        if let Some(k) = name.strip_prefix(b".nv.info.") {
            info.insert(k, index);
        } else if name == b".nv.info" {
            global_info = section.data(endian, data).ok();
        } else if let Some(k) = name.strip_prefix(b".text.") {
            text.insert(k, index);
        } else if let Some(k) = name.strip_prefix(b".nv.shared.") {
            shared.insert(k, index);
        }
    }

    // Kernels: FUNC symbols marked ENTRY; their symbol indices key the global `.nv.info`.
    let mut names: Vec<(&[u8], Option<usize>)> = Vec::new();
    let mut by_symbol: HashMap<usize, usize> = HashMap::default();
    let symbols = sections
        .symbols(endian, data, SHT_SYMTAB)
        .map_err(elf_err)?;
    for (sym_index, sym) in symbols.symbols().iter().enumerate() {
        if sym.st_type() != STT_FUNC || sym.st_other().0 & STO_CUDA_ENTRY == 0 {
            continue;
        }
        let Ok(name) = symbols.symbol_name(endian, sym) else {
            continue;
        };
        by_symbol.insert(sym_index, names.len());
        names.push((name, Some(sym_index)));
    }
    if symbols.is_empty() {
        // No symbol table: every `.text.X` with a `.nv.info.X` is a kernel.
        let mut found: Vec<&[u8]> = info
            .keys()
            .filter(|k| text.contains_key(*k))
            .copied()
            .collect();
        found.sort_unstable();
        names.extend(found.into_iter().map(|n| (n, None)));
    }

    let mut kernels: Vec<KernelInfo> = names
        .iter()
        .map(|(name, _)| KernelInfo {
            name: String::from_utf8_lossy(name).into_owned(),
            sm,
            source: Source::Elf,
            ..KernelInfo::default()
        })
        .collect();

    // Module-wide attributes keyed by symbol index.
    if let Some(global) = global_info {
        for rec in Records::new(global) {
            let rec = rec?;
            let (Some(sym), Some(value)) = (rec.u32_at(0), rec.u32_at(4)) else {
                continue;
            };
            let Some(&k) = by_symbol.get(&(sym as usize)) else {
                continue;
            };
            match rec.attr {
                eiattr::REGCOUNT => kernels[k].registers = kernels[k].registers.or(Some(value)),
                eiattr::FRAME_SIZE => kernels[k].frame_size = Some(value),
                _ => {}
            }
        }
    }

    for (k, (name, _)) in kernels.iter_mut().zip(&names) {
        if let Some(&t) = text.get(name) {
            if let Ok(section) = sections.section(object::SectionIndex(t)) {
                let regs = section.sh_info(endian) >> 24;
                if regs != 0 {
                    k.registers = Some(regs);
                }
            }
        }
        if let Some(&s) = shared.get(name) {
            if let Ok(section) = sections.section(object::SectionIndex(s)) {
                if section.sh_type(endian) == SHT_NOBITS {
                    k.shared_bytes = Some(section.sh_size(endian));
                }
            }
        }
        if let Some(&i) = info.get(name) {
            let section = sections.section(object::SectionIndex(i)).map_err(elf_err)?;
            let bytes = section.data(endian, data).map_err(elf_err)?;
            apply_kernel_info(k, bytes)?;
        }
    }
    Ok(Cubin {
        flavour,
        sm,
        elf_type: header.e_type(endian).0,
        kernels,
    })
}

/// Fills `k` from the records of its `.nv.info.<kernel>` section.
fn apply_kernel_info(k: &mut KernelInfo, bytes: &[u8]) -> Result<()> {
    let mut cbank_size = None;
    for rec in Records::new(bytes) {
        let rec = rec?;
        match rec.attr {
            eiattr::KPARAM_INFO | eiattr::KPARAM_INFO_V2 => {
                let (Some(ordinal), Some(offset), Some(word)) =
                    (rec.u16_at(4), rec.u16_at(6), rec.u32_at(8))
                else {
                    return Err(Error::InvalidField {
                        field: "KPARAM_INFO record length",
                        offset: rec.offset as u64,
                        found: rec.payload.len() as u64,
                        expected: "12 bytes",
                    });
                };
                // V1: size in bits 18–31. V2 (observed: an 8000-byte struct gives 0x1f40 in
                // the low half): size in bits 0–15.
                let size = if rec.attr == eiattr::KPARAM_INFO {
                    word >> 18
                } else {
                    word & 0xffff
                };
                k.params.push(ParamInfo {
                    ordinal: ordinal.into(),
                    offset: offset.into(),
                    size,
                });
            }
            eiattr::CBANK_PARAM_SIZE => k.param_bytes = rec.value.into(),
            eiattr::PARAM_CBANK => {
                if let (Some(off), Some(size)) = (rec.u16_at(4), rec.u16_at(6)) {
                    k.param_cbank_offset = Some(off.into());
                    cbank_size = Some(u32::from(size));
                }
            }
            eiattr::MAX_THREADS => k.max_threads = rec.dim3(),
            eiattr::REQNTID => k.reqntid = rec.dim3(),
            eiattr::MAXREG_COUNT => k.max_registers = Some(rec.value.into()),
            _ => {}
        }
    }
    k.params.sort_unstable_by_key(|p| p.ordinal);
    if k.param_bytes == 0 {
        k.param_bytes = cbank_size.unwrap_or_else(|| {
            k.params
                .iter()
                .map(|p| p.offset.saturating_add(p.size))
                .max()
                .unwrap_or(0)
        });
    }
    Ok(())
}

/// One `.nv.info` record.
struct Record<'a> {
    offset: usize,
    attr: u8,
    /// The u16 after the attribute (the value for BVAL/HVAL; the length for SVAL).
    value: u16,
    /// SVAL payload (empty otherwise).
    payload: &'a [u8],
}

impl Record<'_> {
    fn u16_at(&self, at: usize) -> Option<u16> {
        self.payload
            .get(at..)?
            .first_chunk()
            .map(|b| u16::from_le_bytes(*b))
    }
    fn u32_at(&self, at: usize) -> Option<u32> {
        self.payload
            .get(at..)?
            .first_chunk()
            .map(|b| u32::from_le_bytes(*b))
    }
    fn dim3(&self) -> Option<[u32; 3]> {
        Some([self.u32_at(0)?, self.u32_at(4)?, self.u32_at(8)?])
    }
}

/// Iterator over `.nv.info` records; yields an error (once) on a malformed record.
struct Records<'a> {
    data: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Records<'a> {
    fn new(data: &'a [u8]) -> Self {
        Records {
            data,
            pos: 0,
            failed: false,
        }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.data.len() {
            return None;
        }
        let at = self.pos;
        let rest = &self.data[at..];
        let Some(head) = rest.first_chunk::<4>() else {
            self.failed = true;
            return Some(Err(Error::Truncated {
                what: ".nv.info record",
                offset: at as u64,
                needed: 4,
                available: rest.len() as u64,
            }));
        };
        let (format, attr, value) = (head[0], head[1], u16::from_le_bytes([head[2], head[3]]));
        let payload: &[u8] = match format {
            1..=3 => &[],
            4 => match rest.get(4..4 + usize::from(value)) {
                Some(p) => p,
                None => {
                    self.failed = true;
                    return Some(Err(Error::Truncated {
                        what: ".nv.info SVAL record",
                        offset: at as u64,
                        needed: 4 + u64::from(value),
                        available: rest.len() as u64,
                    }));
                }
            },
            other => {
                self.failed = true;
                return Some(Err(Error::InvalidField {
                    field: ".nv.info record format",
                    offset: at as u64,
                    found: other.into(),
                    expected: "1 (NVAL), 2 (BVAL), 3 (HVAL) or 4 (SVAL)",
                }));
            }
        };
        self.pos = at + 4 + payload.len();
        Some(Ok(Record {
            offset: at,
            attr,
            value,
            payload,
        }))
    }
}
