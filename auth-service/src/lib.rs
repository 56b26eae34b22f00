//! skeleton, replaced by the real crate
