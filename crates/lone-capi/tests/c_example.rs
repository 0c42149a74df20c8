//! Builds `examples/c/chat.c` against the C library and runs it on the default model,
//! checking its output against the Rust engine (`lone_rt::serve::local::Local`) directly.

use std::path::{Path, PathBuf};
use std::process::Command;

use lone_rt::serve::local::Local;
use lone_rt::serve::openai::Kind;
use serde_json::{json, Value};

fn default_model() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is not set");
    let p = Path::new(&home).join(".cache/lone/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

/// The directory holding `liblone.so` for this test's profile.
///
/// `cargo test -p lone-capi` compiles the library target once with all its crate types
/// (cdylib, staticlib) for the integration tests, into `target/<profile>/deps/`,
/// where this test's binary is: linking the `liblone.so` next to it links exactly the code
/// this run built (`cargo test` does not refresh the copy in `target/<profile>/`, which
/// `cargo build` leaves there, so that one may be stale). Should it be missing (a runner
/// that copied only the test binary), the library is built with `$CARGO` into a target
/// directory of its own, so as not to wait on the lock of the cargo running this test.
fn library_dir() -> PathBuf {
    // A caller that has just built the workspace (scripts/test.sh: `cargo build --workspace
    // --release`) names the folder holding the library it built.
    if let Some(dir) = std::env::var_os("LONE_CAPI_LIB_DIR") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("liblone.so").is_file(),
            "LONE_CAPI_LIB_DIR={} holds no liblone.so",
            dir.display()
        );
        return dir;
    }
    let exe = std::env::current_exe().expect("cannot find the test binary");
    let deps = exe.parent().expect("the test binary has no directory");
    if deps.join("liblone.so").is_file() {
        return deps.to_path_buf();
    }
    let profile_dir = deps
        .parent()
        .expect("the test binary is not in target/<profile>/deps")
        .to_path_buf();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = root.join("target/capi-c-example");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "lone-capi"]).current_dir(&root);
    if release {
        cmd.arg("--release");
    }
    let st = cmd
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cannot run cargo to build liblone.so");
    assert!(st.success(), "cargo build -p lone-capi failed");
    target.join(if release { "release" } else { "debug" })
}

/// The text of each `== name ==` section of the example's output.
fn section<'a>(out: &'a str, name: &str) -> &'a str {
    let head = format!("== {name} ==\n");
    let start = out
        .find(&head)
        .unwrap_or_else(|| panic!("no section {name:?} in the output:\n{out}"))
        + head.len();
    let rest = &out[start..];
    let end = rest.find("\n== ").unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn c_example_builds_runs_and_matches_the_engine() {
    let model = default_model();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = library_dir();
    let dir = std::env::temp_dir().join(format!("lone-capi-c-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("chat");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg(root.join("examples/c/chat.c"))
        .arg("-I")
        .arg(root.join("crates/lone-capi/include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-llone", "-lm", "-lpthread", "-ldl", "-o"])
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "compiling examples/c/chat.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run = Command::new(&exe).arg(&model).output().unwrap();
    let stdout = String::from_utf8(run.stdout).expect("the example printed non-UTF-8");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the example failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
    );
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(section(&stdout, "version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(
        section(&stdout, "roundtrip"),
        "Hello from C: the quick brown fox."
    );
    let info: Value = serde_json::from_str(section(&stdout, "info")).unwrap();
    assert_eq!(info["vocab_size"], 49152);

    // The reference: the engine itself, with the same settings and prompt.
    let flags = [
        format!("--model={}", model.display()),
        "--threads=2".into(),
        "--parallel=1".into(),
        "--log-format=off".into(),
    ];
    let local = Local::open(&lone_rt::serve::local::serve_args(flags).unwrap()).unwrap();
    let ids = local.tokenize("The capital of France is", true).unwrap();
    let printed: Vec<u32> = section(&stdout, "prompt ids")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(printed, ids);
    let req = local
        .request(
            Kind::Completion,
            &json!({"prompt": ids, "max_tokens": 16, "temperature": 0}),
        )
        .unwrap();
    let resp = req.wait_all().unwrap();
    let want = resp[0]["choices"][0]["text"].as_str().unwrap();
    assert!(!want.is_empty());
    assert_eq!(section(&stdout, "generate"), want);

    let chat: Value = serde_json::from_str(section(&stdout, "chat response"))
        .unwrap_or_else(|e| panic!("the chat response is not JSON ({e}):\n{stdout}"));
    let content = chat["choices"][0]["message"]["content"]
        .as_str()
        .expect("no choices[0].message.content");
    assert!(!content.is_empty());
    assert_eq!(section(&stdout, "chat"), content);
    assert_eq!(chat["object"], "chat.completion");
    assert!(chat["choices"][0]["finish_reason"].is_string());
    assert!(chat["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let err = section(&stdout, "error");
    assert!(
        err.contains("/nonexistent/model.gguf"),
        "the error does not name the path: {err:?}"
    );
    assert_eq!(section(&stdout, "done"), "");
}
