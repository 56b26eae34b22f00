//! `normalize_path`: what it checks is said on `data_plane::fuzzing::normalize_path`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| data_plane::fuzzing::normalize_path(data));
