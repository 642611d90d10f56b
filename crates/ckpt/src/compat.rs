//! Comparing an image's table with a running process's, before restoring anything.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::meta::AllocationRecord;

/// One way an image's allocation table differs from a process's (matched by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Difference {
    /// The process has an allocation the image lacks.
    MissingFromImage {
        /// Its id.
        id: u64,
        /// Its base in the process.
        base: u64,
        /// Its size in the process.
        size: u64,
    },
    /// The image has an allocation the process lacks.
    MissingFromProcess {
        /// Its id.
        id: u64,
        /// Its base in the image.
        base: u64,
        /// Its size in the image.
        size: u64,
    },
    /// The same id has different sizes.
    SizeMismatch {
        /// The id.
        id: u64,
        /// Size in the image.
        image: u64,
        /// Size in the process.
        process: u64,
    },
    /// The same id has different base addresses.
    BaseMismatch {
        /// The id.
        id: u64,
        /// Base in the image.
        image: u64,
        /// Base in the process.
        process: u64,
    },
    /// The same id has a different creation sequence number (another process, or
    /// allocations made in another order).
    OrderMismatch {
        /// The id.
        id: u64,
        /// Creation order in the image.
        image: u64,
        /// Creation order in the process.
        process: u64,
    },
    /// The same id is memory of different devices.
    DeviceMismatch {
        /// The id.
        id: u64,
        /// The device ordinal in the image.
        image: u32,
        /// The device ordinal in the process.
        process: u32,
    },
    /// The same id is a runtime allocation on one side and a driver-handle range on the
    /// other, or ranges of different handles (handle, its size, the offset mapped, its
    /// properties).
    HandleMismatch {
        /// The id.
        id: u64,
        /// The virtual handle in the image (`None`: a runtime allocation).
        image: Option<u64>,
        /// The virtual handle in the process (`None`: a runtime allocation).
        process: Option<u64>,
    },
}

fn show_handle(h: Option<u64>) -> String {
    h.map_or("a runtime allocation".to_owned(), |h| {
        format!("driver handle {h:#x}")
    })
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Difference::MissingFromImage { id, base, size } => write!(
                f,
                "allocation {id} ({size} bytes at {base:#x}) is in the process but not in the image"
            ),
            Difference::MissingFromProcess { id, base, size } => write!(
                f,
                "allocation {id} ({size} bytes at {base:#x}) is in the image but not in the process"
            ),
            Difference::SizeMismatch { id, image, process } => write!(
                f,
                "allocation {id} is {image} bytes in the image, {process} in the process"
            ),
            Difference::BaseMismatch { id, image, process } => write!(
                f,
                "allocation {id} is at {image:#x} in the image, {process:#x} in the process"
            ),
            Difference::OrderMismatch { id, image, process } => write!(
                f,
                "allocation {id} is creation number {image} in the image, {process} in the process"
            ),
            Difference::DeviceMismatch { id, image, process } => write!(
                f,
                "allocation {id} is memory of device {image} in the image, of device {process} in the process"
            ),
            Difference::HandleMismatch { id, image, process } if image == process => write!(
                f,
                "range {id} of {} differs in the handle's size, offset or properties between the image and the process",
                show_handle(image)
            ),
            Difference::HandleMismatch { id, image, process } => write!(
                f,
                "range {id} is {} in the image, {} in the process",
                show_handle(image),
                show_handle(process)
            ),
        }
    }
}

/// How `image` differs from `process`, allocations matched by id; ordered by id (for one id,
/// base, then size, then creation order, then device, then driver handle). Empty when every
/// allocation matches in base, size, creation order, device and (for driver-handle ranges)
/// handle.
pub fn compare_tables(image: &[AllocationRecord], process: &[AllocationRecord]) -> Vec<Difference> {
    let mut by_id: BTreeMap<u64, (Option<&AllocationRecord>, Option<&AllocationRecord>)> =
        BTreeMap::new();
    for r in image {
        by_id.entry(r.id).or_default().0 = Some(r);
    }
    for r in process {
        by_id.entry(r.id).or_default().1 = Some(r);
    }
    let mut out = Vec::new();
    for (&id, pair) in &by_id {
        match *pair {
            (Some(i), None) => out.push(Difference::MissingFromProcess {
                id,
                base: i.base,
                size: i.size,
            }),
            (None, Some(p)) => out.push(Difference::MissingFromImage {
                id,
                base: p.base,
                size: p.size,
            }),
            (Some(i), Some(p)) => {
                if i.base != p.base {
                    out.push(Difference::BaseMismatch {
                        id,
                        image: i.base,
                        process: p.base,
                    });
                }
                if i.size != p.size {
                    out.push(Difference::SizeMismatch {
                        id,
                        image: i.size,
                        process: p.size,
                    });
                }
                if i.order != p.order {
                    out.push(Difference::OrderMismatch {
                        id,
                        image: i.order,
                        process: p.order,
                    });
                }
                if i.device != p.device {
                    out.push(Difference::DeviceMismatch {
                        id,
                        image: i.device,
                        process: p.device,
                    });
                }
                if i.handle != p.handle {
                    out.push(Difference::HandleMismatch {
                        id,
                        image: i.handle.map(|h| h.handle),
                        process: p.handle.map(|h| h.handle),
                    });
                }
            }
            (None, None) => {}
        }
    }
    out
}
