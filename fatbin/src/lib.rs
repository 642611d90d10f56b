//! The fatbin parser. Filled by the fatbin issue.
