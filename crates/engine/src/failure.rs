//! How the engine's requests fail, and where long ones report their progress.

use cudaw_control::{ErrorKind, Progress};

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure (scripts read it).
    pub kind: ErrorKind,
    /// The message for people.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where a long request reports its progress (the control socket sends it on when the
/// client asked; signals ignore it).
pub type Report<'a> = &'a mut dyn FnMut(Progress);
