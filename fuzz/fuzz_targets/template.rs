//! Fuzz target: see `sidecar_injector::fuzzing::template` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sidecar_injector::fuzzing::template(data));
