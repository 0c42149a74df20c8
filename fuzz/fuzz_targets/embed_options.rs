#![no_main]
//! The Python and C APIs' option parsing (lone::serve::fuzzing::embed_options).
libfuzzer_sys::fuzz_target!(|data: &[u8]| lone::serve::fuzzing::embed_options(data));
