//! `proxy_header`: what it checks is said on `data_plane::fuzzing::proxy_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| data_plane::fuzzing::proxy_header(data));
