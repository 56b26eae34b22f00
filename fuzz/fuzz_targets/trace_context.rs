//! `trace_context`: what it checks is said on `gateway_telemetry::fuzzing::trace_context`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_telemetry::fuzzing::trace_context(data));
