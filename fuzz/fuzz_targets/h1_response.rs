//! `h1_response`: what it checks is said on `data_plane::fuzzing::h1_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| data_plane::fuzzing::h1_response(data));
