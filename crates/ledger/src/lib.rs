//! Memory limits that hold.
//!
//! - [`spec`]: the limit syntax of `CUDAW_MEM_LIMIT` and `cudaw run --mem-limit` (`8G`,
//!   `75%`, `0:8G,1:4G`).
//! - [`budget`]: one device's budget in one process — the limit, what is held and the peak —
//!   asked before any device memory is taken ([`vmm::Budget`] for the VMM; directly for the
//!   driver's `cuMemCreate` and managed memory).
//! - [`ledger`]: the node ledger, one folder for the whole node (`$CUDAW_NODE_DIR`, else
//!   `/dev/shm`) holding one small file per process per GPU, shared by every user's
//!   processes under cudaw, so that their limits may add up to more than the card while
//!   the card is never promised twice; only live processes' entries count ([`process`]).
//!
//! Everything fails closed: a limit that cannot be enforced, or a ledger that cannot be
//! joined, read or written, refuses the allocation with the reason — it is never ignored.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod budget;
pub mod ledger;
pub mod process;
pub mod spec;

pub use budget::{Accounting, DeviceBudget, Note, Refusal, Rejoin, Usage};
pub use ledger::{Entry, Grant, Ledger, LedgerError, Record, View};
pub use process::{ProcessId, Verdict};
pub use spec::{Limit, MemLimits};
