//! Peer access to cudaw's memory: which device may read and write which other device's
//! memory.
//!
//! cudaw hands out device memory from its own VMM (`cuMemCreate` + `cuMemMap`), and with a
//! real driver `cudaDeviceEnablePeerAccess` / `cuCtxEnablePeerAccess` reach only memory of
//! `cuMemAlloc`: a VMM mapping is accessible to the devices its `cuMemSetAccess` names.
//! So the shims forward those calls and, when the driver agrees, tell the engine
//! ([`enabled`], [`disabled`]); the engine keeps the pairs (accessor → owner) and grants the
//! accessor read/write access:
//!
//! - on every mapping of the owner's VMM, now and later (new allocations, a resume, a
//!   restore from an image): the owner's [`driver::DriverBackend`] gives every mapping it
//!   makes the access of its peers ([`driver::DriverBackend::add_peer`]); a device whose
//!   memory cudaw starts managing later gets the pairs recorded before (the table is
//!   [`memory`]'s, which grants them when it makes the device's VMM);
//! - on every mapping of the owner's driver-level handles ([`crate::handles`]): now, at
//!   each later `cuMemMap`, and when a resume or restore maps them again.
//!
//! Disabling takes the accessor's access away from the VMM's mappings, and from the
//! handles' mappings except where the program granted it itself (`cuMemSetAccess`).

use crate::{handles, log, memory};

pub use memory::{peer_accessors as accessors_of, peer_pairs as pairs};

/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` / `cudaErrorPeerAccessAlreadyEnabled`: the
/// pair is enabled (a second call, or the other layer's).
pub const ALREADY_ENABLED: u32 = 704;
/// `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` / `cudaErrorPeerAccessNotEnabled`: the pair is not
/// enabled.
pub const NOT_ENABLED: u32 = 705;

/// What a forwarded enable's result means for the pairs: whether the pair is enabled now.
pub fn enable_took_effect(rc: u32) -> bool {
    rc == 0 || rc == ALREADY_ENABLED
}

/// What a forwarded disable's result means for the pairs: whether the pair is disabled now.
pub fn disable_took_effect(rc: u32) -> bool {
    rc == 0 || rc == NOT_ENABLED
}

/// After the driver enabled `accessor`'s access to `owner`'s memory: records the pair and
/// grants the access on every mapping of `owner`'s memory cudaw manages. Returns whether
/// every grant succeeded (a failure is logged; the pair stays recorded, so later mappings
/// get the access).
pub fn enabled(accessor: i32, owner: i32) -> bool {
    if accessor == owner || accessor < 0 || owner < 0 {
        return true;
    }
    if memory::set_peer_pair(accessor, owner, true) {
        log::debug(format_args!(
            "peer access: device {accessor} may access device {owner}'s memory"
        ));
    }
    let mut ok = true;
    // The VMM's memory, when cudaw manages the owner's already; a device managed later
    // gets the pair from `apply_to_new_device`.
    if let Some((_, m)) = memory::managed_devices().find(|(o, _)| *o == owner) {
        if let Err(e) = m.vmm.backend().add_peer(accessor) {
            log::error(format_args!(
                "peer access: granting device {accessor} access to device {owner}'s memory: {e}"
            ));
            ok = false;
        }
    }
    if let Err(e) = handles::grant_peer(accessor, owner) {
        log::error(format_args!(
            "peer access: granting device {accessor} access to device {owner}'s driver handles: {e}"
        ));
        ok = false;
    }
    ok
}

/// After the driver disabled `accessor`'s access to `owner`'s memory: forgets the pair and
/// takes the access away (never where the program granted it itself).
pub fn disabled(accessor: i32, owner: i32) {
    if !memory::set_peer_pair(accessor, owner, false) {
        return;
    }
    log::debug(format_args!(
        "peer access: device {accessor} no longer accesses device {owner}'s memory"
    ));
    if let Some((_, m)) = memory::managed_devices().find(|(o, _)| *o == owner) {
        if let Err(e) = m.vmm.backend().remove_peer(accessor) {
            log::warn(format_args!(
                "peer access: taking device {accessor}'s access to device {owner}'s memory away: {e}"
            ));
        }
    }
    if let Err(e) = handles::revoke_peer(accessor, owner) {
        log::warn(format_args!(
            "peer access: taking device {accessor}'s access to device {owner}'s driver handles away: {e}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_results_that_change_a_pair() {
        assert!(enable_took_effect(0));
        assert!(enable_took_effect(ALREADY_ENABLED));
        assert!(!enable_took_effect(101)); // invalid device
        assert!(!enable_took_effect(217)); // peer access unsupported
        assert!(disable_took_effect(0));
        assert!(disable_took_effect(NOT_ENABLED));
        assert!(!disable_took_effect(101));
    }

    #[test]
    fn pairs_are_recorded_once_and_forgotten() {
        // Devices no other test names (the table is the process's).
        assert!(enabled(41, 40), "no memory to grant on: nothing fails");
        assert!(enabled(41, 40), "enabling twice");
        assert!(enabled(42, 40));
        assert!(enabled(40, 40), "a device's own memory needs no pair");
        assert_eq!(accessors_of(40), vec![41, 42]);
        assert!(pairs().contains(&(41, 40)));
        assert!(accessors_of(41).is_empty(), "pairs have a direction");
        disabled(41, 40);
        disabled(41, 40);
        assert_eq!(accessors_of(40), vec![42]);
        disabled(42, 40);
        assert!(accessors_of(40).is_empty());
    }
}
