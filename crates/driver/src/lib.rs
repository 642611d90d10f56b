//! The driver layer. Filled by the driver issue.
