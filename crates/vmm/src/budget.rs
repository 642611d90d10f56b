//! A hook for a node-wide memory budget shared by several processes.

/// Consulted before the VMM creates physical memory, after its own memory limit passed.
///
/// Implementations must not block for long: the VMM calls them outside its locks, but on the
/// allocating thread. A refusal makes the allocation fail with
/// [`crate::VmmError::BudgetExceeded`]; the VMM touched nothing on the backend.
pub trait Budget: Send + Sync {
    /// Asks for `bytes` of physical memory; `true` grants them.
    fn acquire(&self, bytes: u64) -> bool;

    /// Returns `bytes` granted earlier, after the physical memory was released.
    fn release(&self, bytes: u64);
}
