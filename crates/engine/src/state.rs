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
    released: false,
    hold: None,
    image: None,
});

/// Who paused the process (`by` in the pause request), while it is paused.
static PAUSED_BY: Mutex<Option<String>> = Mutex::new(None);

/// Records who paused the process (none: an operator, or no longer paused).
pub fn set_paused_by(by: Option<String>) {
    *PAUSED_BY.lock() = by;
}

/// Who paused the process, if it is paused and the pause said.
pub fn paused_by() -> Option<String> {
    if is_paused() {
        PAUSED_BY.lock().clone()
    } else {
        None
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
