#![no_main]
//! lone's request parsing (lone::serve::fuzzing) on libFuzzer's inputs, against the tiny LFM2
//! fixture's tokenizer and template.
use std::sync::OnceLock;

use lone::serve::fuzzing::RequestFuzz;

fn ctx() -> &'static RequestFuzz {
    static CTX: OnceLock<RequestFuzz> = OnceLock::new();
    CTX.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/fixtures/lfm2_a");
        RequestFuzz::new(std::path::Path::new(dir)).expect("the tiny LFM2 fixture loads")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| ctx().run(data));
