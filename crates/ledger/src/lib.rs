//! Memory limits that hold.
//!
//! - [`spec`]: the limit syntax of `CUDAW_MEM_LIMIT` and `cudaw run --mem-limit` (`8G`,
//!   `75%`, `0:8G,1:4G`).
//! - [`budget`]: one device's budget in one process — the limit, what is held and the peak —
//!   asked before any device memory is taken ([`vmm::Budget`] for the VMM; directly for the
//!   driver's `cuMemCreate` and managed memory).
//! - [`ledger`]: the node ledger, a file per GPU under the run folder that the processes
//!   under cudaw share, so that their limits may add up to more than the card while the
//!   card is never promised twice; dead processes' shares are reclaimed ([`process`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod budget;
pub mod ledger;
pub mod process;
pub mod spec;

pub use budget::{DeviceBudget, Note, Refusal, Usage};
pub use ledger::{Entry, Grant, Ledger, LedgerError, View};
pub use process::ProcessId;
pub use spec::{Limit, MemLimits};
