//! What [`crate::Tracer::stats`] returns: plain data (serde), the control protocol's
//! `stats` reply, shown by `cudaw-ckpt stats` as text, JSON ([`Stats`]) or the Prometheus
//! text format ([`Stats::to_prometheus`]).

use crate::counters::Merged;
use crate::history::{History, Record};
use crate::{demangle, Clock, Direction, Mode};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::sync::Arc;

/// One function's calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallStat {
    /// The function.
    pub name: String,
    /// Calls.
    pub count: u64,
    /// Nanoseconds in the calls, together.
    pub total_ns: f64,
    /// Mean nanoseconds per call.
    pub mean_ns: f64,
    /// The longest call, in nanoseconds.
    pub max_ns: f64,
}

/// One kernel's launches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelStat {
    /// Its demangled name.
    pub name: String,
    /// Its mangled name.
    pub mangled: String,
    /// Launches.
    pub launches: u64,
}

/// One direction's copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyStat {
    /// `HtoD`, `DtoH`, `DtoD`, `HtoH`.
    pub direction: String,
    /// Copies.
    pub count: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Pauses and resumes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PauseStat {
    /// Pauses.
    pub pauses: u64,
    /// Resumes.
    pub resumes: u64,
    /// Milliseconds paused (the pauses themselves, not the time spent paused).
    pub pause_ms: f64,
    /// Milliseconds resuming.
    pub resume_ms: f64,
}

/// Copies with the program's pageable host memory that cudaw ran through its pinned
/// staging (`CUDAW_STAGED_COPY_MIN`), instead of the driver's pageable path, and what smart
/// pinning (`CUDAW_PIN`) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TransferStat {
    /// Copies staged.
    pub staged_copies: u64,
    /// Their bytes.
    pub staged_bytes: u64,
    /// Whether smart pinning is on (the fields below count only then).
    #[serde(default)]
    pub pinning: bool,
    /// Copies (and bytes) from or to ranges cudaw page-locked: hot.
    #[serde(default)]
    pub hot_copies: u64,
    #[serde(default)]
    pub hot_bytes: u64,
    /// Copies (and bytes) from or to other pageable memory: cold.
    #[serde(default)]
    pub cold_copies: u64,
    #[serde(default)]
    pub cold_bytes: u64,
    /// Bytes (and ranges) cudaw keeps page-locked now, and the most at once.
    #[serde(default)]
    pub pinned_bytes: u64,
    #[serde(default)]
    pub pinned_ranges: u64,
    #[serde(default)]
    pub peak_pinned_bytes: u64,
    /// Ranges unpinned because the program gave their memory back, and ranges that got hot
    /// but did not fit the budget or failed to register.
    #[serde(default)]
    pub released: u64,
    #[serde(default)]
    pub refused: u64,
}

/// One allocation's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocStat {
    /// Creation order in the process.
    pub order: u64,
    /// Its address, `0x…`.
    pub base: String,
    /// Bytes.
    pub size: u64,
    /// The API that made it.
    pub api: String,
    /// The library or program that called it, when known.
    pub site: Option<String>,
    /// Seconds since it was made.
    pub age_s: f64,
    /// Copies into it.
    pub copies_in: u64,
    /// Bytes copied into it.
    pub bytes_in: u64,
    /// Copies out of it.
    pub copies_out: u64,
    /// Bytes copied out of it.
    pub bytes_out: u64,
    /// Launches that received it.
    pub launches: u64,
    /// The kernels that received it (demangled; the first 16 distinct).
    pub kernels: Vec<String>,
    /// Seconds since its last use (or since it was made, if never used).
    pub idle_s: f64,
}

/// The memory history's summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStat {
    /// Live allocations.
    pub live: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Allocations made over the run.
    pub made: u64,
    /// Allocations freed over the run.
    pub freed: u64,
    /// The most used live allocations.
    pub hottest: Vec<AllocStat>,
    /// The live allocations unused longest.
    pub coldest: Vec<AllocStat>,
}

/// The timeline ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineStat {
    /// Events held.
    pub events: u64,
    /// Capacity.
    pub capacity: u64,
    /// Events dropped (the oldest) to stay within it.
    pub dropped: u64,
}

/// Everything counted, as `cudaw-ckpt stats PID --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// The process.
    pub pid: u32,
    /// `metrics` or `timeline`.
    pub mode: String,
    /// Seconds since tracing began.
    pub seconds: f64,
    /// Per function called at least once, most time first.
    pub calls: Vec<CallStat>,
    /// Per kernel launched, most launches first.
    pub kernels: Vec<KernelStat>,
    /// Per direction with copies.
    pub copies: Vec<CopyStat>,
    /// Pauses and resumes.
    pub pauses: PauseStat,
    /// The memory history.
    pub memory: MemoryStat,
    /// The timeline ring (mode `timeline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<TimelineStat>,
    /// Host transfers through cudaw's staging (filled by the runtime, which does them).
    #[serde(default)]
    pub transfers: TransferStat,
}

pub(crate) struct Inputs<'a> {
    pub pid: u32,
    pub mode: Mode,
    pub seconds: f64,
    pub rate: f64,
    pub now: u64,
    pub merged: &'a Merged,
    pub function_names: &'a [&'static str],
    pub kernel_names: &'a [Arc<str>],
    pub history: &'a History,
    pub pauses: PauseStat,
    pub timeline: Option<TimelineStat>,
    pub top: usize,
}

pub(crate) fn build(i: Inputs<'_>) -> Stats {
    let ns = |t: u64| Clock::ns(t, i.rate);
    let mut calls: Vec<CallStat> = i
        .merged
        .calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.0 > 0)
        .map(|(f, &(count, ticks, max))| {
            let total = ns(ticks);
            CallStat {
                name: i
                    .function_names
                    .get(f)
                    .map_or_else(|| format!("function#{f}"), |s| (*s).to_owned()),
                count,
                total_ns: total,
                mean_ns: total / count as f64,
                max_ns: ns(max),
            }
        })
        .collect();
    calls.sort_by(|a, b| {
        b.total_ns
            .total_cmp(&a.total_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    let kname = |k: u32| -> (String, String) {
        match i.kernel_names.get(k as usize) {
            Some(m) => (demangle(m), m.to_string()),
            None => (format!("kernel#{k}"), String::new()),
        }
    };
    let mut kernels: Vec<KernelStat> = i
        .merged
        .kernels
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(k, &launches)| {
            let (name, mangled) = kname(k as u32);
            KernelStat {
                name,
                mangled,
                launches,
            }
        })
        .collect();
    kernels.sort_by(|a, b| b.launches.cmp(&a.launches).then(a.name.cmp(&b.name)));
    let copies = Direction::ALL
        .iter()
        .zip(i.merged.copies.iter())
        .filter(|(_, c)| c.0 > 0)
        .map(|(d, &(count, bytes))| CopyStat {
            direction: d.as_str().to_owned(),
            count,
            bytes,
        })
        .collect();
    let alloc = |r: &Record| AllocStat {
        order: r.order,
        base: format!("{:#x}", r.base),
        size: r.size,
        api: r.api.to_owned(),
        site: r.site.as_ref().map(|s| s.to_string()),
        age_s: ns(i.now.saturating_sub(r.created)) / 1e9,
        copies_in: r.copies_in,
        bytes_in: r.bytes_in,
        copies_out: r.copies_out,
        bytes_out: r.bytes_out,
        launches: r.launches,
        kernels: r.kernels.iter().map(|&k| kname(k).0).collect(),
        idle_s: ns(i.now.saturating_sub(r.last_touched())) / 1e9,
    };
    let (live, live_bytes) = i
        .history
        .live()
        .fold((0, 0), |(n, b), r| (n + 1, b + r.size));
    Stats {
        transfers: TransferStat::default(),
        pid: i.pid,
        mode: i.mode.as_str().to_owned(),
        seconds: i.seconds,
        calls,
        kernels,
        copies,
        pauses: i.pauses,
        memory: MemoryStat {
            live,
            live_bytes,
            made: i.history.made(),
            freed: i.history.freed(),
            hottest: i.history.hottest(i.top).into_iter().map(alloc).collect(),
            coldest: i.history.coldest(i.top).into_iter().map(alloc).collect(),
        },
        timeline: i.timeline,
    }
}

/// A label value in the Prometheus text format: `\`, `"` and newlines escaped.
pub fn escape_label(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

impl Stats {
    /// The call of `name`, if it was called.
    pub fn call(&self, name: &str) -> Option<&CallStat> {
        self.calls.iter().find(|c| c.name == name)
    }

    /// Calls of `name` (0 if never called).
    pub fn count(&self, name: &str) -> u64 {
        self.call(name).map_or(0, |c| c.count)
    }

    /// The metrics in the Prometheus text exposition format (version 0.0.4).
    pub fn to_prometheus(&self) -> String {
        let mut o = String::new();
        let pid = self.pid;
        let family = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            &mut o,
            "cudaw_staged_copies_total",
            "counter",
            "Copies with pageable host memory run through cudaw's pinned staging.",
        );
        let _ = writeln!(
            o,
            "cudaw_staged_copies_total{{pid=\"{pid}\"}} {}",
            self.transfers.staged_copies
        );
        family(
            &mut o,
            "cudaw_staged_bytes_total",
            "counter",
            "Bytes of copies with pageable host memory run through cudaw's pinned staging.",
        );
        let _ = writeln!(
            o,
            "cudaw_staged_bytes_total{{pid=\"{pid}\"}} {}",
            self.transfers.staged_bytes
        );
        if self.transfers.pinning {
            let t = &self.transfers;
            for (name, kind, help, v) in [
                (
                    "cudaw_pinned_copies_total",
                    "counter",
                    "Copies from or to pageable ranges cudaw page-locked (smart pinning).",
                    t.hot_copies,
                ),
                (
                    "cudaw_pinned_copied_bytes_total",
                    "counter",
                    "Bytes of copies from or to ranges cudaw page-locked.",
                    t.hot_bytes,
                ),
                (
                    "cudaw_unpinned_copies_total",
                    "counter",
                    "Copies from or to pageable memory cudaw did not page-lock.",
                    t.cold_copies,
                ),
                (
                    "cudaw_pinned_bytes",
                    "gauge",
                    "Host bytes cudaw keeps page-locked now (smart pinning).",
                    t.pinned_bytes,
                ),
                (
                    "cudaw_pinned_bytes_peak",
                    "gauge",
                    "The most host bytes cudaw kept page-locked at once.",
                    t.peak_pinned_bytes,
                ),
                (
                    "cudaw_pin_released_total",
                    "counter",
                    "Ranges unpinned because the program gave their memory back.",
                    t.released,
                ),
                (
                    "cudaw_pin_refused_total",
                    "counter",
                    "Hot ranges not pinned: over CUDAW_PIN_MAX, or registering failed.",
                    t.refused,
                ),
            ] {
                family(&mut o, name, kind, help);
                let _ = writeln!(o, "{name}{{pid=\"{pid}\"}} {v}");
            }
        }
        family(
            &mut o,
            "cudaw_calls_total",
            "counter",
            "CUDA runtime calls, per function.",
        );
        for c in &self.calls {
            let _ = writeln!(
                o,
                "cudaw_calls_total{{pid=\"{pid}\",function=\"{}\"}} {}",
                escape_label(&c.name),
                c.count
            );
        }
        family(
            &mut o,
            "cudaw_call_seconds_total",
            "counter",
            "Seconds spent in CUDA runtime calls, per function.",
        );
        for c in &self.calls {
            let _ = writeln!(
                o,
                "cudaw_call_seconds_total{{pid=\"{pid}\",function=\"{}\"}} {:e}",
                escape_label(&c.name),
                c.total_ns / 1e9
            );
        }
        family(
            &mut o,
            "cudaw_call_seconds_max",
            "gauge",
            "The longest call, per function, in seconds.",
        );
        for c in &self.calls {
            let _ = writeln!(
                o,
                "cudaw_call_seconds_max{{pid=\"{pid}\",function=\"{}\"}} {:e}",
                escape_label(&c.name),
                c.max_ns / 1e9
            );
        }
        family(
            &mut o,
            "cudaw_kernel_launches_total",
            "counter",
            "Kernel launches, per kernel (demangled name).",
        );
        for k in &self.kernels {
            let _ = writeln!(
                o,
                "cudaw_kernel_launches_total{{pid=\"{pid}\",kernel=\"{}\"}} {}",
                escape_label(&k.name),
                k.launches
            );
        }
        family(
            &mut o,
            "cudaw_copies_total",
            "counter",
            "Memory copies, per direction.",
        );
        for c in &self.copies {
            let _ = writeln!(
                o,
                "cudaw_copies_total{{pid=\"{pid}\",direction=\"{}\"}} {}",
                c.direction, c.count
            );
        }
        family(
            &mut o,
            "cudaw_copy_bytes_total",
            "counter",
            "Bytes copied, per direction.",
        );
        for c in &self.copies {
            let _ = writeln!(
                o,
                "cudaw_copy_bytes_total{{pid=\"{pid}\",direction=\"{}\"}} {}",
                c.direction, c.bytes
            );
        }
        for (name, kind, help, v) in [
            (
                "cudaw_pauses_total",
                "counter",
                "Pauses.",
                self.pauses.pauses as f64,
            ),
            (
                "cudaw_resumes_total",
                "counter",
                "Resumes.",
                self.pauses.resumes as f64,
            ),
            (
                "cudaw_live_allocations",
                "gauge",
                "Live device allocations cudaw tracks.",
                self.memory.live as f64,
            ),
            (
                "cudaw_live_bytes",
                "gauge",
                "Bytes of the live device allocations cudaw tracks.",
                self.memory.live_bytes as f64,
            ),
        ] {
            family(&mut o, name, kind, help);
            let _ = writeln!(o, "{name}{{pid=\"{pid}\"}} {v}");
        }
        o
    }

    /// A few lines for people: the busiest calls, kernels, copies, hottest and coldest
    /// allocations (`top` of each).
    pub fn summary(&self, top: usize) -> String {
        let mut o = String::new();
        let calls: u64 = self.calls.iter().map(|c| c.count).sum();
        let _ = writeln!(
            o,
            "trace ({}): {calls} calls of {} functions over {:.1} s",
            self.mode,
            self.calls.len(),
            self.seconds
        );
        for c in self.calls.iter().take(top) {
            let _ = writeln!(
                o,
                "  {:<36} {:>10} calls  total {:>10.3} ms  mean {:>9.1} us  max {:>9.1} us",
                c.name,
                c.count,
                c.total_ns / 1e6,
                c.mean_ns / 1e3,
                c.max_ns / 1e3
            );
        }
        let launches: u64 = self.kernels.iter().map(|k| k.launches).sum();
        let _ = writeln!(
            o,
            "kernels: {launches} launches of {} kernels",
            self.kernels.len()
        );
        for k in self.kernels.iter().take(top) {
            let _ = writeln!(o, "  {:>10}  {}", k.launches, k.name);
        }
        for c in &self.copies {
            let _ = writeln!(
                o,
                "copies {}: {} ({:.1} MiB)",
                c.direction,
                c.count,
                c.bytes as f64 / (1u64 << 20) as f64
            );
        }
        if self.pauses.pauses + self.pauses.resumes > 0 {
            let _ = writeln!(
                o,
                "pauses: {} ({:.1} ms), resumes: {} ({:.1} ms)",
                self.pauses.pauses,
                self.pauses.pause_ms,
                self.pauses.resumes,
                self.pauses.resume_ms
            );
        }
        if self.transfers.staged_copies > 0 {
            let _ = writeln!(
                o,
                "pageable copies through cudaw's pinned staging: {} ({:.1} MiB)",
                self.transfers.staged_copies,
                self.transfers.staged_bytes as f64 / (1u64 << 20) as f64
            );
        }
        if self.transfers.pinning {
            let t = &self.transfers;
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let _ = writeln!(
                o,
                "smart pinning: {} copies ({:.1} MiB) from pinned ranges, {} ({:.1} MiB) from \
                 others; {:.1} MiB pinned now in {} ranges, at most {:.1} MiB; {} released, {} \
                 refused",
                t.hot_copies,
                mib(t.hot_bytes),
                t.cold_copies,
                mib(t.cold_bytes),
                mib(t.pinned_bytes),
                t.pinned_ranges,
                mib(t.peak_pinned_bytes),
                t.released,
                t.refused
            );
        }
        let m = &self.memory;
        let _ = writeln!(
            o,
            "memory: {} live allocations ({:.1} MiB), {} made, {} freed",
            m.live,
            m.live_bytes as f64 / (1u64 << 20) as f64,
            m.made,
            m.freed
        );
        let line = |o: &mut String, a: &AllocStat| {
            let _ = writeln!(
                o,
                "    #{} {} {} bytes ({}{}): in {}x {} B, out {}x {} B, {} launches, idle {:.2} s{}",
                a.order,
                a.base,
                a.size,
                a.api,
                a.site
                    .as_ref()
                    .map_or_else(String::new, |s| format!(" from {s}")),
                a.copies_in,
                a.bytes_in,
                a.copies_out,
                a.bytes_out,
                a.launches,
                a.idle_s,
                if a.kernels.is_empty() {
                    String::new()
                } else {
                    format!("; kernels {}", a.kernels.join(", "))
                }
            );
        };
        if !m.hottest.is_empty() {
            let _ = writeln!(o, "  hottest:");
            for a in m.hottest.iter().take(top) {
                line(&mut o, a);
            }
        }
        if !m.coldest.is_empty() {
            let _ = writeln!(o, "  coldest:");
            for a in m.coldest.iter().take(top) {
                line(&mut o, a);
            }
        }
        if let Some(t) = &self.timeline {
            let _ = writeln!(
                o,
                "timeline: {} events held (capacity {}), {} dropped",
                t.events, t.capacity, t.dropped
            );
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Direction, Mode, Tracer};

    #[test]
    fn counts_and_formats() {
        let t = Tracer::new(Config::new(Mode::Timeline));
        let base = t.register_functions(&["cudaMalloc", "cudaMemcpy", "cudaLaunchKernel"]);
        assert_eq!(base, 0);
        let drv = t.register_functions(&["cuLaunchKernel"]);
        assert_eq!(drv, 3);
        t.record_call(0, 100, 300);
        t.record_alloc(0x1000, 64, "cudaMalloc", Some("prog"));
        t.record_call(1, 400, 450);
        t.record_copy(Direction::HtoD, 64, 0x1000, 0x9999_0000, 400, 450);
        let k = t.kernel_id("_Z5scalePfif");
        assert_eq!(t.kernel_id("_Z5scalePfif"), k);
        t.record_launch(
            k,
            [1, 1, 1],
            [32, 1, 1],
            0,
            500,
            510,
            &[(0, 0x1008), (1, 7)],
        );
        t.record_call(2, 500, 510);
        std::thread::scope(|s| {
            s.spawn(|| t.record_call(2, 0, 1000));
        });
        let s = t.stats(42, 5);
        assert_eq!(s.count("cudaLaunchKernel"), 2);
        assert_eq!(s.call("cudaLaunchKernel").unwrap().max_ns, 1000.0);
        assert_eq!(s.count("cudaMalloc"), 1);
        assert_eq!(s.kernels[0].name, "scale(float*, int, float)");
        assert_eq!(s.kernels[0].launches, 1);
        assert_eq!(
            (s.copies[0].direction.as_str(), s.copies[0].count),
            ("HtoD", 1)
        );
        let hot = &s.memory.hottest[0];
        assert_eq!((hot.copies_in, hot.launches), (1, 1));
        assert_eq!(hot.kernels, vec!["scale(float*, int, float)".to_owned()]);
        assert_eq!(hot.site.as_deref(), Some("prog"));
        let back: super::Stats = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let mut s = s;
        s.transfers = super::TransferStat {
            staged_copies: 3,
            staged_bytes: 3 << 20,
            ..Default::default()
        };
        assert!(!s.to_prometheus().contains("cudaw_pinned_bytes"));
        let mut pinned = s.clone();
        pinned.transfers.pinning = true;
        pinned.transfers.hot_copies = 40;
        pinned.transfers.pinned_bytes = 16 << 20;
        let p = pinned.to_prometheus();
        assert!(
            p.contains("cudaw_pinned_copies_total{pid=\"42\"} 40\n"),
            "{p}"
        );
        assert!(
            p.contains(
                "# TYPE cudaw_pinned_bytes gauge\ncudaw_pinned_bytes{pid=\"42\"} 16777216\n"
            ),
            "{p}"
        );
        assert!(pinned
            .summary(10)
            .contains("smart pinning: 40 copies (0.0 MiB) from pinned ranges"));
        // A report from before pinning existed still reads.
        let old = r#"{"staged_copies":1,"staged_bytes":2}"#;
        let before: super::TransferStat = serde_json::from_str(old).unwrap();
        assert_eq!((before.staged_copies, before.pinning), (1, false));
        assert!(s
            .summary(10)
            .contains("pageable copies through cudaw's pinned staging: 3 (3.0 MiB)\n"));
        let p = s.to_prometheus();
        assert!(
            p.contains("cudaw_staged_copies_total{pid=\"42\"} 3\n"),
            "{p}"
        );
        assert!(
            p.contains("cudaw_staged_bytes_total{pid=\"42\"} 3145728\n"),
            "{p}"
        );
        assert!(
            p.contains("cudaw_calls_total{pid=\"42\",function=\"cudaLaunchKernel\"} 2\n"),
            "{p}"
        );
        assert!(p.contains(
            "cudaw_kernel_launches_total{pid=\"42\",kernel=\"scale(float*, int, float)\"} 1\n"
        ));
        assert!(s.summary(3).contains("scale(float*, int, float)"));
        let mut out = Vec::new();
        let n = t.write_timeline(&mut out, 42, "prog").unwrap();
        assert_eq!(n, 7);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let evs = v["traceEvents"].as_array().unwrap();
        let launch = evs.iter().find(|e| e["cat"] == "kernel").unwrap();
        assert_eq!(launch["name"], "scale(float*, int, float)");
        assert_eq!(launch["args"]["buffers"][0]["alloc"], 0);
        assert_eq!(launch["args"]["buffers"][0]["base"], "0x1000");
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(super::escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
