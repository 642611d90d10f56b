//! Where a kernel's launches pass pointers: learned from full scans of some launches'
//! argument words ([`ParamInfo::words_in_range`] over every parameter), so that the other
//! launches read only those words. A tracing layer scans the launches it samples (and any
//! launch it cannot read the short way) and reads the learned sites of the rest: a few
//! words where a scan reads the whole parameter block (hundreds of bytes for most of
//! PyTorch's kernels) through the layout.

use crate::{KernelInfo, ParamInfo};

/// One word a launch passed a pointer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// The parameter's ordinal.
    pub param: u32,
    /// The word's byte offset within the parameter.
    pub at: u32,
    /// The parameter's byte offset in the parameter buffer.
    pub offset: u32,
}

/// The sites a kernel's scanned launches passed pointers in (the union over them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PointerSites {
    sites: Vec<Site>,
    /// At least one launch was scanned.
    learned: bool,
    /// More than [`PointerSites::MAX`] sites: every launch is scanned.
    overflow: bool,
}

impl PointerSites {
    /// The most sites kept: a kernel whose launches pass pointers in more words is scanned
    /// every time. (A multi-tensor kernel's table holds hundreds of words, of which a
    /// launch fills the first few dozen.)
    pub const MAX: usize = 256;

    /// Nothing learned yet.
    pub const fn new() -> PointerSites {
        PointerSites {
            sites: Vec::new(),
            learned: false,
            overflow: false,
        }
    }

    /// Whether reading [`PointerSites::sites`] can stand in for a scan: a launch was
    /// scanned, and its sites fit.
    pub fn ready(&self) -> bool {
        self.learned && !self.overflow
    }

    /// The sites learned, in the order first seen.
    pub fn sites(&self) -> &[Site] {
        &self.sites
    }

    /// Reads a launch's words at the learned sites: `word(site)` gives the word there
    /// (`None`: its parameter is not at hand); calls `f(ordinal, value)` for each in
    /// `lo..hi`. Returns the bytes read (8 a site; none for an empty span).
    pub fn read(
        &self,
        (lo, hi): (u64, u64),
        mut word: impl FnMut(&Site) -> Option<u64>,
        mut f: impl FnMut(u32, u64),
    ) -> u64 {
        if lo >= hi {
            return 0;
        }
        for s in &self.sites {
            if let Some(v) = word(s) {
                if v.wrapping_sub(lo) < hi - lo {
                    f(s.param, v);
                }
            }
        }
        8 * self.sites.len() as u64
    }

    /// Adds the sites of one scanned launch (`hits`, the words it found in range).
    pub fn learn(&mut self, hits: &[Site]) {
        self.learned = true;
        if self.overflow {
            return;
        }
        for h in hits {
            if !self.sites.contains(h) {
                if self.sites.len() == Self::MAX {
                    self.overflow = true;
                    self.sites = Vec::new();
                    return;
                }
                self.sites.push(*h);
            }
        }
    }
}

/// Scans a launch's arguments through `layout`: `bytes(p)` gives parameter `p`'s bytes
/// (`None`: unreadable, skipped); calls `f(ordinal, value)` for each aligned word in
/// `lo..hi` (as [`ParamInfo::words_in_range`]) and pushes its [`Site`] into `hits` (up to
/// [`PointerSites::MAX`] + 1 of them: more say only that the kernel overflows).
pub fn scan<'a>(
    layout: &KernelInfo,
    mut bytes: impl FnMut(&ParamInfo) -> Option<&'a [u8]>,
    (lo, hi): (u64, u64),
    hits: &mut Vec<Site>,
    mut f: impl FnMut(u32, u64),
) {
    for p in &layout.params {
        let Some(b) = bytes(p) else { continue };
        p.words_in_range(b, lo, hi, |at, v| {
            if hits.len() <= PointerSites::MAX {
                hits.push(Site {
                    param: p.ordinal,
                    at: at as u32,
                    offset: p.offset,
                });
            }
            f(p.ordinal, v)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scan finds the words in range and where they were; learning keeps the union of
    /// the sites of the launches scanned, and overflows past the bound.
    #[test]
    fn scans_learn_the_union_of_their_sites() {
        // (int n, struct { u64 a; u64 b; } s, float* p): the struct at 8, the pointer at 24.
        let k = KernelInfo::with_params(&[(0, 0, 4), (1, 8, 16), (2, 24, 8)]);
        let n = 7i32.to_le_bytes();
        let s = [0x1000u64.to_le_bytes(), 5u64.to_le_bytes()].concat();
        let p = 0x2000u64.to_le_bytes();
        let args: [&[u8]; 3] = [&n, &s, &p];
        let mut hits = Vec::new();
        let mut found = Vec::new();
        scan(
            &k,
            |p| Some(args[p.ordinal as usize]),
            (0x1000, 0x3000),
            &mut hits,
            |param, v| found.push((param, v)),
        );
        assert_eq!(found, [(1, 0x1000), (2, 0x2000)]);
        assert_eq!(
            hits,
            [
                Site {
                    param: 1,
                    at: 0,
                    offset: 8
                },
                Site {
                    param: 2,
                    at: 0,
                    offset: 24
                }
            ]
        );
        let mut sites = PointerSites::new();
        assert!(!sites.ready(), "nothing scanned yet");
        sites.learn(&hits[1..]);
        sites.learn(&hits);
        sites.learn(&[]);
        assert!(sites.ready());
        assert_eq!(sites.sites(), [hits[1], hits[0]]);
        // Reading a later launch at the sites: its words there, in the span only.
        let mut read = Vec::new();
        let bytes = sites.read(
            (0x1000, 0x3000),
            |s| Some(if s.param == 2 { 0x2800 } else { 0x9000 }),
            |param, v| read.push((param, v)),
        );
        assert_eq!((bytes, read), (16, vec![(2, 0x2800)]));
        assert_eq!(
            sites.read((5, 5), |_| Some(5), |_, _| panic!("an empty span")),
            0
        );
        // A kernel without pointers is ready with no sites.
        let mut none = PointerSites::new();
        none.learn(&[]);
        assert!(none.ready() && none.sites().is_empty());
        // Past the bound: every launch is scanned.
        let many: Vec<Site> = (0..=PointerSites::MAX as u32)
            .map(|i| Site {
                param: 0,
                at: 8 * i,
                offset: 0,
            })
            .collect();
        let mut over = PointerSites::new();
        over.learn(&many);
        assert!(!over.ready() && over.sites().is_empty());
        over.learn(&hits);
        assert!(!over.ready());
    }
}
