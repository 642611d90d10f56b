//! What cudaw did for the process, logged at exit: memory per device, budgets,
//! driver-level handles, registrations.

use crate::host::host;
use crate::{handles, log, memory, registry};

/// One line per managed device, plus driver-level memory and registrations: what cudaw did
/// for this process. Logged at exit at info level.
pub fn summary() -> String {
    let mut parts = Vec::new();
    for (i, m) in memory::managed_devices() {
        let s = m.vmm.stats();
        parts.push(format!(
            "device {i}: {} live allocations, {} MiB requested (peak {} MiB), {} MiB mapped (peak {} MiB)",
            s.allocations,
            s.requested >> 20,
            s.peak_requested >> 20,
            s.mapped >> 20,
            s.peak_mapped >> 20
        ));
    }
    for (i, b) in memory::budgets() {
        let u = b.usage();
        parts.push(format!(
            "device {i} budget: limit {}, {} MiB held (peak {} MiB), {} allocations refused{}",
            u.limit
                .map_or_else(|| "none".to_owned(), |l| format!("{} MiB", l >> 20)),
            u.used >> 20,
            u.peak >> 20,
            u.refused,
            if b.has_ledger() {
                ", in the node ledger"
            } else {
                ""
            }
        ));
    }
    let (fatbins, kernels) = registry::counts_ever();
    let (handles, bytes, peak, mappings) = handles::summary();
    parts.push(format!(
        "driver-level: {handles} handles ({} MiB, peak {} MiB), {mappings} mappings, {} reservations",
        bytes >> 20,
        peak >> 20,
        host().driver_reservations()
    ));
    parts.push(format!(
        "registered over the run: {fatbins} fatbins, {kernels} kernels"
    ));
    let (copies, bytes) = crate::pageable::staged();
    if copies > 0 {
        parts.push(format!(
            "copies with pageable host memory through the pinned staging: {copies} ({} MiB)",
            bytes >> 20
        ));
    }
    if let Some(p) = crate::pinning::stats() {
        parts.push(format!(
            "smart pinning: {} copies ({} MiB) from pinned ranges, {} ({} MiB) from others; \
             {} ranges ({} MiB) pinned at exit, at most {} MiB, {} released when given back, \
             {} refused",
            p.hot_copies,
            p.hot_bytes >> 20,
            p.cold_copies,
            p.cold_bytes >> 20,
            p.pinned_ranges,
            p.pinned_bytes >> 20,
            p.peak_pinned_bytes >> 20,
            p.released,
            p.refused
        ));
    }
    parts.join("; ")
}

extern "C" fn log_summary_at_exit() {
    crate::boundary::guard("the exit summary", (), || {
        if log::enabled(log::Level::Info) {
            log::info(format_args!("at exit: {}", summary()));
        }
        // After the summary (which counts what is pinned at exit): unpin, write the profile.
        crate::pinning::finish();
    })
}

/// Arranges for [`summary`] to be logged when the process exits.
pub fn log_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a function with no arguments that never unwinds (it runs inside
        // the panic boundary).
        unsafe { libc::atexit(log_summary_at_exit) };
    });
}
