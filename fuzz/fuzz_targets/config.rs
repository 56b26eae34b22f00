//! `config`: what it checks is said on `data_plane::fuzzing::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| data_plane::fuzzing::config(data));
