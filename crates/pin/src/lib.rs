//! Smart pinning: which of a program's pageable host buffers to page-lock in place
//! (`cuMemHostRegister`), decided from what the program copies (issue 29).
//!
//! A copy between device memory and pageable host memory runs through cudaw's pinned
//! staging (tens of GB/s, but below a copy from page-locked memory, and it spends host
//! threads). A buffer the program copies again and again is cheaper page-locked: its copies
//! then go to the driver directly, at pinned speed, with no staging. Pinning costs time
//! (the driver faults in and locks every page) and takes memory from the machine, so a
//! buffer copied once must never be pinned.
//!
//! **The rule** (the ski-rental rule: never more than twice the cost of knowing the
//! future). Each host range (the page-aligned span of a copy's host side) accumulates its
//! *regret*: what its copies cost over pinned speed, `bytes × (1/staged − 1/pinned)` plus a
//! staged copy's fixed cost. Once the regret reaches what pinning the range would cost
//! ([`Costs::pin_cost`]), and at its third copy at the earliest ([`MIN_COPIES_TO_PIN`]), it
//! is pinned, if it fits the budget ([`Policy::budget`]). A range copied once never gets
//! there (pinning costs more than one staged copy loses); a range copied on every step of
//! a training loop gets there within a few steps. The constants ([`Costs::default`]) are
//! estimates until the GPU measures them (`scripts/gpu-check.sh`, section `transfers`:
//! `pin_bench costs`).
//!
//! **Profiles.** In `profile` mode the history is written out as JSON at exit
//! ([`History::profile`]): per copy site and size, how often it was copied and whether it
//! got pinned. In `use` mode a profile's hot signatures are pinned on their first copy
//! ([`History::with_profile`]).
//!
//! **Memory given back.** Before the program frees or unmaps memory, every pinned range
//! inside it must be unregistered ([`History::release`] names them): nothing stays pinned
//! after the program gave the memory back.
//!
//! Everything here is pure: the caller passes the clock, does the registering and
//! reports back ([`History::pinned`], [`History::pin_failed`]).

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, HashSet};

/// Pages are locked whole: spans are widened to this.
pub const PAGE: u64 = 4096;

/// What pinning is set to do (`CUDAW_PIN`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mode {
    /// Never pin; copies are staged as before.
    Off,
    /// Learn while running and pin what gets hot.
    #[default]
    Auto,
    /// As `Auto`, and write the history to this file at exit.
    Profile(String),
    /// Pin the hot signatures of this profile from their first copy, and learn the rest
    /// as `Auto`.
    Use(String),
}

impl Mode {
    /// Parses `off`, `auto`, `profile:FILE` or `use:FILE`.
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "auto" | "" => Ok(Mode::Auto),
            _ => match s.split_once(':') {
                Some(("profile", f)) if !f.is_empty() => Ok(Mode::Profile(f.to_owned())),
                Some(("use", f)) if !f.is_empty() => Ok(Mode::Use(f.to_owned())),
                _ => Err(format!(
                    "CUDAW_PIN={s:?}: expected off, auto, profile:FILE or use:FILE"
                )),
            },
        }
    }
}

/// What copies and pinning cost on this machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// Bytes per second of a staged copy (cudaw's pool).
    pub staged_bytes_per_s: f64,
    /// Bytes per second of a copy from or to page-locked memory.
    pub pinned_bytes_per_s: f64,
    /// Seconds per byte to register memory (`cuMemHostRegister`: faulting in and locking
    /// the pages), plus as much again to unregister it later.
    pub pin_s_per_byte: f64,
    /// Seconds of fixed cost per registration (a driver call, a mapping).
    pub pin_s_fixed: f64,
    /// Seconds a staged copy loses beyond its bytes (filling the pool's pipeline before
    /// the first device copy, waiting for the last one): on an H200 host, staged copies of
    /// 1, 8, 32 and 128 MiB took 0.18, 0.58, 0.72 and 0.87 ms longer than pinned ones
    /// beyond what their bytes explain (the seed benchmark, `pin_bench seed`).
    pub staged_s_fixed: f64,
}

/// A range is pinned at its third copy at the earliest: a buffer copied once each way (a
/// one-shot round trip) is never pinned, however small (a staged copy's fixed cost alone
/// could pay for registering a small one).
pub const MIN_COPIES_TO_PIN: u64 = 3;

impl Default for Costs {
    /// An H100 host (PCIe Gen5): pinned copies at 51 GiB/s and staged ones at about half
    /// of that; registration at about 5 GB/s with 50 µs per call. `gpu-check.sh`'s
    /// `transfers` section measures all four.
    fn default() -> Self {
        Costs {
            staged_bytes_per_s: 25e9,
            pinned_bytes_per_s: 51.0 * (1u64 << 30) as f64,
            pin_s_per_byte: 2.0 / 5e9,
            pin_s_fixed: 50e-6,
            staged_s_fixed: 0.5e-3,
        }
    }
}

impl Costs {
    /// Parses `CUDAW_PIN_COSTS`: comma-separated `key=value` items over the defaults,
    /// `staged` and `pinned` (copy bytes per second), `register` and `unregister` (bytes
    /// per second), `fixed` (seconds per registration), `staged_fixed` (seconds a staged
    /// copy loses beyond its bytes). Measured by `pin_bench costs` and `pin_bench oneshot`
    /// (`gpu-check.sh`, section `transfers`).
    pub fn parse(text: &str) -> Result<Costs, String> {
        let mut c = Costs::default();
        let (mut register, mut unregister) = (2.0 / c.pin_s_per_byte, 2.0 / c.pin_s_per_byte);
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("CUDAW_PIN_COSTS: {item:?} is not key=value"))?;
            // A staged copy's fixed cost may be 0 (the rule before it was counted); the
            // speeds and costs must be positive.
            let zero_ok = key.trim() == "staged_fixed";
            let v: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && (*v > 0.0 || (zero_ok && *v == 0.0)))
                .ok_or_else(|| format!("CUDAW_PIN_COSTS: {value:?} is no positive number"))?;
            match key.trim() {
                "staged" => c.staged_bytes_per_s = v,
                "pinned" => c.pinned_bytes_per_s = v,
                "register" => register = v,
                "unregister" => unregister = v,
                "fixed" => c.pin_s_fixed = v,
                "staged_fixed" => c.staged_s_fixed = v,
                other => {
                    return Err(format!(
                        "CUDAW_PIN_COSTS: unknown key {other:?} (staged, pinned, register, \
                         unregister, fixed, staged_fixed)"
                    ))
                }
            }
        }
        c.pin_s_per_byte = 1.0 / register + 1.0 / unregister;
        Ok(c)
    }

    /// Seconds that pinning `len` bytes costs (registering and, later, unregistering).
    pub fn pin_cost(&self, len: u64) -> f64 {
        self.pin_s_fixed + len as f64 * self.pin_s_per_byte
    }

    /// Seconds a staged copy of `len` bytes loses against a pinned one.
    pub fn regret(&self, len: u64) -> f64 {
        let lost = 1.0 / self.staged_bytes_per_s - 1.0 / self.pinned_bytes_per_s;
        len as f64 * lost.max(0.0) + self.staged_s_fixed
    }

    /// How many copies of a range of `len` bytes make it hot (never fewer than
    /// [`MIN_COPIES_TO_PIN`]).
    pub fn copies_to_pin(&self, len: u64) -> f64 {
        let r = self.regret(len);
        if r <= 0.0 {
            f64::INFINITY
        } else {
            (self.pin_cost(len) / r).max(MIN_COPIES_TO_PIN as f64)
        }
    }
}

/// The limits pinning works within.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub mode: Mode,
    /// The most bytes cudaw keeps pinned at once (`CUDAW_PIN_MAX`).
    pub budget: u64,
    /// Ranges smaller than this are never pinned (their copies stay where they are).
    pub min_bytes: u64,
    pub costs: Costs,
}

impl Policy {
    /// The default budget: an eighth of the machine's memory, at most 64 GiB. Page-locked
    /// memory is taken from everything else on the machine (other jobs, the page cache,
    /// cudaw's own staging); the seed pinned 7% of a program's memory for nearly the
    /// speed of pinning all of it.
    pub fn default_budget(total_ram: u64) -> u64 {
        (total_ram / 8).min(64 << 30)
    }
}

/// What to do with a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The host side lies in ranges cudaw pinned: the driver copies it at pinned speed, one
    /// copy per registration it spans ([`Cuts`]).
    Direct(Cuts),
    /// Register `[start, start + len)` now (then report with [`History::pinned`] or
    /// [`History::pin_failed`]); the copy goes to the driver if registering worked, through
    /// the staging if not.
    Pin { start: u64, len: u64 },
    /// Through the staging.
    Stage,
}

/// Where a copy's host side crosses from one registration into the next, as offsets into
/// the copy (at most two: a heap buffer shares its first and last pages with its
/// neighbours, whose registrations may hold them). The driver copies at pinned speed only
/// what lies inside one registration, so such a copy is issued as one copy per piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cuts([u64; 2]);

impl Cuts {
    /// No cut: one registration holds the whole copy.
    pub const NONE: Cuts = Cuts([0, 0]);

    /// The pieces of a copy of `len` bytes, as `(offset, len)`, in order.
    pub fn pieces(self, len: u64) -> impl Iterator<Item = (u64, u64)> {
        let mut bounds = [0u64; 4];
        let mut n = 1;
        for c in self.0 {
            if c > bounds[n - 1] && c < len {
                bounds[n] = c;
                n += 1;
            }
        }
        bounds[n] = len;
        (0..n).map(move |i| (bounds[i], bounds[i + 1] - bounds[i]))
    }

    /// Whether the copy is one piece.
    pub fn is_none(self) -> bool {
        self.0 == [0, 0]
    }

    /// The offsets, 0 where there is none (to hand across a C boundary).
    pub fn offsets(self) -> [u64; 2] {
        self.0
    }

    /// The cuts at `offsets` ([`Cuts::offsets`]'s).
    pub fn from_offsets(offsets: [u64; 2]) -> Cuts {
        Cuts(offsets)
    }
}

/// A copy's signature across runs: where the program issued it and how long it was
/// (addresses change between runs; these do not).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signature {
    /// The copy's call site: `library+0xoffset` of the caller, or empty when unknown.
    pub site: String,
    /// Bytes.
    pub len: u64,
}

#[derive(Debug, Clone)]
struct Range {
    end: u64,
    /// The bytes copies actually touched, `[lo, hi)` (the span is widened to pages: its
    /// edges may belong to other blocks of the heap).
    copied_lo: u64,
    copied_hi: u64,
    copies: u64,
    bytes: u64,
    regret: f64,
    pinned: bool,
    /// What is registered while `pinned`, `[lo, hi)`: the span less the edge pages a
    /// pinned neighbour's registration holds already (a page is registered once).
    reg: (u64, u64),
    /// Registering it failed or did not fit: not tried again.
    refused: bool,
    last_use: u64,
    signature: Signature,
    /// Its place among the ranges of its signature, in the order of their first copies
    /// (what a profile remembers, addresses changing between runs).
    nth: u64,
}

/// Per signature, what a run saw (the profile).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SignatureStats {
    pub site: String,
    pub len: u64,
    pub copies: u64,
    pub bytes: u64,
    /// Distinct ranges (buffers) that had this signature.
    pub ranges: u64,
    /// Whether a range of this signature was pinned.
    pub hot: bool,
    /// Which of its ranges were pinned, by their place in the order of first copies (0 is
    /// the first buffer of this signature copied): `use` pins those alone. Empty with
    /// `hot` (a profile of an older cudaw): every range of the signature.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hot_nth: Vec<u64>,
}

/// The most places [`SignatureStats::hot_nth`] keeps; past them, every later range of a
/// hot signature is pinned in `use`.
const MAX_HOT_NTH: usize = 4096;

/// The profile file: human-readable JSON.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// `cudaw-pin-profile-1`.
    pub format: String,
    pub signatures: Vec<SignatureStats>,
}

/// The profile format this crate writes and reads.
pub const PROFILE_FORMAT: &str = "cudaw-pin-profile-1";

impl Profile {
    /// The profile as the file holds it: indented JSON, one line per field.
    pub fn to_json(&self) -> String {
        // Serialising plain strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Parses a profile, refusing other formats.
    pub fn from_json(text: &str) -> Result<Profile, String> {
        let p: Profile =
            serde_json::from_str(text).map_err(|e| format!("not a pinning profile: {e}"))?;
        if p.format != PROFILE_FORMAT {
            return Err(format!(
                "pinning profile format {:?}, expected {PROFILE_FORMAT:?}",
                p.format
            ));
        }
        Ok(p)
    }
}

/// Counters for statistics (`cudaw-ckpt stats`, Prometheus).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Copies (and bytes) from or to ranges cudaw pinned.
    pub hot_copies: u64,
    pub hot_bytes: u64,
    /// Copies (and bytes) from or to other pageable memory (staged).
    pub cold_copies: u64,
    pub cold_bytes: u64,
    /// Bytes pinned by cudaw now, and ranges.
    pub pinned_bytes: u64,
    pub pinned_ranges: u64,
    /// The most bytes pinned at once.
    pub peak_pinned_bytes: u64,
    /// Ranges that got hot but did not fit the budget or failed to register.
    pub refused: u64,
    /// Ranges unregistered because the program gave their memory back.
    pub released: u64,
}

/// The memory history of a process's pageable host memory.
#[derive(Debug, Default)]
pub struct History {
    policy: Option<Policy>,
    /// By start address.
    ranges: BTreeMap<u64, Range>,
    /// The pinned ranges by the start of their registration (registrations never overlap:
    /// a page is registered once): the range's start address. Lookups by address go
    /// through it, never through a walk of `ranges`, where records of buffers freed unseen
    /// (far from anything pinned, so the interposer's quick look let them go) may lie
    /// inside a live buffer and hide its neighbour's registration.
    regs: BTreeMap<u64, u64>,
    /// Registrations whose state is in flux: start → (end, the caller's driver calls on them
    /// still to come). A registration given out ([`Action::Pin`]) counts until the caller
    /// reports it ([`History::pinned`] true, [`History::pin_failed`]), or, when it was
    /// forgotten meanwhile ([`History::pinned`] false), until the caller has unregistered
    /// it ([`History::unregistered`]); a registration handed back to unregister
    /// ([`History::release`], [`History::unpin_all`]) counts until then too. Meanwhile no
    /// other range registers those pages, nor is taken for it by its start: a stale
    /// unregister would otherwise remove a newer registration.
    pending: BTreeMap<u64, (u64, u32)>,
    /// Signatures a profile says are hot, with the places of the hot ranges among them
    /// (empty: all).
    hot: HashMap<Signature, HotPlaces>,
    /// Ranges seen so far per signature (the next one's place).
    seen: HashMap<Signature, u64>,
    stats: Stats,
    /// Signatures of ranges no longer tracked (released), for the profile.
    gone: HashMap<Signature, SignatureStats>,
}

/// Which ranges of a hot signature a profile pins.
#[derive(Debug, Clone, Default)]
struct HotPlaces {
    places: HashSet<u64>,
    /// Places past the last one the profile lists are pinned too (the list was cut).
    beyond: Option<u64>,
}

impl HotPlaces {
    fn pins(&self, nth: u64) -> bool {
        self.places.is_empty() || self.places.contains(&nth) || self.beyond.is_some_and(|b| nth > b)
    }
}

/// `[ptr, ptr + len)` widened to whole pages.
pub fn page_span(ptr: u64, len: u64) -> (u64, u64) {
    let start = ptr & !(PAGE - 1);
    let end = ptr.saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
    (start, end - start)
}

impl History {
    pub fn new(policy: Policy) -> History {
        History {
            policy: Some(policy),
            ..History::default()
        }
    }

    /// A history that pins `profile`'s hot signatures on their first copy.
    pub fn with_profile(policy: Policy, profile: &Profile) -> History {
        let mut h = History::new(policy);
        for s in profile.signatures.iter().filter(|s| s.hot) {
            let places = HotPlaces {
                places: s.hot_nth.iter().copied().collect(),
                beyond: (s.hot_nth.len() >= MAX_HOT_NTH)
                    .then(|| s.hot_nth.iter().copied().max())
                    .flatten(),
            };
            h.hot.insert(
                Signature {
                    site: s.site.clone(),
                    len: s.len,
                },
                places,
            );
        }
        h
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The pinned ranges whose registration overlaps `[lo, hi)`, by key, nearest first. The
    /// few keys just below `hi` are enough: registrations are disjoint, and a span of a page
    /// or more overlaps at most its own range's and one neighbour's on each side.
    fn registered_over(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, &Range)> {
        // Disjoint and ordered: walking down from `hi`, the first that ends at or below
        // `lo` has none but such below it.
        self.regs
            .range(..hi)
            .rev()
            .filter_map(|(_, key)| self.ranges.get(key).map(|r| (*key, r)))
            .take_while(move |(_, r)| r.reg.1 > lo)
            .filter(|(_, r)| r.pinned)
    }

    /// Whether registrations of cudaw's cover `[ptr, ptr + len)` whole: the range the copy
    /// counts for (the one whose registration holds most of it) and where the copy
    /// crosses from one registration into the next.
    fn covered(&self, ptr: u64, len: u64) -> Option<(u64, Cuts)> {
        let end = ptr.saturating_add(len);
        // Registrations touching the copy, by their start: the copy's own range's and at
        // most one neighbour's on each side (a page is registered once).
        let mut regs: Vec<(u64, u64, u64)> = self
            .registered_over(ptr, end)
            .map(|(s, r)| (r.reg.0, r.reg.1, s))
            .collect();
        regs.sort_unstable();
        if regs.is_empty() || regs.len() > 3 {
            return None;
        }
        let mut at = ptr;
        let mut cuts = [0u64; 2];
        let mut owner = (0u64, 0u64);
        for (i, &(lo, hi, key)) in regs.iter().enumerate() {
            if lo > at {
                return None;
            }
            if i > 0 {
                cuts[i - 1] = lo - ptr;
            }
            let mine = hi.min(end) - at;
            if mine > owner.1 {
                owner = (key, mine);
            }
            at = hi;
        }
        (at >= end).then_some((owner.0, Cuts(cuts)))
    }

    /// A copy the driver already sees as page-locked: counted as a hot copy if it lies in
    /// ranges cudaw pinned (the program's own page-locked memory is not cudaw's business),
    /// with where it crosses between their registrations.
    pub fn copy_direct(&mut self, ptr: u64, len: u64, now: u64) -> Option<Cuts> {
        let (start, cuts) = self.covered(ptr, len)?;
        if let Some(r) = self.ranges.get_mut(&start) {
            r.copies += 1;
            r.bytes += len;
            r.last_use = now;
        }
        self.stats.hot_copies += 1;
        self.stats.hot_bytes += len;
        Some(cuts)
    }

    /// Whether a registration of cudaw's holds any of `[ptr, ptr + len)` (a buffer whose
    /// edge page a pinned neighbour holds: the driver sees it as page-locked, but it is
    /// not, or not yet, whole).
    pub fn touches(&self, ptr: u64, len: u64) -> bool {
        self.registered_over(ptr, ptr.saturating_add(len))
            .next()
            .is_some()
    }

    /// Where `[ptr, ptr + len)` crosses a border of cudaw's registrations (between two, or
    /// between one and memory none holds), as cuts into it: copies of the pieces each lie
    /// inside one registration or outside all (the first two borders; a copy crossing more
    /// has a last piece that still crosses).
    pub fn borders(&self, ptr: u64, len: u64) -> Cuts {
        let end = ptr.saturating_add(len);
        let mut edges: Vec<u64> = self
            .registered_over(ptr, end)
            .flat_map(|(_, r)| [r.reg.0, r.reg.1])
            .filter(|&e| e > ptr && e < end)
            .collect();
        edges.sort_unstable();
        edges.dedup();
        let mut cuts = [0u64; 2];
        for (c, e) in cuts.iter_mut().zip(edges) {
            *c = e - ptr;
        }
        Cuts(cuts)
    }

    /// Where a copy of `[ptr, ptr + len)` crosses between cudaw's registrations, if they
    /// cover it whole (nothing counted).
    pub fn cuts(&self, ptr: u64, len: u64) -> Option<Cuts> {
        self.covered(ptr, len).map(|(_, c)| c)
    }

    /// A copy of `len` bytes at host address `ptr`, issued at `site`, at time `now`
    /// (ticks): what to do with it.
    pub fn copy(&mut self, ptr: u64, len: u64, site: &str, now: u64) -> Action {
        let Some(policy) = self.policy.clone() else {
            return Action::Stage;
        };
        if policy.mode == Mode::Off || len == 0 {
            return Action::Stage;
        }
        if let Some(cuts) = self.copy_direct(ptr, len, now) {
            return Action::Direct(cuts);
        }
        self.stats.cold_copies += 1;
        self.stats.cold_bytes += len;
        let (start, span) = page_span(ptr, len);
        let end = start + span;
        let copy_end = ptr.saturating_add(len);
        let (min_bytes, budget, costs) = (policy.min_bytes, policy.budget, policy.costs);
        let signature = Signature {
            site: site.to_owned(),
            len,
        };
        // Tracked ranges whose copied bytes this copy overlaps, in another extent: the
        // program reused the memory for something else (neighbours that only share an
        // edge page, as heap blocks do, are other buffers and stay).
        let overlapping: Vec<(u64, bool)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, r)| r.end > start)
            .filter(|(s, r)| {
                r.copied_lo < copy_end && ptr < r.copied_hi && (**s, r.end) != (start, end)
            })
            .map(|(s, r)| (*s, r.pinned))
            .collect();
        if overlapping.iter().any(|&(_, pinned)| pinned) {
            // Part of it is pinned already as another buffer (a copy straddling a pinned
            // range): staged.
            return Action::Stage;
        }
        for (s, _) in overlapping {
            self.forget(s);
        }
        // A range at the same place of another extent, or whose copied bytes this copy
        // does not touch, is an older buffer's, given back unseen (freed while nothing was
        // pinned): not this one's history, and its bytes are not this buffer's.
        if self.ranges.get(&start).is_some_and(|r| {
            !r.pinned && (r.end != end || !(r.copied_lo < copy_end && ptr < r.copied_hi))
        }) {
            self.forget(start);
        }
        if !self.ranges.contains_key(&start) {
            let n = self.seen.entry(signature.clone()).or_default();
            let nth = *n;
            *n += 1;
            self.ranges.insert(
                start,
                Range {
                    end,
                    copied_lo: ptr,
                    copied_hi: copy_end,
                    copies: 0,
                    bytes: 0,
                    regret: 0.0,
                    pinned: false,
                    reg: (start, start),
                    refused: false,
                    last_use: now,
                    signature: signature.clone(),
                    nth,
                },
            );
        }
        let r = self.ranges.get_mut(&start).expect("just inserted");
        r.copies += 1;
        r.bytes += len;
        r.regret += costs.regret(len);
        r.last_use = now;
        r.copied_lo = r.copied_lo.min(ptr);
        r.copied_hi = r.copied_hi.max(copy_end);
        // Pinned already, but a neighbour's registration it leaned on is gone: staged.
        if r.pinned || r.refused || span < min_bytes {
            return Action::Stage;
        }
        let profiled_hot = self
            .hot
            .get(&r.signature)
            .is_some_and(|places| places.pins(r.nth));
        let hot =
            profiled_hot || (r.regret >= costs.pin_cost(span) && r.copies >= MIN_COPIES_TO_PIN);
        if !hot {
            return Action::Stage;
        }
        // Edge pages a pinned neighbour holds are registered already: this range registers
        // the rest, and its copies cross into the neighbour's registration ([`Cuts`]).
        let (mut lo, mut hi) = (start, end);
        for (_, n) in self
            .registered_over(start, end)
            .filter(|(s, _)| *s != start)
        {
            if n.reg.0 <= lo {
                lo = lo.max(n.reg.1);
            } else if n.reg.1 >= hi {
                hi = hi.min(n.reg.0);
            } else {
                // Inside this span (cannot be: their copied bytes would overlap).
                return Action::Stage;
            }
        }
        if hi <= lo || hi - lo < min_bytes.min(span) {
            return Action::Stage;
        }
        // Pages a registration still in flight holds (perhaps of a range given back since):
        // not now.
        if self
            .pending
            .range(..hi)
            .next_back()
            .is_some_and(|(_, &(end, _))| end > lo)
        {
            return Action::Stage;
        }
        let r = self.ranges.get_mut(&start).expect("tracked");
        if self.stats.pinned_bytes + (hi - lo) > budget {
            r.refused = true;
            self.stats.refused += 1;
            return Action::Stage;
        }
        // Counted as pinned until the caller says otherwise (no second Pin meanwhile).
        r.pinned = true;
        r.reg = (lo, hi);
        // Its copied bytes from now on are this copy's: what earlier copies at this place
        // touched may have been another buffer's, given back unseen (nothing was pinned
        // then), whose bytes now belong to other blocks: their `free` must not unpin it.
        r.copied_lo = ptr;
        r.copied_hi = copy_end;
        self.regs.insert(lo, start);
        self.hold(lo, hi);
        self.stats.pinned_bytes += hi - lo;
        self.stats.pinned_ranges += 1;
        self.stats.peak_pinned_bytes = self.stats.peak_pinned_bytes.max(self.stats.pinned_bytes);
        Action::Pin {
            start: lo,
            len: hi - lo,
        }
    }

    /// The range whose registration starts at `lo`.
    fn by_registration(&self, lo: u64) -> Option<u64> {
        let key = *self.regs.get(&lo)?;
        self.ranges
            .get(&key)
            .is_some_and(|r| r.pinned && r.reg.0 == lo)
            .then_some(key)
    }

    /// Registering the range at `start` worked. `false` when the range was released while
    /// it was being registered: the caller unregisters it again.
    pub fn pinned(&mut self, start: u64) -> bool {
        let kept = self.by_registration(start).is_some();
        if kept {
            self.let_go(start);
        }
        kept
    }

    /// The caller unregistered the registration at `start` (one [`History::release`] or
    /// [`History::unpin_all`] named, or one [`History::pinned`] said was forgotten).
    pub fn unregistered(&mut self, start: u64) {
        self.let_go(start);
    }

    /// One more driver call on the registration `[lo, hi)` to come.
    fn hold(&mut self, lo: u64, hi: u64) {
        let e = self.pending.entry(lo).or_insert((hi, 0));
        e.1 += 1;
    }

    /// One driver call on the registration at `lo` done.
    fn let_go(&mut self, lo: u64) {
        if let Some(e) = self.pending.get_mut(&lo) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                self.pending.remove(&lo);
            }
        }
    }

    /// Registering the range at `start` failed: it is never tried again.
    pub fn pin_failed(&mut self, start: u64) {
        self.let_go(start);
        let Some(key) = self.by_registration(start) else {
            return;
        };
        self.regs.remove(&start);
        if let Some(r) = self.ranges.get_mut(&key) {
            r.pinned = false;
            self.stats.pinned_bytes -= r.reg.1 - r.reg.0;
            self.stats.pinned_ranges -= 1;
            r.refused = true;
            self.stats.refused += 1;
        }
    }

    /// The program is about to give `[ptr, ptr + len)` back: the pinned ranges to
    /// unregister first, as `(start, len)` (the caller says when it has,
    /// [`History::unregistered`]); every range concerned is forgotten. `pages`:
    /// the pages themselves go (`munmap`, `mremap`, `madvise`), and every range touching
    /// them is concerned; else a heap block goes (`free`, `realloc`), and only ranges whose
    /// copied bytes it overlaps are (a neighbour sharing a page leaves a hot range alone).
    pub fn release(&mut self, ptr: u64, len: u64, pages: bool) -> Vec<(u64, u64)> {
        let end = ptr.saturating_add(len);
        let touching: Vec<u64> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, r)| r.end > ptr)
            .filter(|(_, r)| pages || (r.copied_lo < end && ptr < r.copied_hi))
            .map(|(s, _)| *s)
            .collect();
        let mut out = Vec::new();
        for s in touching.into_iter().rev() {
            if let Some(r) = self.ranges.get(&s) {
                if r.pinned {
                    out.push((r.reg.0, r.reg.1 - r.reg.0));
                    self.stats.released += 1;
                }
            }
            self.forget(s);
        }
        for &(lo, len) in &out {
            self.hold(lo, lo + len);
        }
        out
    }

    /// Every range still pinned is forgotten (at exit), as `(start, len)`: the caller
    /// unregisters them (and says so, [`History::unregistered`]). Not counted as released.
    pub fn unpin_all(&mut self) -> Vec<(u64, u64)> {
        let all = self.pinned_ranges();
        let keys: Vec<u64> = self
            .ranges
            .iter()
            .filter(|(_, r)| r.pinned)
            .map(|(s, _)| *s)
            .collect();
        for s in keys {
            self.forget(s);
        }
        for &(lo, len) in &all {
            self.hold(lo, lo + len);
        }
        all
    }

    /// The lowest and highest address pinned now (`(u64::MAX, 0)` when none): a cheap
    /// first look for memory given back.
    pub fn pinned_bounds(&self) -> (u64, u64) {
        // From the index of registrations (disjoint, ordered by start): the first one's
        // start, the last one's end; no walk of every record.
        let lo = self.regs.keys().next().copied().unwrap_or(u64::MAX);
        let hi = self
            .regs
            .values()
            .next_back()
            .and_then(|key| self.ranges.get(key))
            .map_or(0, |r| r.reg.1);
        (lo, hi)
    }

    /// Every range still pinned, as `(start, len)` (to unregister at exit).
    pub fn pinned_ranges(&self) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .filter(|(_, r)| r.pinned)
            .map(|(_, r)| (r.reg.0, r.reg.1 - r.reg.0))
            .collect()
    }

    fn forget(&mut self, start: u64) {
        let Some(r) = self.ranges.remove(&start) else {
            return;
        };
        if r.pinned {
            self.stats.pinned_bytes -= r.reg.1 - r.reg.0;
            self.stats.pinned_ranges -= 1;
            if self.regs.get(&r.reg.0) == Some(&start) {
                self.regs.remove(&r.reg.0);
            }
        }
        let g = self.gone.entry(r.signature.clone()).or_default();
        add(g, &r);
    }

    /// What this run saw, per signature, most bytes first.
    pub fn profile(&self) -> Profile {
        let mut by: HashMap<Signature, SignatureStats> = self.gone.clone();
        for r in self.ranges.values() {
            add(by.entry(r.signature.clone()).or_default(), r);
        }
        let mut signatures: Vec<SignatureStats> = by
            .into_iter()
            .map(|(sig, mut s)| {
                s.site = sig.site;
                s.len = sig.len;
                s.hot_nth.sort_unstable();
                s.hot_nth.dedup();
                // The lowest places; past the last kept, every place pins (`beyond`).
                s.hot_nth.truncate(MAX_HOT_NTH);
                s
            })
            .collect();
        signatures.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| (&a.site, a.len).cmp(&(&b.site, b.len)))
        });
        Profile {
            format: PROFILE_FORMAT.to_owned(),
            signatures,
        }
    }
}

fn add(s: &mut SignatureStats, r: &Range) {
    s.copies += r.copies;
    s.bytes += r.bytes;
    s.ranges += 1;
    s.hot |= r.pinned;
    if r.pinned {
        s.hot_nth.push(r.nth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn policy(budget: u64) -> Policy {
        Policy {
            mode: Mode::Auto,
            budget,
            min_bytes: MIB,
            costs: Costs::default(),
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!(Mode::parse("off"), Ok(Mode::Off));
        assert_eq!(Mode::parse("auto"), Ok(Mode::Auto));
        assert_eq!(
            Mode::parse("profile:/tmp/p.json"),
            Ok(Mode::Profile("/tmp/p.json".into()))
        );
        assert_eq!(Mode::parse("use:p.json"), Ok(Mode::Use("p.json".into())));
        for bad in ["on", "profile:", "use", "pin:x"] {
            assert!(Mode::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_buffer_copied_once_is_never_pinned() {
        let mut h = History::new(policy(1 << 40));
        for i in 0..100u64 {
            let a = h.copy(0x1000_0000 + i * 256 * MIB, 128 * MIB, "s", i);
            assert_eq!(a, Action::Stage);
        }
        assert_eq!(h.stats().pinned_bytes, 0);
    }

    #[test]
    fn a_buffer_copied_every_step_is_pinned_within_a_few_copies() {
        let mut h = History::new(policy(1 << 40));
        let costs = Costs::default();
        let want = costs.copies_to_pin(128 * MIB).ceil() as u64;
        assert!((2..=20).contains(&want), "{want} copies to pin 128 MiB");
        let mut pinned_at = None;
        for step in 1..=20u64 {
            match h.copy(0x7000_0000, 128 * MIB, "loop", step) {
                Action::Pin { start, len } => {
                    assert_eq!((start, len), (0x7000_0000, 128 * MIB));
                    pinned_at = Some(step);
                    assert!(h.pinned(start));
                }
                Action::Direct(cuts) => {
                    assert!(pinned_at.is_some());
                    assert!(cuts.is_none());
                }
                Action::Stage => assert!(pinned_at.is_none()),
            }
        }
        assert_eq!(pinned_at, Some(want));
        assert_eq!(h.stats().pinned_bytes, 128 * MIB);
        // A copy of part of it, or at an offset inside it, is direct too.
        assert_eq!(
            h.copy(0x7000_0000 + MIB, 4 * MIB, "other", 21),
            Action::Direct(Cuts::NONE)
        );
        // Copies the driver takes directly count as hot ones here, and only here.
        let hot = h.stats().hot_copies;
        assert_eq!(h.copy_direct(0x7000_0000, 128 * MIB, 22), Some(Cuts::NONE));
        assert_eq!(h.copy_direct(0x1_0000_0000, 128 * MIB, 23), None);
        assert_eq!(h.stats().hot_copies, hot + 1);
    }

    #[test]
    fn the_budget_is_never_exceeded() {
        let mut h = History::new(policy(300 * MIB));
        let mut pinned = 0;
        for step in 0..50u64 {
            for b in 0..4u64 {
                if let Action::Pin { len, .. } = h.copy(b << 32, 128 * MIB, "x", step) {
                    pinned += len;
                }
            }
            assert!(h.stats().pinned_bytes <= 300 * MIB);
        }
        assert_eq!(pinned, 256 * MIB);
        assert!(h.stats().refused >= 2);
    }

    #[test]
    fn memory_given_back_is_unregistered_first() {
        let mut h = History::new(policy(1 << 40));
        let base = 0x5000_0000u64;
        while h.copy(base, 64 * MIB, "s", 0) != Action::Direct(Cuts::NONE) {}
        // Freeing memory around it names the range once, and it is forgotten.
        assert_eq!(
            h.release(base - PAGE, 128 * MIB, true),
            vec![(base, 64 * MIB)]
        );
        assert_eq!(h.stats().pinned_bytes, 0);
        assert!(h.release(base, 64 * MIB, true).is_empty());
        assert!(h.pinned_ranges().is_empty());
        // Copies there start over.
        assert_eq!(h.copy(base, 64 * MIB, "s", 1), Action::Stage);
    }

    #[test]
    fn a_neighbour_freed_in_the_same_page_leaves_a_hot_range_pinned() {
        let mut h = History::new(policy(1 << 40));
        // A heap buffer that starts and ends in the middle of pages.
        let buf = 0x5000_0800u64;
        while h.copy(buf, 64 * MIB, "s", 0) != Action::Direct(Cuts::NONE) {}
        // The block before it, in its first page, is freed: nothing to unpin.
        assert!(h.release(0x5000_0000, 0x800, false).is_empty());
        // The block after it, in its last page, likewise.
        assert!(h.release(buf + 64 * MIB, 0x100, false).is_empty());
        assert_eq!(h.copy(buf, 64 * MIB, "s", 1), Action::Direct(Cuts::NONE));
        // Its own block is.
        assert_eq!(h.release(buf, 64 * MIB, false).len(), 1);
        assert_eq!(h.pinned_bounds(), (u64::MAX, 0));
    }

    #[test]
    fn a_failed_registration_is_not_tried_again() {
        let mut h = History::new(policy(1 << 40));
        let start = loop {
            if let Action::Pin { start, .. } = h.copy(0x9000_0000, 64 * MIB, "s", 0) {
                break start;
            }
        };
        h.pin_failed(start);
        for _ in 0..100 {
            assert_eq!(h.copy(0x9000_0000, 64 * MIB, "s", 0), Action::Stage);
        }
        assert_eq!(h.stats().pinned_bytes, 0);
    }

    #[test]
    fn small_ranges_and_off_are_left_alone() {
        let mut h = History::new(policy(1 << 40));
        for _ in 0..1000 {
            assert_eq!(h.copy(0x1000, 64 << 10, "s", 0), Action::Stage);
        }
        let mut off = History::new(Policy {
            mode: Mode::Off,
            ..policy(1 << 40)
        });
        for _ in 0..1000 {
            assert_eq!(off.copy(0x1000_0000, 64 * MIB, "s", 0), Action::Stage);
        }
    }

    #[test]
    fn a_profile_round_trips_and_pins_from_the_first_copy() {
        let mut h = History::new(policy(1 << 40));
        while h.copy(0x4000_0000, 32 * MIB, "hot.so+0x10", 0) != Action::Direct(Cuts::NONE) {}
        h.copy(0x8000_0000, 32 * MIB, "cold.so+0x20", 0);
        let text = serde_json::to_string_pretty(&h.profile()).unwrap();
        let p = Profile::from_json(&text).unwrap();
        assert_eq!(p.signatures.len(), 2);
        assert!(p
            .signatures
            .iter()
            .any(|s| s.hot && s.site == "hot.so+0x10"));
        // Another run, other addresses: the hot signature is pinned on its first copy.
        let mut next = History::with_profile(policy(1 << 40), &p);
        assert!(matches!(
            next.copy(0x6000_0000, 32 * MIB, "hot.so+0x10", 0),
            Action::Pin { .. }
        ));
        assert_eq!(
            next.copy(0xa000_0000, 32 * MIB, "cold.so+0x20", 0),
            Action::Stage
        );
        assert!(Profile::from_json("{\"format\":\"other\",\"signatures\":[]}").is_err());
        assert!(Profile::from_json("not json").is_err());
    }

    #[test]
    fn costs_parse_over_the_defaults() {
        assert_eq!(Costs::parse(""), Ok(Costs::default()));
        let c = Costs::parse("staged=20e9, pinned=50e9,register=10e9,unregister=40e9,fixed=1e-4")
            .unwrap();
        assert_eq!((c.staged_bytes_per_s, c.pinned_bytes_per_s), (20e9, 50e9));
        assert!((c.pin_s_per_byte - (1.0 / 10e9 + 1.0 / 40e9)).abs() < 1e-20);
        assert_eq!(c.pin_s_fixed, 1e-4);
        // Cheaper registering pins sooner.
        assert!(c.copies_to_pin(64 * MIB) < Costs::default().copies_to_pin(64 * MIB));
        for bad in ["staged", "staged=-1", "staged=x", "speed=1e9", "fixed=inf"] {
            assert!(Costs::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_budget_is_an_eighth_of_memory() {
        assert_eq!(Policy::default_budget(256 << 30), 32 << 30);
        assert_eq!(Policy::default_budget(2 << 40), 64 << 30);
    }

    /// Copies `len` bytes at `ptr` until it is pinned or `limit` copies; the copy that
    /// pinned it is reported as registered. Returns the registration.
    fn heat(h: &mut History, ptr: u64, len: u64, limit: u64) -> Option<(u64, u64)> {
        for t in 0..limit {
            if let Action::Pin { start, len } = h.copy(ptr, len, "", t) {
                assert!(h.pinned(start));
                return Some((start, len));
            }
        }
        None
    }

    #[test]
    fn heap_neighbours_sharing_edge_pages_are_both_pinned_once_each() {
        // glibc's heap: blocks 16 bytes apart, the first page of one the last of the other.
        let mut h = History::new(policy(1 << 40));
        let a = 0x5555_0000_0010u64;
        let len = 8 * MIB;
        let b = a + len + 16;
        let c = b + len + 16;
        // Alternate copies of a and b, as a step copying two buffers would: neither
        // replaces the other.
        let mut regs = Vec::new();
        for t in 0..200u64 {
            for p in [a, b] {
                match h.copy(p, len, "", t) {
                    Action::Pin { start, len } => {
                        assert!(h.pinned(start));
                        regs.push((start, start + len));
                    }
                    Action::Direct(_) | Action::Stage => {}
                }
            }
        }
        assert_eq!(regs.len(), 2, "{regs:x?}");
        regs.sort_unstable();
        // No page registered twice; together they hold both buffers whole.
        assert!(regs[0].1 <= regs[1].0, "{regs:x?}");
        assert!(regs[0].0 <= a && regs[1].1 >= b + len);
        // Each copy is direct; the one crossing into the other's registration is cut there.
        let cut_a = h.cuts(a, len).expect("a covered");
        let cut_b = h.cuts(b, len).expect("b covered");
        let pieces: Vec<Vec<(u64, u64)>> = [cut_a, cut_b]
            .iter()
            .map(|c| c.pieces(len).collect())
            .collect();
        assert_eq!(
            pieces.iter().filter(|p| p.len() == 2).count(),
            1,
            "{pieces:?}"
        );
        for (p, base) in pieces.iter().zip([a, b]) {
            assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), len);
            for w in p.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0);
            }
            if p.len() == 2 {
                // The cut lies on the page boundary between the two registrations.
                assert_eq!(base + p[1].0, regs[1].0);
            }
        }
        assert_eq!(h.stats().pinned_ranges, 2);
        assert_eq!(
            h.stats().pinned_bytes,
            (regs[0].1 - regs[0].0) + (regs[1].1 - regs[1].0)
        );
        // A cold third neighbour copied once is staged, and leaves both alone.
        assert_eq!(h.copy(c, len, "", 500), Action::Stage);
        assert_eq!(h.stats().pinned_ranges, 2);
        // Freeing b (a heap block) unregisters b's registration alone; a's copies go on
        // direct, and b's old memory copied again is not covered any more.
        let gone = h.release(b, len, false);
        assert_eq!(gone.len(), 1);
        assert!(gone[0].0 >= a + len - PAGE);
        // (a was pinned first, whole; b leaned on a's last page.)
        assert_eq!(h.cuts(a, len), Some(Cuts::NONE));
        assert!(h.cuts(b, len).is_none());
        assert_eq!(h.stats().pinned_ranges, 1);
    }

    #[test]
    fn a_range_leaning_on_a_neighbour_that_went_is_staged() {
        let mut h = History::new(policy(1 << 40));
        let len = 8 * MIB;
        let a = 0x5555_0000_0010u64;
        let b = a + len + 16;
        let ra = heat(&mut h, a, len, 100).expect("a pinned");
        // b, not pinned yet, straddles a's border: handed to the driver, it goes in two
        // pieces, the first inside a's registration, the second outside every one.
        assert!(h.touches(b, len) && h.cuts(b, len).is_none());
        let pieces: Vec<(u64, u64)> = h.borders(b, len).pieces(len).collect();
        assert_eq!(
            pieces,
            vec![
                (0, ra.0 + ra.1 - b),
                (ra.0 + ra.1 - b, len - (ra.0 + ra.1 - b))
            ]
        );
        assert!(!h.touches(b + PAGE, len - PAGE));
        let rb = heat(&mut h, b, len, 100).expect("b pinned");
        // b leans on a's last page.
        assert_eq!(rb.0, ra.0 + ra.1);
        assert!(h.cuts(b, len).is_some_and(|c| !c.is_none()));
        h.release(a, len, false);
        assert_eq!(h.copy(b, len, "", 1000), Action::Stage);
        // And nothing was registered twice meanwhile.
        assert_eq!(h.stats().pinned_ranges, 1);
    }

    #[test]
    fn use_pins_the_hot_places_of_a_signature_alone() {
        // Two hot buffers and five cold ones of one size, copied from one site.
        let len = 32 * MIB;
        let base = 0x7f00_0000_0000u64;
        let at = |i: u64| base + i * 64 * MIB;
        let run = |h: &mut History| {
            let mut pinned = Vec::new();
            for t in 0..100u64 {
                for i in 0..2 {
                    if let Action::Pin { start, .. } = h.copy(at(i), len, "site", t) {
                        assert!(h.pinned(start));
                        pinned.push((i, t));
                    }
                }
                if t % 20 == 0 {
                    let i = 2 + t / 20;
                    if let Action::Pin { start, .. } = h.copy(at(i), len, "site", t) {
                        assert!(h.pinned(start));
                        pinned.push((i, t));
                    }
                }
            }
            pinned
        };
        let mut first = History::new(policy(1 << 40));
        let auto = run(&mut first);
        assert_eq!(auto.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!(auto.iter().all(|p| p.1 > 0), "auto pins after some copies");
        let p = first.profile();
        assert_eq!(p.signatures.len(), 1);
        assert_eq!(p.signatures[0].hot_nth, vec![0, 1]);
        let text = p.to_json();
        let back = Profile::from_json(&text).unwrap();
        let mut second = History::with_profile(policy(1 << 40), &back);
        let used = run(&mut second);
        assert_eq!(
            used,
            vec![(0, 0), (1, 0)],
            "hot places pinned on their first copy"
        );
        // A profile without places (an older cudaw's) pins every range of the signature.
        let old = text.replace("\"hot_nth\"", "\"ignored\"");
        let mut third = History::with_profile(policy(1 << 40), &Profile::from_json(&old).unwrap());
        assert_eq!(run(&mut third).len(), 7);
    }

    #[test]
    fn cuts_cut_into_pieces_in_order() {
        assert_eq!(Cuts::NONE.pieces(10).collect::<Vec<_>>(), vec![(0, 10)]);
        assert_eq!(
            Cuts([4, 0]).pieces(10).collect::<Vec<_>>(),
            vec![(0, 4), (4, 6)]
        );
        assert_eq!(
            Cuts([2, 8]).pieces(10).collect::<Vec<_>>(),
            vec![(0, 2), (2, 6), (8, 2)]
        );
        // Cuts at the ends are no cuts.
        assert_eq!(Cuts([10, 0]).pieces(10).collect::<Vec<_>>(), vec![(0, 10)]);
    }

    #[test]
    fn a_new_buffer_where_an_old_one_was_starts_its_own_history() {
        // b copied, freed unseen (nothing pinned then), r allocated on the same first page:
        // r's range is its own, and a small block freed between them releases nothing.
        let mut h = History::new(policy(1 << 40));
        let len = 16 * MIB;
        let b = 0x5599_fdb1_3010u64;
        let r = 0x5599_fdb1_3df0u64;
        for t in 0..3 {
            assert_eq!(h.copy(b, len, "", t), Action::Stage);
        }
        let reg = heat(&mut h, r, len, 200).expect("r pinned");
        assert!(
            h.release(r - 0x6e0, 0x6d0, false).is_empty(),
            "a neighbour's block"
        );
        assert_eq!(h.cuts(r, len), Some(Cuts::NONE));
        assert_eq!(h.release(r, len, false), vec![reg]);
    }

    /// Cold buffers freed without a word to the history (their memory was not near a
    /// pinned range, so the interposer's quick look let them go) leave their records;
    /// a later hot buffer over the same addresses (heap blocks reused) must still be
    /// seen whole: its registration is found past the stale records inside it.
    #[test]
    fn stale_records_inside_a_pinned_range_do_not_hide_it() {
        let mut h = History::new(policy(1 << 40));
        let base = 0x5500_0000_0000u64;
        for i in 0..8u64 {
            assert_eq!(
                h.copy(base + 16 + i * (MIB + PAGE), MIB, "", i),
                Action::Stage
            );
        }
        let (ptr, len) = (base + 16, 8 * MIB);
        let mut reg = None;
        for t in 100..400u64 {
            match h.copy(ptr, len, "", t) {
                Action::Pin { start, len } => {
                    assert!(h.pinned(start));
                    reg = Some((start, len));
                }
                Action::Direct(cuts) => {
                    assert_eq!(cuts, Cuts::NONE);
                    break;
                }
                Action::Stage => {}
            }
        }
        let (start, rlen) = reg.expect("the hot buffer got pinned");
        assert!(start <= ptr && start + rlen >= ptr + len);
        assert_eq!(h.cuts(ptr, len), Some(Cuts::NONE));
        assert_eq!(h.borders(ptr, len), Cuts::NONE);
        assert!(h.touches(ptr, len));
    }

    /// The GPU's failure of `--pin use` at 8 MiB: two hot heap buffers side by side, the
    /// first pinned whole (its last page is the second's first), and records of freed
    /// cold buffers left inside the second. A copy of the second starts inside the first's
    /// registration: it must be seen to touch it and be cut at its end, else it goes to
    /// the driver whole, which refuses a copy that starts in a registration and runs past
    /// it.
    #[test]
    fn stale_records_do_not_hide_a_neighbours_registration() {
        let mut h = History::new(policy(1 << 40));
        let base = 0x5500_0000_0000u64;
        let len = 8 * MIB;
        let (p0, p1) = (base + 0x2a0, base + 0x2a0 + len + 16);
        for i in 0..6u64 {
            let stale = p1 + PAGE + i * (MIB + PAGE);
            assert_eq!(h.copy(stale, MIB, "", i), Action::Stage);
        }
        let mut reg = None;
        for t in 100..400u64 {
            if let Action::Pin { start, len } = h.copy(p0, len, "", t) {
                assert!(h.pinned(start));
                reg = Some((start, start + len));
                break;
            }
        }
        let (_, end0) = reg.expect("the first buffer got pinned");
        assert!(
            end0 > p1,
            "the first registration holds the second's first page"
        );
        assert!(h.touches(p1, len));
        let cuts: Vec<(u64, u64)> = h.borders(p1, len).pieces(len).collect();
        assert_eq!(cuts, vec![(0, end0 - p1), (end0 - p1, len - (end0 - p1))]);
    }

    /// A staged copy's fixed cost makes small hot buffers hot within a few copies, but a
    /// round trip (one copy each way) is never enough, however small the buffer.
    #[test]
    fn a_round_trip_is_never_pinned_and_the_third_copy_is() {
        let mut h = History::new(policy(1 << 40));
        let (cold, hot) = (0x7f00_0000_0000u64, 0x7f10_0000_0000u64);
        for (i, len) in [MIB, 8 * MIB, 128 * MIB].into_iter().enumerate() {
            let c = cold + i as u64 * 256 * MIB;
            assert_eq!(h.copy(c, len, "", 0), Action::Stage);
            assert_eq!(h.copy(c, len, "", 1), Action::Stage);
        }
        assert_eq!(h.stats().pinned_ranges, 0);
        assert_eq!(h.copy(hot, MIB, "", 2), Action::Stage);
        assert_eq!(h.copy(hot, MIB, "", 3), Action::Stage);
        assert!(matches!(h.copy(hot, MIB, "", 4), Action::Pin { .. }));
        let c = Costs::default();
        assert_eq!(c.copies_to_pin(MIB), MIN_COPIES_TO_PIN as f64);
        assert!(c.copies_to_pin(128 * MIB) > MIN_COPIES_TO_PIN as f64);
        assert_eq!(Costs::parse("staged_fixed=0").unwrap().staged_s_fixed, 0.0);
        assert!(Costs::parse("staged=0").is_err());
        let parsed = Costs::parse("staged_fixed=2e-3").unwrap();
        assert_eq!(parsed.staged_s_fixed, 2e-3);
        assert!(parsed.regret(MIB) > c.regret(MIB));
    }

    /// A range given back while its registration is in flight, and another buffer at the
    /// same place hot at once: the second waits for the first's outcome, so that the
    /// first's `pinned` is never taken for the second's (its registration would be left
    /// behind, never unregistered) and the second never registers pages still registered.
    #[test]
    fn a_registration_in_flight_is_never_mistaken_for_a_later_one() {
        let mut h = History::new(policy(1 << 40));
        let (ptr, len) = (0x7f00_0000_0000u64, 8 * MIB);
        let first = (0..100u64)
            .find_map(|t| match h.copy(ptr, len, "", t) {
                Action::Pin { start, .. } => Some(start),
                _ => None,
            })
            .expect("hot");
        // Given back while being registered; the same addresses hot again at once.
        assert_eq!(h.release(ptr, len, true).len(), 1);
        assert_eq!(h.stats().pinned_ranges, 0);
        for t in 100..200u64 {
            assert_eq!(h.copy(ptr, len, "", t), Action::Stage, "copy {t}");
        }
        // The first registration's outcome: gone meanwhile. Until the caller has
        // unregistered it (twice: release's and decide's own), the pages stay its.
        assert!(!h.pinned(first));
        assert_eq!(h.copy(ptr, len, "", 150), Action::Stage);
        h.unregistered(first);
        assert_eq!(h.copy(ptr, len, "", 151), Action::Stage);
        h.unregistered(first);
        let second = (200..300u64)
            .find_map(|t| match h.copy(ptr, len, "", t) {
                Action::Pin { start, .. } => Some(start),
                _ => None,
            })
            .expect("hot again");
        assert_eq!(second, first);
        assert!(h.pinned(second));
        assert_eq!(h.cuts(ptr, len), Some(Cuts::NONE));
    }
}
