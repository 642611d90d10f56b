//! The driver shim's side of tracing and counting, as plain functions (the driver shim,
//! `crates/driver-shim`, keeps only the FFI edge: reading a launch's argument memory,
//! calling the runtime shim's tracing table):
//!
//! - which argument words of a launch go to the memory history: read through the
//!   kernel's parameter layout (`fatbin`, a full scan that teaches the kernel's pointer
//!   sites), or at the learned sites only;
//! - the per-thread table of launched handles (a hash table with linear probing), by
//!   which a launch finds its kernel's counter without a lock;
//! - the texts the driver shim hands out: its launch counts, a kernel's parameter layout,
//!   and the `CUDAW_KERNEL_COUNTS` file.
//!
//! The caller supplies each parameter's bytes; nothing here reads memory it is not given.

use fatbin::sites::{self, PointerSites, Site};
use fatbin::{KernelInfo, ParamInfo};
use parking_lot::Mutex;

/// The 8-byte words of a launch's arguments that may point into `span` (`lo..hi`), read
/// through the kernel's `layout`: `bytes(p)` gives parameter `p`'s bytes (`None`: not at
/// hand), `push(param, value)` takes each word found, in order. The sites of the words
/// found teach `sites` (the kernel's, when a sampled launch is scanned).
pub fn pointer_words<'a>(
    layout: &KernelInfo,
    bytes: impl FnMut(&ParamInfo) -> Option<&'a [u8]>,
    span: (u64, u64),
    sites: Option<&Mutex<PointerSites>>,
    mut push: impl FnMut(u16, u64),
) {
    if span.0 >= span.1 {
        return;
    }
    let mut hits = Vec::new();
    sites::scan(layout, bytes, span, &mut hits, |param, v| {
        push(param as u16, v)
    });
    if let Some(s) = sites {
        s.lock().learn(&hits);
    }
}

/// [`pointer_words`] from the words at the kernel's learned `sites` only (a few loads, no
/// layout): `word(site)` gives the word there. The bytes read, or `None` when the sites
/// are not ready (nothing learned, too many, or busy on another thread): scan instead.
pub fn site_words(
    sites: &Mutex<PointerSites>,
    word: impl FnMut(&Site) -> Option<u64>,
    span: (u64, u64),
    mut push: impl FnMut(u16, u64),
) -> Option<u64> {
    let sites = sites.try_lock().filter(|s| s.ready())?;
    if span.0 >= span.1 {
        return Some(8 * sites.sites().len() as u64);
    }
    Some(sites.read(span, word, |param, v| push(param as u16, v)))
}

/// Bits of a slot index in a thread's table of launched handles.
pub const SLOT_BITS: u32 = 10;
/// Slots in each thread's table of launched handles.
pub const SLOTS: usize = 1 << SLOT_BITS;
/// Slots a handle may take, from its home slot on (linear probing), before it evicts the
/// handle at home: handles launched in turn keep their slots (and their counts, which
/// number a handle's launches for the sampling) while the table has room.
pub const PROBES: usize = 8;

/// The home slot of `handle` (function handles are heap addresses, often a fixed stride
/// apart: a multiplicative hash spreads them).
#[inline(always)]
pub fn home(handle: usize) -> usize {
    ((handle as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as usize
}

/// Where `handle` is in a table of [`SLOTS`] whose slot `i` holds the handle `held(i)` (0:
/// empty): `Ok(i)`, or `Err(i)`, the slot to give it: the first empty one of its
/// [`PROBES`] from home, else home. Slots are only emptied all at once, so a handle sits
/// before the first empty slot of its run.
#[inline]
pub fn probe(handle: usize, held: impl Fn(usize) -> usize) -> Result<usize, usize> {
    let home = home(handle);
    for j in 0..PROBES {
        let i = (home + j) & (SLOTS - 1);
        match held(i) {
            h if h == handle => return Ok(i),
            0 => return Err(i),
            _ => {}
        }
    }
    Err(home)
}

/// `s` as a JSON string.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `{"name":...,"param_bytes":N,"params":[{"ordinal":..,"offset":..,"size":..},...]}`.
pub fn layout_json(k: &KernelInfo) -> String {
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| {
            format!(
                "{{\"ordinal\":{},\"offset\":{},\"size\":{}}}",
                p.ordinal, p.offset, p.size
            )
        })
        .collect();
    format!(
        "{{\"name\":{},\"param_bytes\":{},\"params\":[{}]}}",
        json_string(&k.name),
        k.param_bytes,
        params.join(",")
    )
}

/// `{"kernels":{"NAME":LAUNCHES,...},"graph_launches":N,"modules_loaded":N}`, with the
/// kernels of `counts` launched at least once, in its order.
pub fn counts_json(counts: &[(String, u64)], graph_launches: u64, modules_loaded: u64) -> String {
    let kernels: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{}:{n}", json_string(name)))
        .collect();
    format!(
        "{{\"kernels\":{{{}}},\"graph_launches\":{graph_launches},\"modules_loaded\":{modules_loaded}}}",
        kernels.join(",")
    )
}

/// The `CUDAW_KERNEL_COUNTS` file: one `LAUNCHES<TAB>NAME` line per kernel of `launched`
/// (in its order), then `# graph launches N` and `# modules loaded N`.
pub fn counts_file(launched: &[(String, u64)], graph_launches: u64, modules_loaded: u64) -> String {
    let mut text = String::new();
    for (name, n) in launched {
        text.push_str(&format!("{n}\t{name}\n"));
    }
    text.push_str(&format!("# graph launches {graph_launches}\n"));
    text.push_str(&format!("# modules loaded {modules_loaded}\n"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(params: &[(u32, u32, u32)]) -> KernelInfo {
        KernelInfo::with_params(params)
    }

    /// The words [`pointer_words`] reads from a parameter block laid out in `block`.
    fn words(
        layout: &KernelInfo,
        block: &[u8],
        span: (u64, u64),
        sites: Option<&Mutex<PointerSites>>,
    ) -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        let bytes = |p: &ParamInfo| block.get(p.offset as usize..(p.offset + p.size) as usize);
        pointer_words(layout, bytes, span, sites, |p, v| out.push((p, v)));
        out
    }

    fn block(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn pointer_words_are_the_words_in_the_span_with_their_parameter() {
        let all = (1, u64::MAX);
        // A pointer, an int and a float: only the pointer's word.
        let mut b = block(&[0x7f00_1000, 0]);
        b[8..12].copy_from_slice(&1024i32.to_le_bytes());
        b[12..16].copy_from_slice(&2.0f32.to_le_bytes());
        let scale = layout(&[(0, 0, 8), (1, 8, 4), (2, 12, 4)]);
        assert_eq!(words(&scale, &b, all, None), [(0, 0x7f00_1000)]);
        // Outside the span of the live allocations: not handed over.
        assert!(words(&scale, &b, (0x7f00_2000, 0x7f00_3000), None).is_empty());
        assert!(words(&scale, &b, (5, 5), None).is_empty(), "an empty span");
        // A 16-byte struct at offset 8 gives two words.
        let two = layout(&[(0, 0, 8), (1, 8, 16)]);
        let b = block(&[0xaaaa, 0xbbbb, 0xcccc]);
        assert_eq!(
            words(&two, &b, all, None),
            [(0, 0xaaaa), (1, 0xbbbb), (1, 0xcccc)]
        );
        assert_eq!(words(&two, &b, (0xbbbb, 0xcccc), None), [(1, 0xbbbb)]);
        // A parameter whose bytes are not at hand is skipped.
        assert_eq!(words(&two, &b[..8], all, None), [(0, 0xaaaa)]);
    }

    /// A scanned launch teaches the kernel's sites; a later launch's words are then read
    /// at those sites only, in the span.
    #[test]
    fn site_words_read_what_a_scan_learned() {
        let sites = Mutex::new(PointerSites::new());
        let word = |b: &[u8], s: &Site| {
            let at = (s.offset + s.at) as usize;
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let read = |b: &[u8], span| {
            let mut out = Vec::new();
            let n = site_words(&sites, |s| word(b, s), span, |p, v| out.push((p, v)));
            n.map(|n| (n, out))
        };
        let scale = layout(&[(0, 0, 8), (1, 8, 4), (2, 16, 16)]);
        let b = block(&[0x7f00_1000, 1024, 0x7f00_2000, 9]);
        assert_eq!(read(&b, (1, u64::MAX)), None, "nothing learned: scan");
        let span = (0x7f00_0000, 0x7f01_0000);
        assert_eq!(
            words(&scale, &b, span, Some(&sites)),
            [(0, 0x7f00_1000), (2, 0x7f00_2000)]
        );
        // Other values, read at the same sites only: a pointer now in the struct's second
        // word, never seen there by a scan, is not read; a word outside the span is left.
        let b = block(&[0x7f00_3000, 1024, 0x10, 0x7f00_4000]);
        assert_eq!(read(&b, span), Some((16, vec![(0, 0x7f00_3000)])));
        assert_eq!(read(&b, (2, 1)), Some((16, vec![])), "an empty span");
    }

    /// A handle is found in its run of slots, before the first empty one.
    #[test]
    fn probing_finds_a_handle_in_its_run() {
        let mut table = vec![0usize; SLOTS];
        let hs: Vec<usize> = (0x10_0000..)
            .step_by(64)
            .filter(|&h| home(h) == home(0x10_0000))
            .take(PROBES + 1)
            .collect();
        for (n, &h) in hs[..PROBES].iter().enumerate() {
            let i = probe(h, |i| table[i]).unwrap_err();
            assert_eq!(i, (home(h) + n) % SLOTS, "the first empty slot of the run");
            table[i] = h;
            assert_eq!(probe(h, |i| table[i]), Ok(i));
        }
        assert_eq!(probe(hs[PROBES], |i| table[i]), Err(home(hs[PROBES])));
        // A handle of another home whose run meets this one's skips the taken slots.
        let next = (0x20_0000..)
            .step_by(64)
            .find(|&h| home(h) == (home(0x10_0000) + 2) % SLOTS)
            .unwrap();
        assert_eq!(
            probe(next, |i| table[i]),
            Err((home(0x10_0000) + PROBES) % SLOTS)
        );
    }

    #[test]
    fn texts_escape_names_and_keep_their_shape() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        let counts = [("_Z1kv".to_owned(), 3), ("_Z4idlev".to_owned(), 0)];
        assert_eq!(
            counts_json(&counts, 2, 1),
            "{\"kernels\":{\"_Z1kv\":3},\"graph_launches\":2,\"modules_loaded\":1}"
        );
        assert_eq!(
            counts_file(&counts[..1], 2, 1),
            "3\t_Z1kv\n# graph launches 2\n# modules loaded 1\n"
        );
        let mut k = layout(&[(0, 0, 8), (1, 8, 4)]);
        k.name = "_Z1kPfi".into();
        k.param_bytes = 12;
        assert_eq!(
            layout_json(&k),
            "{\"name\":\"_Z1kPfi\",\"param_bytes\":12,\"params\":[\
             {\"ordinal\":0,\"offset\":0,\"size\":8},{\"ordinal\":1,\"offset\":8,\"size\":4}]}"
        );
    }
}
