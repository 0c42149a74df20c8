//! What the CLI test binaries share: the binary, the reference tree, the default model, and
//! the checks on a command's outcome. (Each test binary uses a part of it.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

/// The `lone` binary under test.
pub fn lone() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lone"))
}

/// `tests/reference` of the repository.
pub fn reference() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference")
}

/// The default model, fetched by scripts/test.sh (scripts/fetch-default-model.sh), in
/// `$LONE_MODELS` or `${XDG_CACHE_HOME:-~/.cache}/lone/models`.
pub fn smollm2() -> PathBuf {
    let dir = std::env::var_os("LONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
            cache.join("lone/models")
        });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-default-model.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

/// Lowercase hex sha256 of `b`.
pub fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// `o`, which must have succeeded (`what` names it in the failure).
pub fn ok(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// `o` must have failed cleanly (no panic) with `needle` in its message.
pub fn fails_with(o: Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "expected a failure mentioning {needle:?}"
    );
    assert!(
        err.contains(needle),
        "the error should mention {needle:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
