//! The daemon's configuration, `/etc/cudaw/node.toml`:
//!
//! ```toml
//! quantum = "50ms"          # the turn a job gets (adapted to its kernel bursts within
//! min_quantum = "10ms"      # these bounds)
//! max_quantum = "200ms"
//!
//! [default]                 # a process without --job, or a job not listed
//! request = 0.0
//! limit = 1.0
//!
//! [[job]]
//! id = "train-a"            # `cudaw run --job train-a`
//! request = 0.25            # guaranteed share of GPU time, 0-1
//! limit = 0.5               # largest share, 0-1
//! memory = "8G"             # bytes ("8G", "512M", "75%" of the card)
//! priority = 10             # higher: swapped out later
//! gpus = ["GPU-…", "1"]     # optional: where it may run (UUIDs or indexes)
//! ```
//!
//! A bad file is refused with the line and the reason ([`ConfigError`]); the daemon keeps
//! the last good one.

use std::time::Duration;

mod parse;

/// A job's memory limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemSpec {
    /// Bytes.
    Bytes(u64),
    /// A fraction of the card (0–1).
    Fraction(f64),
}

impl MemSpec {
    /// In bytes, on a card of `capacity` bytes.
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            MemSpec::Bytes(b) => b,
            MemSpec::Fraction(f) => (capacity as f64 * f) as u64,
        }
    }
}

/// One `[[job]]` (or the `[default]` table, with an empty `id`).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// The job's id.
    pub id: String,
    /// Guaranteed share of the GPU's time, 0–1.
    pub request: f64,
    /// Largest share, 0–1 (at least `request`).
    pub limit: f64,
    /// Memory limit.
    pub memory: Option<MemSpec>,
    /// Priority: higher is swapped out later, and never for a lower one.
    pub priority: i32,
    /// The GPUs it may run on (UUIDs or indexes as written), if restricted.
    pub gpus: Option<Vec<String>>,
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The jobs named.
    pub jobs: Vec<JobSpec>,
    /// What a job not named gets.
    pub default: JobSpec,
    /// The quantum a turn starts from.
    pub quantum: Duration,
    /// The shortest quantum.
    pub min_quantum: Duration,
    /// The longest quantum.
    pub max_quantum: Duration,
}

/// Why a configuration is refused: the line (1-based; 0 when the file as a whole) and
/// the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The line of the file.
    pub line: usize,
    /// The reason, naming the field, the value seen and what is expected.
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

impl Default for Config {
    fn default() -> Config {
        Config {
            jobs: Vec::new(),
            default: JobSpec {
                id: String::new(),
                request: 0.0,
                limit: 1.0,
                memory: None,
                priority: 0,
                gpus: None,
            },
            quantum: Duration::from_millis(50),
            min_quantum: Duration::from_millis(10),
            max_quantum: Duration::from_millis(200),
        }
    }
}

impl Config {
    /// Parses the TOML text of a configuration. Every field is checked; the first fault
    /// is refused with its line and a reason naming the field, the value seen and what is
    /// expected. A field a `[[job]]` leaves out takes the `[default]` table's value.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        parse::parse(text)
    }

    /// The spec of job `id` (the default's, with that id, when it is not named).
    pub fn job(&self, id: &str) -> JobSpec {
        self.jobs
            .iter()
            .find(|j| j.id == id)
            .cloned()
            .unwrap_or_else(|| JobSpec {
                id: id.to_owned(),
                ..self.default.clone()
            })
    }
}

#[cfg(test)]
mod tests;
