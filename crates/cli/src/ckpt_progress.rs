//! Progress of pause, resume, dump and restore: one bar per phase (evicting, writing,
//! verifying, loading) when standard error is a terminal; otherwise (a log, a captured
//! transcript) a plain line at most every [`PLAIN_EVERY`], and none for a phase that ends
//! sooner.
//!
//! A bar is at most [`BAR_COLUMNS`] wide, shows the time elapsed (ticking even while the
//! process reports nothing new: it reports after each batch it has copied), and ends
//! with a newline, so that what is printed next starts on a line of its own.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use cudaw_control::{Phase, Progress};
use indicatif::{ProgressBar, ProgressStyle};

/// The bar's width in columns (the whole line stays within 80).
pub const BAR_COLUMNS: usize = 30;
/// How often a plain progress line is printed when standard error is no terminal.
pub const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Bars,
    Plain,
}

/// The progress display of one request.
pub struct Bars {
    mode: Mode,
    current: Option<(Phase, ProgressBar)>,
    /// Plain lines: the phase, when it began, when a line was last printed.
    plain: Option<(Phase, Instant, Instant)>,
}

impl Bars {
    /// Bars when standard error is a terminal, plain lines when it is not; nothing for
    /// JSON output.
    pub fn new(json: bool) -> Bars {
        let mode = if json {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            Mode::Bars
        } else {
            Mode::Plain
        };
        Bars {
            mode,
            current: None,
            plain: None,
        }
    }

    /// Whether to ask the process for progress lines.
    pub fn wanted(&self) -> bool {
        self.mode != Mode::Off
    }

    /// Shows one progress report.
    pub fn update(&mut self, p: Progress) {
        if p.total == 0 {
            return;
        }
        match self.mode {
            Mode::Off => {}
            Mode::Bars => self.bar(p),
            Mode::Plain => self.plain(p),
        }
    }

    fn bar(&mut self, p: Progress) {
        if self.current.as_ref().map(|(ph, _)| *ph) != Some(p.phase) {
            self.finish();
            let bar = ProgressBar::new(p.total);
            let template = format!(
                "{{prefix:>9}} [{{bar:{BAR_COLUMNS}}}] {{bytes}}/{{total_bytes}} {{binary_bytes_per_sec}} {{elapsed}}"
            );
            let style = ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(p.phase.verb());
            // Redrawn while no report comes, so the time shown moves on.
            bar.enable_steady_tick(Duration::from_millis(200));
            self.current = Some((p.phase, bar));
        }
        if let Some((_, bar)) = &self.current {
            bar.set_length(p.total.max(p.done));
            bar.set_position(p.done);
        }
    }

    fn plain(&mut self, p: Progress) {
        let now = Instant::now();
        let (began, last) = match self.plain {
            Some((ph, began, last)) if ph == p.phase => (began, last),
            _ => (now, now),
        };
        self.plain = Some((p.phase, began, last));
        if now.duration_since(last) < PLAIN_EVERY || p.done >= p.total {
            return;
        }
        self.plain = Some((p.phase, began, now));
        let secs = now.duration_since(began).as_secs_f64();
        let rate = if secs > 0.0 {
            format!(", {}/s", size(p.done as f64 / secs))
        } else {
            String::new()
        };
        errln!(
            "  {} {} of {} ({:.0}%) after {secs:.0} s{rate}",
            p.phase.verb(),
            size(p.done as f64),
            size(p.total as f64),
            p.done as f64 * 100.0 / p.total as f64
        );
    }

    /// Leaves the last bar drawn, complete or not, and ends its line.
    pub fn finish(&mut self) {
        if let Some((_, bar)) = self.current.take() {
            bar.abandon();
            // indicatif leaves the cursor at the end of the bar's line (padded to the
            // terminal's width); a transcript would get the next line glued onto it.
            errln!();
        }
        self.plain = None;
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Bytes in binary units.
fn size(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} bytes")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
