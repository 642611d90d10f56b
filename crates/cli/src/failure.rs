//! The failures both CLIs report, each with a kind scripts can read and an exit status,
//! and the one way they are reported: `PROG: error: MESSAGE` on standard error and, under
//! `--json`, `{"ok":false,"kind":KIND,"error":MESSAGE}` on standard output — the shape of
//! the control socket's own error replies.

use std::process::ExitCode;

use cudaw_control::ErrorKind;

/// What went wrong, for `--json` (`"kind"`) and the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The command line was wrong (clap's usage errors).
    Usage,
    /// No process has that PID.
    NoProcess,
    /// The process does not serve a cudaw control socket.
    NotUnderCudaw,
    /// Another user's process, or a file we may not read.
    Permission,
    /// The socket misbehaved (closed early, malformed reply, timeout).
    Connection,
    /// A file could not be read, created or written.
    Io,
    /// A file is not what the command reads (`cudaw fatbin` on a file without device
    /// code).
    BadInput,
    /// No device to run on (`--device gpu` without a usable GPU), or nothing that could
    /// stand in for one.
    NoDevice,
    /// Not a readable cudaw image: another format, another version, truncated, corrupt.
    BadImage,
    /// A sound image of another process (table, addressing, producer).
    Mismatch,
    /// The request was malformed or refused by the process.
    Request,
    /// The process could not do it (device failure, memory on several devices), or a
    /// check failed.
    Failed,
    /// The process holds memory the request cannot cover (driver-level handles in a dump).
    Unsupported,
    /// A pause gave up at the process's deadline (`CUDAW_PAUSE_TIMEOUT`); it runs on.
    Timeout,
}

impl Kind {
    /// The `"kind"` of `--json` errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Usage => "usage",
            Kind::NoProcess => "no_process",
            Kind::NotUnderCudaw => "not_under_cudaw",
            Kind::Permission => "permission",
            Kind::Connection => "connection",
            Kind::Io => "io",
            Kind::BadInput => "bad_input",
            Kind::NoDevice => "no_device",
            Kind::BadImage => "bad_image",
            Kind::Mismatch => "mismatch",
            Kind::Request => "request",
            Kind::Failed => "failed",
            Kind::Unsupported => "unsupported",
            Kind::Timeout => "timeout",
        }
    }

    /// The exit status: 2 for a usage error, 3 when an image is at fault, 1 otherwise.
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::Usage => 2,
            Kind::BadImage | Kind::Mismatch => 3,
            _ => 1,
        }
    }

    /// The kind of a failed reply from the control socket.
    pub fn of_reply(kind: Option<ErrorKind>, msg: &str) -> Kind {
        match kind {
            Some(ErrorKind::BadImage) => Kind::BadImage,
            Some(ErrorKind::Mismatch) => Kind::Mismatch,
            Some(ErrorKind::Io) => Kind::Io,
            Some(ErrorKind::Failed) => Kind::Failed,
            Some(ErrorKind::Unsupported) => Kind::Unsupported,
            Some(ErrorKind::Timeout) => Kind::Timeout,
            _ if msg.starts_with("permission denied") => Kind::Permission,
            Some(ErrorKind::Request) => Kind::Request,
            None => Kind::Failed,
        }
    }
}

/// A failure with its kind.
#[derive(Debug)]
pub struct Failure {
    /// Its kind.
    pub kind: Kind,
    /// The message.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A failure of `kind`.
pub fn fail(kind: Kind, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failure {
        kind,
        message: message.into(),
    })
}

/// The kind of an error (`Failed` unless it carries one).
pub fn kind_of(e: &anyhow::Error) -> Kind {
    e.chain()
        .find_map(|c| c.downcast_ref::<Failure>())
        .map_or(Kind::Failed, |f| f.kind)
}

/// A failure whose JSON is already on standard output (`cudaw demo`'s summary of failed
/// checks): [`finish`] prints no second object.
#[derive(Debug)]
pub struct JsonPrinted;

impl std::fmt::Display for JsonPrinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(reported as JSON)")
    }
}

impl std::error::Error for JsonPrinted {}

/// The `--json` form of a failure: `{"ok":false,"kind":KIND,"error":MESSAGE}`.
pub fn json(kind: Kind, message: &str) -> serde_json::Value {
    serde_json::json!({"ok": false, "kind": kind.as_str(), "error": message})
}

/// What the help texts say about failures under `--json`.
pub const JSON_FAILURES: &str = "With --json, a failure prints one line on standard output, \
{\"ok\":false,\"kind\":KIND,\"error\":MESSAGE}, as well as the message on standard error; KIND \
is one of usage, no_process, not_under_cudaw, permission, connection, io, bad_input, \
no_device, bad_image, mismatch, request, failed, unsupported, timeout.";

/// Ends a command: exit 0 on success, and also when standard output was closed under us
/// (`| head -1`: the reader has what it wanted); else the failure on standard error (and
/// as JSON on standard output under `--json`) and its kind's exit status.
pub fn finish(prog: &str, result: anyhow::Result<()>, json_out: bool) -> ExitCode {
    let e = match result {
        Ok(()) => return ExitCode::SUCCESS,
        Err(e) if crate::out::stdout_closed(&e) => return ExitCode::SUCCESS,
        Err(e) => e,
    };
    let kind = kind_of(&e);
    let message = format!("{e:#}");
    // `downcast_ref` on the error itself also finds a marker added with `.context(...)`,
    // which the chain's items do not show.
    let printed = e.downcast_ref::<JsonPrinted>().is_some()
        || e.chain().any(|c| c.downcast_ref::<JsonPrinted>().is_some());
    if json_out && !printed {
        // Standard output may be gone too; nothing more to say then.
        let _ = crate::out::line(format_args!("{}", json(kind, &message)));
    }
    crate::out::err_line(format_args!("{prog}: error: {message}"));
    ExitCode::from(kind.exit_code())
}

/// Parses the command line; a usage error under `--json` is reported as JSON too (help
/// and version requests print as usual).
pub fn parse<P: clap::Parser>() -> Result<P, ExitCode> {
    P::try_parse().map_err(|e| {
        use clap::error::ErrorKind as K;
        let informational = matches!(
            e.kind(),
            K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
        );
        if !informational && std::env::args_os().any(|a| a == "--json") {
            // The message, up to clap's usage line, on one line.
            let text = e.to_string();
            let head = text.split("\n\n").next().unwrap_or_default();
            let msg = head.split_whitespace().collect::<Vec<_>>().join(" ");
            let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
            let _ = crate::out::line(format_args!("{}", json(Kind::Usage, msg)));
        }
        // clap prints (ignoring a closed pipe); its status is 0 for help, 2 for a usage
        // error.
        let _ = e.print();
        ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
    })
}
