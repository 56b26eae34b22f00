//! `jwt`: what it checks is said on `gateway_jwt::fuzzing::token`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_jwt::fuzzing::token(data));
