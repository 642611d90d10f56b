//! [`Config::parse`]: the TOML read into spanned raw values, then each field checked with
//! the line it came from.

use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::{Config, ConfigError, JobSpec, MemSpec};

/// The file as written: every value spanned, so a fault names its line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    quantum: Option<Spanned<Value>>,
    min_quantum: Option<Spanned<Value>>,
    max_quantum: Option<Spanned<Value>>,
    default: Option<Spanned<RawJob>>,
    job: Option<Spanned<Vec<Spanned<RawJob>>>>,
}

/// One `[[job]]` or the `[default]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    id: Option<Spanned<Value>>,
    request: Option<Spanned<Value>>,
    limit: Option<Spanned<Value>>,
    memory: Option<Spanned<Value>>,
    priority: Option<Spanned<Value>>,
    gpus: Option<Spanned<Value>>,
}

/// Line numbers (1-based) of byte offsets in the text.
struct Lines<'a>(&'a str);

impl Lines<'_> {
    fn of(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.0.len());
        self.0.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn err<T>(&self, span: Range<usize>, message: String) -> Result<T, ConfigError> {
        Err(ConfigError {
            line: self.of(span),
            message,
        })
    }
}

/// How a value is shown in a message: as written in TOML (`"8X"`, `1.5`, `[1, 2]`).
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

const DURATION_EXPECTED: &str = "a duration with a unit such as \"50ms\", \"0.2s\" or \"1s\"";
const MEMORY_EXPECTED: &str = "bytes (an integer), a size such as \"8G\", \"512M\" or \
     \"1.5GiB\" (binary units K, M, G, T), or a percentage of the card such as \"75%\"";

pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    let lines = Lines(text);
    let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError {
        line: e.span().map_or(0, |s| lines.of(s)),
        message: e.message().trim_end().to_owned(),
    })?;
    let base = Config::default();

    let quantum = duration(&lines, "quantum", raw.quantum.as_ref())?.unwrap_or(base.quantum);
    let min_q = duration(&lines, "min_quantum", raw.min_quantum.as_ref())?;
    let max_q = duration(&lines, "max_quantum", raw.max_quantum.as_ref())?;
    let min_quantum = min_q.unwrap_or(base.min_quantum);
    let max_quantum = max_q.unwrap_or(base.max_quantum);
    if min_quantum > max_quantum {
        let span = match (&raw.min_quantum, &raw.max_quantum) {
            (Some(s), _) | (None, Some(s)) => s.span(),
            (None, None) => 0..0,
        };
        return lines.err(
            span,
            format!(
                "min_quantum {min_quantum:?} is longer than max_quantum {max_quantum:?}; \
                 expected min_quantum at most max_quantum"
            ),
        );
    }
    if quantum < min_quantum || quantum > max_quantum {
        let span = raw.quantum.as_ref().map_or(0..0, |s| s.span());
        return lines.err(
            span,
            format!(
                "quantum {quantum:?} is outside min_quantum..max_quantum \
                 ({min_quantum:?}..{max_quantum:?}); expected a quantum within them \
                 (set min_quantum / max_quantum too)"
            ),
        );
    }

    let default = match &raw.default {
        Some(t) => {
            if let Some(id) = &t.get_ref().id {
                return lines.err(
                    id.span(),
                    format!(
                        "default.id: {} given; expected no id in [default] (it applies to \
                         every job not listed)",
                        shown(id.get_ref())
                    ),
                );
            }
            job(&lines, "default", t.get_ref(), &base.default)?
        }
        None => base.default.clone(),
    };

    let mut jobs: Vec<JobSpec> = Vec::new();
    let mut sum = 0.0;
    for (i, t) in raw.job.iter().flat_map(|a| a.get_ref().iter()).enumerate() {
        let r = t.get_ref();
        let id = match &r.id {
            None => {
                return lines.err(
                    t.span(),
                    format!(
                        "job #{}: no id; expected id = \"NAME\" (the name given to \
                         `cudaw run --job NAME`)",
                        i + 1
                    ),
                )
            }
            Some(v) => match v.get_ref() {
                Value::String(s) if !s.trim().is_empty() && s.trim() == s => s.clone(),
                other => {
                    return lines.err(
                        v.span(),
                        format!(
                            "job #{}: id {} is not a name; expected a non-empty string \
                             without surrounding spaces",
                            i + 1,
                            shown(other)
                        ),
                    )
                }
            },
        };
        if let Some(first) = jobs.iter().position(|j| j.id == id) {
            return lines.err(
                r.id.as_ref().map_or(t.span(), |v| v.span()),
                format!(
                    "job #{}: id {id:?} is already the id of job #{}; expected each job's id \
                     once",
                    i + 1,
                    first + 1
                ),
            );
        }
        let mut spec = job(&lines, &format!("job {id:?}"), r, &default)?;
        spec.id = id.clone();
        sum += spec.request;
        if sum > 1.0 + 1e-9 {
            let span = r.request.as_ref().map_or(t.span(), |v| v.span());
            return lines.err(
                span,
                format!(
                    "job {id:?}: request {} brings the jobs' requests to {}; expected the \
                     requests of all jobs to sum to at most 1",
                    spec.request,
                    (sum * 1e6).round() / 1e6
                ),
            );
        }
        jobs.push(spec);
    }

    Ok(Config {
        jobs,
        default,
        quantum,
        min_quantum,
        max_quantum,
    })
}

/// A `[[job]]` or `[default]` table's fields, each missing one taken from `base`.
fn job(lines: &Lines, who: &str, r: &RawJob, base: &JobSpec) -> Result<JobSpec, ConfigError> {
    let request = match &r.request {
        Some(v) => share(lines, who, "request", v)?,
        None => base.request,
    };
    let limit = match &r.limit {
        Some(v) => share(lines, who, "limit", v)?,
        None => base.limit,
    };
    if limit < request {
        let (span, from) = match (&r.limit, &r.request) {
            (Some(l), _) => (l.span(), ""),
            (None, Some(q)) => (q.span(), " (from [default])"),
            (None, None) => (0..0, " (from [default])"),
        };
        return lines.err(
            span,
            format!(
                "{who}: limit {limit}{from} is below request {request}; expected a limit of \
                 at least the request"
            ),
        );
    }
    let memory = match &r.memory {
        Some(v) => Some(memory(lines, who, v)?),
        None => base.memory,
    };
    let priority = match &r.priority {
        Some(v) => match v.get_ref() {
            Value::Integer(n) if i32::try_from(*n).is_ok() => *n as i32,
            other => {
                return lines.err(
                    v.span(),
                    format!(
                        "{who}: priority {} is not an integer; expected a whole number from \
                         {} to {} (higher is swapped out later)",
                        shown(other),
                        i32::MIN,
                        i32::MAX
                    ),
                )
            }
        },
        None => base.priority,
    };
    let gpus = match &r.gpus {
        Some(v) => Some(gpus(lines, who, v)?),
        None => base.gpus.clone(),
    };
    Ok(JobSpec {
        id: String::new(),
        request,
        limit,
        memory,
        priority,
        gpus,
    })
}

fn share(lines: &Lines, who: &str, field: &str, v: &Spanned<Value>) -> Result<f64, ConfigError> {
    let x = match v.get_ref() {
        Value::Float(f) => Some(*f),
        Value::Integer(n) => Some(*n as f64),
        _ => None,
    };
    let problem = match x {
        Some(x) if (0.0..=1.0).contains(&x) => return Ok(x),
        Some(_) => "is out of range",
        None => "is not a number",
    };
    lines.err(
        v.span(),
        format!(
            "{who}: {field} {} {problem}; expected a share of the GPU's time from 0 to 1 \
                 (0.25 is a quarter)",
            shown(v.get_ref())
        ),
    )
}

fn memory(lines: &Lines, who: &str, v: &Spanned<Value>) -> Result<MemSpec, ConfigError> {
    let parsed = match v.get_ref() {
        Value::Integer(n) if *n > 0 => Some(MemSpec::Bytes(*n as u64)),
        Value::String(s) => match s.trim().strip_suffix('%') {
            Some(p) => p
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|p| *p > 0.0 && *p <= 100.0)
                .map(|p| MemSpec::Fraction(p / 100.0)),
            None => parse_size(s).filter(|&b| b > 0).map(MemSpec::Bytes),
        },
        _ => None,
    };
    match parsed {
        Some(m) => Ok(m),
        None => lines.err(
            v.span(),
            format!(
                "{who}: memory {} is not a size; expected {MEMORY_EXPECTED}, more than 0 \
                 and at most 100%",
                shown(v.get_ref())
            ),
        ),
    }
}

fn gpus(lines: &Lines, who: &str, v: &Spanned<Value>) -> Result<Vec<String>, ConfigError> {
    let bad = || {
        lines.err(
            v.span(),
            format!(
                "{who}: gpus {} is not a list of GPUs; expected a list of UUIDs or indexes \
                 such as [\"GPU-8e0c…\", 1]",
                shown(v.get_ref())
            ),
        )
    };
    let Value::Array(items) = v.get_ref() else {
        return bad();
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::String(s) if !s.trim().is_empty() => out.push(s.trim().to_owned()),
            Value::Integer(n) if *n >= 0 => out.push(n.to_string()),
            _ => return bad(),
        }
    }
    Ok(out)
}

fn duration(
    lines: &Lines,
    field: &str,
    v: Option<&Spanned<Value>>,
) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let parsed = match v.get_ref() {
        Value::String(s) => parse_duration(s),
        _ => None,
    };
    match parsed {
        Some(d) if !d.is_zero() => Ok(Some(d)),
        _ => lines.err(
            v.span(),
            format!(
                "{field}: {} is not a duration; expected {DURATION_EXPECTED}, more than 0",
                shown(v.get_ref())
            ),
        ),
    }
}

/// `"50ms"`, `"0.2s"`, `"1s"`, `"500us"`, `"2m"`.
pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let secs_per_unit = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    Duration::try_from_secs_f64(n * secs_per_unit).ok()
}

/// A size as `--mem-limit` takes it (the VMM's parser: `8G`, `512MiB`, `1.5G`, bytes).
pub(crate) use vmm::parse_size;
