//! Fuzz target: see `sidecar_injector::fuzzing::patch` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sidecar_injector::fuzzing::patch(data));
