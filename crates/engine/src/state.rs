//! What the engine knows about the process between requests: whether cudaw has paused it,
//! and the image a dump left its memory in. Held by the request being carried out
//! ([`crate::requests`], on the control thread).

use ckpt::ImageReader;
use parking_lot::Mutex;
use std::fs::File;
use std::path::PathBuf;

/// What the control thread knows about the process.
pub(crate) struct Ctl {
    /// cudaw has paused it (memory evicted, gate closed).
    pub paused: bool,
    /// Who paused it (`by` in the pause request: `cudaw-node` for the node daemon's
    /// swaps); none for an operator or a signal. Cleared with `paused`.
    pub paused_by: Option<String>,
    /// Paused, and handed to the driver's checkpoint (`cudaw-ckpt pause --release`): the
    /// driver holds the context, so cudaw must not call the driver until `cudaw-ckpt
    /// resume` has had it restored.
    pub released: bool,
    /// A job pause's first step holds it (gate closed, memory on the device).
    pub hold: Option<crate::hold::Hold>,
    /// The image holding allocations' bytes after a dump without `--leave-running`
    /// (open: a resume reads it even if the file is renamed or removed meanwhile).
    pub image: Option<Held>,
}

/// An image some allocations' bytes live in.
pub(crate) struct Held {
    /// Where it was written.
    pub path: PathBuf,
    /// It, open.
    pub reader: ImageReader<File>,
}

pub(crate) static CTL: Mutex<Ctl> = Mutex::new(Ctl {
    paused: false,
    paused_by: None,
    released: false,
    hold: None,
    image: None,
});

/// Who paused the process (`by` in its pause request), while it is paused: empty for an
/// operator or a signal (no owner). `None` while it runs.
pub fn paused_by() -> Option<String> {
    let c = CTL.lock();
    c.paused.then(|| c.paused_by.clone().unwrap_or_default())
}

/// After a pause request by `by` that succeeded: the pause is `by`'s when it paused the
/// process (`changed`), or when an operator (`None`) paused a process already paused
/// (the operator's now: no daemon resumes it).
pub fn pause_done(by: Option<String>, changed: bool) {
    let mut c = CTL.lock();
    if c.paused && (changed || by.is_none()) {
        c.paused_by = by;
    }
}

/// Whether the process is paused now.
pub fn is_paused() -> bool {
    CTL.lock().paused
}

/// Whether the process is paused with its context released to the driver.
pub fn is_released() -> bool {
    CTL.lock().released
}

/// Whether a job pause's first step holds the process now (calls wait, memory on the
/// device).
pub fn is_held() -> bool {
    let c = CTL.lock();
    c.hold.is_some() && !c.paused
}

/// The image holding the paused process's memory, if a dump left it there.
pub fn image_path() -> Option<PathBuf> {
    CTL.lock().image.as_ref().map(|h| h.path.clone())
}
