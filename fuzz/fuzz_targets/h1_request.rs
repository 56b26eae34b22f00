//! `h1_request`: what it checks is said on `data_plane::fuzzing::h1_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| data_plane::fuzzing::h1_request(data));
