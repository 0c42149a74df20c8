//! Shared by the integration tests that run the real default model.

use std::path::PathBuf;

/// The default model's file (scripts/fetch-default-model.sh puts it there; `LONE_MODELS` or
/// `XDG_CACHE_HOME` move it). Panics with what to run when it is missing.
pub fn default_model() -> PathBuf {
    let dir = std::env::var_os("LONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("lone")
                .join("models")
        });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "the default model is not at {}: run scripts/fetch-default-model.sh first",
        p.display()
    );
    p
}
