//! Standard output and error for both CLIs, and what a closed pipe means.
//!
//! `println!` panics when standard output is a pipe whose reader has gone
//! (`cudaw-ckpt inspect x.img | head -1`): Rust ignores `SIGPIPE`, so the write fails with
//! `EPIPE` instead of killing the process. Here every write to standard output goes
//! through `outln!` / `out!`, which return the failure as an error of its own
//! ([`StdoutClosed`]); `main` then exits 0 quietly, as Unix tools do when their reader
//! stops reading — after the error has unwound through the command, so that destructors
//! still run (`cudaw demo` kills the example it started). Messages to standard error go
//! through `errln!`, which ignores a failed write (there is nowhere left to report it).

use std::fmt;
use std::io::Write;

/// Standard output could not be written: its reader has gone (or it is otherwise
/// unwritable). Not a failure of the command: `main` exits 0 without a word.
#[derive(Debug)]
pub struct StdoutClosed(pub std::io::Error);

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "writing to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `args` to standard output (flushed).
pub fn write(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args)
        .and_then(|()| o.flush())
        .map_err(|e| anyhow::Error::new(StdoutClosed(e)))
}

/// Writes `args` and a newline to standard output.
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    write(format_args!("{args}\n"))
}

/// Writes `args` and a newline to standard error, ignoring a failure.
pub fn err_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// Whether `e` is (caused by) standard output being closed.
pub fn stdout_closed(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<StdoutClosed>().is_some())
}

/// `println!` that returns `anyhow::Result<()>` instead of panicking on a closed pipe.
macro_rules! outln {
    () => { $crate::out::line(format_args!("")) };
    ($($t:tt)*) => { $crate::out::line(format_args!($($t)*)) };
}

/// `print!` that returns `anyhow::Result<()>` instead of panicking on a closed pipe.
#[allow(unused_macros)] // `cudaw-ckpt` uses it; `cudaw` no longer does
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    () => { $crate::out::err_line(format_args!("")) };
    ($($t:tt)*) => { $crate::out::err_line(format_args!($($t)*)) };
}
