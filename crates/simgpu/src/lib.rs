//! The simulated GPU. Filled by the driver issue.
