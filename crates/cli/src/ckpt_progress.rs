//! Progress bars for pause, resume, dump and restore: one bar per phase (evicting,
//! writing, verifying, loading), drawn on standard error when it is a terminal.

use std::io::IsTerminal;

use cudaw_control::{Phase, Progress};
use indicatif::{ProgressBar, ProgressStyle};

/// The bars of one request.
pub struct Bars {
    on: bool,
    current: Option<(Phase, ProgressBar)>,
}

impl Bars {
    /// Bars when standard error is a terminal and the output is not JSON.
    pub fn new(json: bool) -> Bars {
        Bars {
            on: !json && std::io::stderr().is_terminal(),
            current: None,
        }
    }

    /// Whether to ask the process for progress lines.
    pub fn wanted(&self) -> bool {
        self.on
    }

    /// Shows one progress line.
    pub fn update(&mut self, p: Progress) {
        if !self.on || p.total == 0 {
            return;
        }
        if self.current.as_ref().map(|(ph, _)| *ph) != Some(p.phase) {
            self.finish();
            let bar = ProgressBar::new(p.total);
            let style = ProgressStyle::with_template(
                "{prefix:>9} [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(p.phase.verb());
            self.current = Some((p.phase, bar));
        }
        if let Some((_, bar)) = &self.current {
            bar.set_length(p.total.max(p.done));
            bar.set_position(p.done);
        }
    }

    /// Leaves the last bar drawn, complete or not.
    pub fn finish(&mut self) {
        if let Some((_, bar)) = self.current.take() {
            bar.abandon();
        }
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        self.finish();
    }
}
