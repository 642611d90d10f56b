//! Which entry of a container the driver runs on a device (FATBIN.md §6).

use crate::container::{Entry, EntryKind, FLAG_FAMILY_SPECIFIC};

/// Picks, among one container's entries, the one the driver runs on a device of SM `sm`
/// (e.g. 90): an exact-SM cubin; else the cubin of the same major with the highest lower
/// minor (arch-specific `sm_XXa` cubins only on exactly their SM); else the PTX with the
/// highest SM ≤ `sm` (arch-specific PTX only on exactly its SM, family-specific PTX only
/// within its major). Returns an index into `entries`.
pub fn select_entry(entries: &[Entry<'_>], sm: u32) -> Option<usize> {
    let (major, minor) = (sm / 10, sm % 10);
    let elf = |e: &&Entry<'_>| e.kind == EntryKind::Elf;
    let pos = |e: &Entry<'_>| entries.iter().position(|x| std::ptr::eq(x, e));
    if let Some(e) = entries.iter().filter(elf).find(|e| e.sm == sm) {
        return pos(e);
    }
    if let Some(e) = entries
        .iter()
        .filter(elf)
        .filter(|e| !e.is_arch_specific() && e.sm / 10 == major && e.sm % 10 < minor)
        .rev() // `max_by_key` keeps the last maximum: the first in file order
        .max_by_key(|e| e.sm)
    {
        return pos(e);
    }
    entries
        .iter()
        .filter(|e| e.kind == EntryKind::Ptx && e.sm <= sm)
        .filter(|e| !e.is_arch_specific() || e.sm == sm)
        .filter(|e| e.flags & FLAG_FAMILY_SPECIFIC == 0 || e.sm / 10 == major)
        .rev()
        .max_by_key(|e| e.sm)
        .and_then(pos)
}
