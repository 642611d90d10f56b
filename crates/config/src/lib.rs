//! cudaw's configuration: every `CUDAW_*` variable, read once from the environment into one
//! typed struct ([`Config`], [`get`]) shared by the engine, both shims and `cudaw run`.
//! A value that cannot be used is replaced by its default and reported in
//! [`Config::warnings`], never ignored silently.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Log levels, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Something failed.
    Error = 1,
    /// Something is off but cudaw carries on.
    Warn = 2,
    /// What cudaw did, once per event.
    Info = 3,
    /// Details for developers.
    Debug = 4,
    /// Every call.
    Trace = 5,
}

impl Level {
    /// Parses a level name; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            "off" | "none" => return Some(Level::Error),
            _ => return None,
        })
    }
}

/// How device pointers relate to device addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// The pointer is the device address (default).
    Mapped,
    /// Pointers come from a range the driver never hands out and are translated.
    Translated,
}

/// `CUDAW_TRACE_SAMPLE`'s default: with `metrics`, one call in 64 of each function is timed
/// (two `rdtsc`s, tens of ns on some hosts), the first included; every call is counted.
/// PyTorch makes about a thousand runtime calls a training step, most of them
/// `cudaGetDevice`: one in 16 timed cost it about 0.05% more (README, "What tracing costs").
pub const DEFAULT_TRACE_SAMPLE: u32 = 64;

/// `CUDAW_TRACE_BUFFER_SAMPLE`'s default: the memory history looks up the argument buffers
/// of one launch in 64 of each thread's launches of a kernel (the first included) and counts
/// it 64 times; every launch is counted per kernel. The timeline still shows every launch's
/// buffers: it keeps each launch's words and resolves them when it is read. A looked-up
/// launch costs about a microsecond (a multi-tensor kernel's table of hundreds of words is
/// scanned, and each pointer into an allocation found): one in 16 cost a PyTorch step about
/// 0.15% more.
pub const DEFAULT_BUFFER_SAMPLE: u32 = 64;

/// A power of two from 1 to 65536 in variable `key` (`None`: unset or empty); a warning and
/// the next power of two, or `default`, for anything else.
fn power_of_two(
    get: &impl Fn(&str) -> Option<String>,
    key: &str,
    default: u32,
    warnings: &mut Vec<String>,
) -> Option<u32> {
    let v = get(key).filter(|v| !v.trim().is_empty())?;
    Some(match v.trim().parse::<u32>() {
        Ok(n) if (1..=65536).contains(&n) && n.is_power_of_two() => n,
        Ok(n) if (1..=65536).contains(&n) => {
            warnings.push(format!(
                "{key}={v:?} is not a power of two; using {}",
                n.next_power_of_two()
            ));
            n.next_power_of_two()
        }
        _ => {
            warnings.push(format!(
                "{key}={v:?} is not a power of two from 1 to 65536; using {default}"
            ));
            default
        }
    })
}

/// Everything cudaw reads from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// `CUDAW_LOG`.
    pub log_level: Level,
    /// `CUDAW_REAL_CUDART`: the real runtime to forward to.
    pub real_cudart: Option<PathBuf>,
    /// `CUDAW_LIBCUDA`: the driver library cudaw itself uses.
    pub libcuda: Option<PathBuf>,
    /// `CUDAW_ADDRESSING`.
    pub addressing: Addressing,
    /// `CUDAW_MEM_LIMIT`: the device memory limits (sizes, percentages, per device); unset
    /// or empty: none. `Err`: a value that cannot be enforced, with the message to log —
    /// every device allocation is then refused (a limit is never ignored).
    pub mem_limits: Result<MemLimits, String>,
    /// `CUDAW_LEDGER` (`off` keeps this process out of the node ledger; default on).
    pub ledger: bool,
    /// `CUDAW_NODE_DIR`: the node ledger's folder (default `/dev/shm`, else `/tmp`).
    pub node_dir: PathBuf,
    /// `CUDAW_PAUSE_SIGNAL` (default `SIGUSR1`; `off` disables pause and resume).
    pub pause_signal: Option<i32>,
    /// `CUDAW_RESUME_SIGNAL` (default `SIGUSR2`; `off` disables pause and resume).
    pub resume_signal: Option<i32>,
    /// `CUDAW_CONTROL_SOCKET` (`off` turns the control socket off; default on).
    pub control_socket: bool,
    /// `CUDAW_PAUSE_TIMEOUT`: how long a pause waits for the calls in flight and the
    /// device's work before it gives up and lets the program run on (`None`: for ever).
    pub pause_timeout: Option<std::time::Duration>,
    /// `CUDAW_STAGING_STREAMS`, `CUDAW_STAGING_BUFFER`, `CUDAW_STAGING_THREADS`: how
    /// pause and resume copy.
    pub staging: driver::StagingConfig,
    /// `CUDAW_PIN`: smart pinning of hot pageable host ranges (`off`, the default until
    /// the GPU runs measure it; `auto`, `profile:FILE`, `use:FILE`).
    pub pin: cudaw_pin::Mode,
    /// `CUDAW_PIN_MAX`: the most bytes pinning keeps page-locked (a size; default an
    /// eighth of the machine's memory, at most 64 GiB).
    pub pin_max: Option<u64>,
    /// `CUDAW_PIN_COSTS`: what copies and registering cost here (`pin_bench costs`
    /// measures them); default the estimates of [`cudaw_pin::Costs::default`].
    pub pin_costs: cudaw_pin::Costs,
    /// `CUDAW_TRACE`: `metrics`, `timeline` or off (default).
    pub trace: cudaw_trace::Mode,
    /// `CUDAW_TRACE_FILE`: where the timeline is written at exit (default
    /// `cudaw-PID.trace.json` in the working folder).
    pub trace_file: Option<PathBuf>,
    /// `CUDAW_TRACE_EVENTS`: the timeline ring's capacity in events.
    pub trace_events: usize,
    /// `CUDAW_TRACE_SAMPLE`: with `metrics`, time one call in this many of each function
    /// (a power of two; every call is counted; default [`DEFAULT_TRACE_SAMPLE`], 1 times
    /// every call).
    pub trace_sample: u32,
    /// `CUDAW_TRACE_BUFFER_SAMPLE`: of each thread's launches of a kernel, those whose
    /// argument buffers the memory history looks up (which allocations the launch
    /// received): one in this many (a power of two, the first launch included; default
    /// [`DEFAULT_BUFFER_SAMPLE`]; 1: exact counts).
    pub trace_buffer_sample: u32,
    /// `CUDAW_TRACE_CALLS` (default on; `off`: with tracing on, calls are not counted,
    /// timed nor put in the timeline — launches, copies, allocations and the memory history
    /// still are — and every export keeps its untraced trampoline path).
    pub trace_calls: bool,
    /// `CUDAW_TRACE_DRIVER` (default on; `off`: with tracing on, cudaw's driver layer
    /// records nothing, so the launches and copies that libraries make through the driver
    /// API (cuBLAS, cuDNN, Triton) are missing from the metrics, the memory history and the
    /// timeline; what goes through the runtime is recorded as before).
    pub trace_driver: bool,
    /// `CUDAW_TRACE_DIRECT` (default on; `off`: a timed call always has its return address
    /// swapped for the fast path's thunk, even where its arguments all travel in registers
    /// and the fast path could call it from its own frame).
    pub trace_direct: bool,
    /// `CUDAW_DIRECT_LAUNCHES` (default on; `off` keeps the runtime layer's thin wrapper on
    /// the launch exports even where the driver layer marks the launches:
    /// the runtime shim's `launch_bypass` module).
    pub direct_launches: bool,
    /// `CUDAW_RELEASE_ON_PAUSE` (`1`, `on`; default off; `cudaw run --release-on-pause`):
    /// `cudaw-ckpt pause` releases the context too (as `--release`) unless told
    /// `--no-release`; the status says so. A signal's pause cannot: NVIDIA's API is called
    /// from another process.
    pub release_on_pause: bool,
    /// `CUDAW_JOB` (`cudaw run --job ID`): the job this process belongs to for the node
    /// scheduler (`cudaw node`); `None` without one (a job of its own). Letters, digits,
    /// `-`, `_`, `.` and `:`, at most 64; anything else is refused with a warning.
    pub job: Option<String>,
    /// `CUDAW_ALLOC_WAIT`: how long an allocation that does not fit waits for the node
    /// scheduler to make room (`auto`, the default, is `None`: 30 s when a node daemon's
    /// socket is found, else no wait; `off` is zero).
    pub alloc_wait: Option<std::time::Duration>,
    /// `CUDAW_NODE_SOCKET`: the node daemon's socket, where not in a default place.
    pub node_socket: Option<PathBuf>,
    /// `CUDAW_RUN_DIR`, when set.
    pub run_dir: Option<PathBuf>,
    /// Problems found while reading (reported once logging works).
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads the configuration from a variable lookup (the environment, or a test's map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut warnings = Vec::new();
        let log_level = match get("CUDAW_LOG") {
            None => Level::Warn,
            Some(v) => Level::parse(&v).unwrap_or_else(|| {
                warnings.push(format!(
                    "CUDAW_LOG={v:?} is not one of error, warn, info, debug, trace; using warn"
                ));
                Level::Warn
            }),
        };
        let addressing = match get("CUDAW_ADDRESSING").as_deref() {
            None | Some("") | Some("mapped") => Addressing::Mapped,
            Some("translated") => Addressing::Translated,
            Some(other) => {
                warnings.push(format!(
                    "CUDAW_ADDRESSING={other:?} is not mapped or translated; using mapped"
                ));
                Addressing::Mapped
            }
        };
        let mem_limits = match get("CUDAW_MEM_LIMIT") {
            None => Ok(MemLimits::default()),
            Some(v) => MemLimits::parse(&v).map_err(|e| {
                format!(
                    "CUDAW_MEM_LIMIT={v:?} cannot be enforced: {e}; every device allocation fails with out of memory until it is corrected or unset (valid: {}; empty or unset: no limit)",
                    cudaw_ledger::spec::SYNTAX
                )
            }),
        };
        let mut signal = |k: &str, default: i32| {
            match get(k).filter(|v| !v.trim().is_empty()) {
            None => Some(default),
            Some(v) if matches!(v.trim(), "off" | "none" | "0") => None,
            Some(v) => parse_signal(&v).or_else(|| {
                warnings.push(format!(
                    "{k}={v:?} is not a signal (USR1, SIGUSR2, RTMIN+3, a number, or off); using {default}"
                ));
                Some(default)
            }),
        }
        };
        let pause_signal = signal("CUDAW_PAUSE_SIGNAL", libc::SIGUSR1);
        let resume_signal = signal("CUDAW_RESUME_SIGNAL", libc::SIGUSR2);
        let (pause_signal, resume_signal) = match (pause_signal, resume_signal) {
            (Some(p), Some(r)) if p == r => {
                warnings.push(format!(
                    "the pause and resume signals are the same ({p}); pause and resume are off"
                ));
                (None, None)
            }
            (Some(p), Some(r)) => (Some(p), Some(r)),
            _ => (None, None),
        };
        let staging = driver::StagingConfig::from_lookup(&get, &mut warnings);
        let pin = match get("CUDAW_PIN").map(|v| v.trim().to_owned()) {
            None => cudaw_pin::Mode::Off,
            Some(v) if v.is_empty() => cudaw_pin::Mode::Off,
            Some(v) => cudaw_pin::Mode::parse(&v).unwrap_or_else(|e| {
                warnings.push(format!("{e}; pinning is off"));
                cudaw_pin::Mode::Off
            }),
        };
        let pin_costs = match get("CUDAW_PIN_COSTS") {
            None => cudaw_pin::Costs::default(),
            Some(v) => cudaw_pin::Costs::parse(&v).unwrap_or_else(|e| {
                warnings.push(format!("{e}; the estimated costs apply"));
                cudaw_pin::Costs::default()
            }),
        };
        let pin_max = get("CUDAW_PIN_MAX")
            .filter(|v| !v.trim().is_empty())
            .and_then(|v| {
                let n = vmm::config::parse_size(&v);
                if n.is_none() {
                    warnings.push(format!(
                        "CUDAW_PIN_MAX={v:?} is no size (8G, 512M, bytes); the default applies"
                    ));
                }
                n
            });
        let trace = match get("CUDAW_TRACE") {
            None => cudaw_trace::Mode::Off,
            Some(v) => cudaw_trace::Mode::parse(&v).unwrap_or_else(|e| {
                warnings.push(format!("{e}; tracing is off"));
                cudaw_trace::Mode::Off
            }),
        };
        let trace_events = match get("CUDAW_TRACE_EVENTS").filter(|v| !v.trim().is_empty()) {
            None => cudaw_trace::DEFAULT_RING_EVENTS,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 16 => n,
                _ => {
                    warnings.push(format!(
                        "CUDAW_TRACE_EVENTS={v:?} is not a number of events (16 or more); using {}",
                        cudaw_trace::DEFAULT_RING_EVENTS
                    ));
                    cudaw_trace::DEFAULT_RING_EVENTS
                }
            },
        };
        let trace_sample = power_of_two(
            &get,
            "CUDAW_TRACE_SAMPLE",
            DEFAULT_TRACE_SAMPLE,
            &mut warnings,
        )
        .unwrap_or(DEFAULT_TRACE_SAMPLE);
        let trace_buffer_sample = power_of_two(
            &get,
            "CUDAW_TRACE_BUFFER_SAMPLE",
            DEFAULT_BUFFER_SAMPLE,
            &mut warnings,
        )
        .unwrap_or(DEFAULT_BUFFER_SAMPLE);
        let pause_timeout = match get("CUDAW_PAUSE_TIMEOUT").filter(|v| !v.trim().is_empty()) {
            None => Some(DEFAULT_PAUSE_TIMEOUT),
            Some(v) => parse_timeout(&v).unwrap_or_else(|| {
                warnings.push(format!(
                    "CUDAW_PAUSE_TIMEOUT={v:?} is not a time ({TIMEOUT_SYNTAX}); using {} s",
                    DEFAULT_PAUSE_TIMEOUT.as_secs()
                ));
                Some(DEFAULT_PAUSE_TIMEOUT)
            }),
        };
        let alloc_wait = match get("CUDAW_ALLOC_WAIT").map(|v| v.trim().to_owned()) {
            None => None,
            Some(v) if v.is_empty() || v == "auto" => None,
            Some(v) => match parse_timeout(&v) {
                // `off` (no limit, for a pause) is no wait here.
                Some(None) => Some(std::time::Duration::ZERO),
                Some(Some(d)) => Some(d),
                None => {
                    warnings.push(format!(
                        "CUDAW_ALLOC_WAIT={v:?} is not a time ({TIMEOUT_SYNTAX}, or auto); using auto"
                    ));
                    None
                }
            },
        };
        let path = |k: &str| get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        // An on/off variable, on unless `off`, `none` or `0`.
        let switch =
            |k: &str| !matches!(get(k).as_deref().map(str::trim), Some("off" | "none" | "0"));
        Config {
            log_level,
            real_cudart: path("CUDAW_REAL_CUDART"),
            libcuda: path("CUDAW_LIBCUDA"),
            addressing,
            mem_limits,
            ledger: switch("CUDAW_LEDGER"),
            node_dir: cudaw_ledger::ledger::node_dir(&get),
            pause_signal,
            resume_signal,
            control_socket: switch("CUDAW_CONTROL_SOCKET"),
            pause_timeout,
            staging,
            pin,
            pin_max,
            pin_costs,
            trace,
            trace_file: path("CUDAW_TRACE_FILE"),
            trace_events,
            trace_sample,
            trace_buffer_sample,
            trace_calls: switch("CUDAW_TRACE_CALLS"),
            trace_driver: switch("CUDAW_TRACE_DRIVER"),
            trace_direct: switch("CUDAW_TRACE_DIRECT"),
            direct_launches: switch("CUDAW_DIRECT_LAUNCHES"),
            release_on_pause: matches!(
                get("CUDAW_RELEASE_ON_PAUSE")
                    .map(|v| v.trim().to_ascii_lowercase())
                    .as_deref(),
                Some("1" | "on" | "yes" | "true")
            ),
            alloc_wait,
            node_socket: path("CUDAW_NODE_SOCKET"),
            run_dir: path("CUDAW_RUN_DIR"),
            job: match get("CUDAW_JOB").map(|v| v.trim().to_owned()) {
                None => None,
                Some(v) if v.is_empty() => None,
                Some(v) if cudaw_control::job_id_ok(&v) => Some(v),
                Some(v) => {
                    warnings.push(format!(
                        "CUDAW_JOB={v:?} is not a job id (letters, digits, '-', '_', '.', ':', at most 64): the process is a job of its own"
                    ));
                    None
                }
            },
            warnings,
        }
    }
}

pub use cudaw_control::{parse_timeout, DEFAULT_PAUSE_TIMEOUT, TIMEOUT_SYNTAX};

/// The limit syntax of `CUDAW_MEM_LIMIT` (one parser, shared with `cudaw run --mem-limit`).
pub use cudaw_ledger::MemLimits;

/// Parses a signal: a name with or without `SIG` (`USR1`, `SIGUSR2`, `HUP`, `RTMIN+3`), or
/// a number. Signals a program cannot catch (`KILL`, `STOP`) and out-of-range numbers are
/// refused.
pub fn parse_signal(s: &str) -> Option<i32> {
    let s = s.trim().to_ascii_uppercase();
    let name = s.strip_prefix("SIG").unwrap_or(&s);
    let n = if let Ok(n) = name.parse::<i32>() {
        n
    } else if let Some(off) = name.strip_prefix("RTMIN") {
        let off = match off.strip_prefix('+') {
            Some(k) => k.parse::<i32>().ok()?,
            None if off.is_empty() => 0,
            None => return None,
        };
        libc::SIGRTMIN() + off
    } else {
        match name {
            "USR1" => libc::SIGUSR1,
            "USR2" => libc::SIGUSR2,
            "HUP" => libc::SIGHUP,
            "INT" => libc::SIGINT,
            "QUIT" => libc::SIGQUIT,
            "TERM" => libc::SIGTERM,
            "CONT" => libc::SIGCONT,
            "URG" => libc::SIGURG,
            "WINCH" => libc::SIGWINCH,
            "PWR" => libc::SIGPWR,
            _ => return None,
        }
    };
    let ok = n > 0 && n <= libc::SIGRTMAX() && n != libc::SIGKILL && n != libc::SIGSTOP;
    ok.then_some(n)
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process's configuration, read on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| Config::from_lookup(|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn memory_limits_from_the_environment() {
        let with = |v: &str| {
            let v = v.to_owned();
            Config::from_lookup(move |k| (k == "CUDAW_MEM_LIMIT").then(|| v.clone()))
        };
        let total = 80 << 30;
        let limits = |v: &str| with(v).mem_limits.unwrap();
        assert_eq!(limits("8G").resolve(0, total), Some(8 << 30));
        assert_eq!(limits("1.5G").resolve(3, total), Some(3 << 29));
        assert_eq!(limits("25%").resolve(0, total), Some(20 << 30));
        let per = limits("0:8G,1:4G");
        assert_eq!(
            (
                per.resolve(0, total),
                per.resolve(1, total),
                per.resolve(2, total)
            ),
            (Some(8 << 30), Some(4 << 30), None)
        );
        assert!(limits("").is_empty());
        assert!(limits("  ").is_empty());
        assert!(Config::from_lookup(|_| None).mem_limits.unwrap().is_empty());
        // Values that cannot be enforced are refused, never taken as no limit: the
        // message names the value and says what is valid.
        for (v, says) in [
            ("lots", "\"lots\" is not a size"),
            ("garbage", "\"garbage\" is not a size"),
            ("0", "0 bytes"),
            ("-1", "must be above 0"),
            ("200%", "at most 100"),
            ("0:8G,,1:4G", "empty item"),
            ("0:8G,0:4G", "two limits"),
            ("0:", "\"0:\""),
        ] {
            let e = with(v).mem_limits.unwrap_err();
            assert!(
                e.starts_with(&format!("CUDAW_MEM_LIMIT={v:?} cannot be enforced: "))
                    && e.contains(says)
                    && e.contains("every device allocation fails with out of memory")
                    && e.contains("valid: a size above 0"),
                "{v}: {e}"
            );
            assert!(with(v).warnings.is_empty());
        }
        assert!(Config::from_lookup(|_| None).ledger);
        assert!(!Config::from_lookup(|k| (k == "CUDAW_LEDGER").then(|| "off".into())).ledger);
        let dir = |k: &'static str, v: &'static str| {
            Config::from_lookup(move |key| (key == k).then(|| v.into())).node_dir
        };
        assert_eq!(
            dir("CUDAW_NODE_DIR", "/srv/cudaw-node"),
            PathBuf::from("/srv/cudaw-node")
        );
        let default = dir("CUDAW_NODE_DIR", "");
        assert!(
            default == Path::new("/dev/shm") || default == Path::new("/tmp"),
            "{default:?}"
        );
        // The ledger is the node's, not the user's: the run folder does not move it.
        assert_eq!(dir("CUDAW_RUN_DIR", "/run/user/5/cudaw"), default);
    }

    #[test]
    fn pause_timeouts() {
        use std::time::Duration;
        let secs = |s: f64| Some(Some(Duration::from_secs_f64(s)));
        assert_eq!(parse_timeout("60"), secs(60.0));
        assert_eq!(parse_timeout(" 2.5s "), secs(2.5));
        assert_eq!(parse_timeout("500ms"), secs(0.5));
        assert_eq!(parse_timeout("2m"), secs(120.0));
        for off in ["off", "none", "0", "OFF"] {
            assert_eq!(parse_timeout(off), Some(None), "{off}");
        }
        for bad in ["", "soon", "-1", "1h", "nan", "inf", "1e30"] {
            assert_eq!(parse_timeout(bad), None, "{bad}");
        }
        let with = |v: &'static str| {
            Config::from_lookup(move |k| (k == "CUDAW_PAUSE_TIMEOUT").then(|| v.into()))
        };
        assert_eq!(
            Config::from_lookup(|_| None).pause_timeout,
            Some(DEFAULT_PAUSE_TIMEOUT)
        );
        assert_eq!(with("off").pause_timeout, None);
        assert_eq!(
            with("250ms").pause_timeout,
            Some(Duration::from_millis(250))
        );
        let bad = with("later");
        assert_eq!(bad.pause_timeout, Some(DEFAULT_PAUSE_TIMEOUT));
        assert!(
            bad.warnings
                .iter()
                .any(|w| w.contains("CUDAW_PAUSE_TIMEOUT")),
            "{:?}",
            bad.warnings
        );
    }

    #[test]
    fn defaults_and_bad_values() {
        let c = Config::from_lookup(|_| None);
        assert_eq!(c.addressing, Addressing::Mapped);
        assert_eq!(c.log_level, Level::Warn);
        let c = Config::from_lookup(|k| match k {
            "CUDAW_ADDRESSING" => Some("sideways".into()),
            "CUDAW_LOG" => Some("debug".into()),
            _ => None,
        });
        assert_eq!(c.addressing, Addressing::Mapped);
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(c.warnings.len(), 1);
        assert!(c.warnings[0].contains("sideways"));
        let c = Config::from_lookup(|k| (k == "CUDAW_STAGING_STREAMS").then(|| "3".into()));
        assert_eq!(c.staging.streams, 3);
        assert_eq!(c.trace, cudaw_trace::Mode::Off);
        let c = Config::from_lookup(|k| match k {
            "CUDAW_TRACE" => Some("timeline".into()),
            "CUDAW_TRACE_EVENTS" => Some("1000".into()),
            "CUDAW_TRACE_FILE" => Some("/tmp/t.json".into()),
            _ => None,
        });
        assert_eq!(
            (c.trace, c.trace_events, c.trace_file),
            (
                cudaw_trace::Mode::Timeline,
                1000,
                Some(PathBuf::from("/tmp/t.json"))
            )
        );
        assert_eq!(c.trace_sample, DEFAULT_TRACE_SAMPLE);
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE_SAMPLE").then(|| "1".into()));
        assert_eq!((c.trace_sample, c.warnings.len()), (1, 0));
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE_SAMPLE").then(|| "16".into()));
        assert_eq!((c.trace_sample, c.warnings.len()), (16, 0));
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE_SAMPLE").then(|| "10".into()));
        assert_eq!((c.trace_sample, c.warnings.len()), (16, 1));
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE_SAMPLE").then(|| "0".into()));
        assert_eq!(
            (c.trace_sample, c.warnings.len()),
            (DEFAULT_TRACE_SAMPLE, 1)
        );
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE").then(|| "metrics".into()));
        assert_eq!(c.trace_buffer_sample, DEFAULT_BUFFER_SAMPLE);
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE").then(|| "timeline".into()));
        assert_eq!(c.trace_buffer_sample, DEFAULT_BUFFER_SAMPLE);
        let c = Config::from_lookup(|k| match k {
            "CUDAW_TRACE" => Some("metrics".into()),
            "CUDAW_TRACE_BUFFER_SAMPLE" => Some("1".into()),
            _ => None,
        });
        assert_eq!((c.trace_buffer_sample, c.warnings.len()), (1, 0));
        let c = Config::from_lookup(|k| match k {
            "CUDAW_TRACE" => Some("timeline".into()),
            "CUDAW_TRACE_BUFFER_SAMPLE" => Some("many".into()),
            _ => None,
        });
        assert_eq!(
            (c.trace_buffer_sample, c.warnings.len()),
            (DEFAULT_BUFFER_SAMPLE, 1)
        );
        assert!(
            c.warnings[0].contains("CUDAW_TRACE_BUFFER_SAMPLE"),
            "{:?}",
            c.warnings
        );
        assert!(c.trace_driver);
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE_DRIVER").then(|| "off".into()));
        assert!(!c.trace_driver);
        let c = Config::from_lookup(|k| (k == "CUDAW_TRACE").then(|| "loud".into()));
        assert_eq!(c.trace, cudaw_trace::Mode::Off);
        assert!(
            c.warnings[0].contains("CUDAW_TRACE=\"loud\""),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("USR1"), Some(libc::SIGUSR1));
        assert_eq!(parse_signal("sigusr2"), Some(libc::SIGUSR2));
        assert_eq!(parse_signal("10"), Some(10));
        assert_eq!(parse_signal("RTMIN+2"), Some(libc::SIGRTMIN() + 2));
        assert_eq!(parse_signal("KILL"), None);
        assert_eq!(parse_signal("9"), None);
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("bogus"), None);
        let c = Config::from_lookup(|_| None);
        assert_eq!(
            (c.pause_signal, c.resume_signal),
            (Some(libc::SIGUSR1), Some(libc::SIGUSR2))
        );
        let c = Config::from_lookup(|k| match k {
            "CUDAW_PAUSE_SIGNAL" => Some("SIGHUP".into()),
            "CUDAW_RESUME_SIGNAL" => Some("nonsense".into()),
            _ => None,
        });
        assert_eq!(
            (c.pause_signal, c.resume_signal),
            (Some(libc::SIGHUP), Some(libc::SIGUSR2))
        );
        assert_eq!(c.warnings.len(), 1);
        let c = Config::from_lookup(|k| (k == "CUDAW_PAUSE_SIGNAL").then(|| "off".into()));
        assert_eq!((c.pause_signal, c.resume_signal), (None, None));
        let c = Config::from_lookup(|k| k.ends_with("_SIGNAL").then(|| "USR1".into()));
        assert_eq!((c.pause_signal, c.resume_signal), (None, None));
    }
}
