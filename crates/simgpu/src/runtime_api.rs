//! The runtime subset (`cuda*`) simgpu plays for tests reached through the shim's
//! forwarding: registration, launches of test kernels looked up by name, copies, events.
//! Not written yet: the driver API (`driver_api`) is what exists so far; runtime entry
//! points will be thin wrappers over the same `device`, `memory` and `stream` modules.
