#![no_main]
//! lone_core::fuzzing::image on libFuzzer's inputs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| lone_core::fuzzing::image(data));
