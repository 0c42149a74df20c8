//! `include/lone.h` is what cbindgen generates from `src/lib.rs` with `cbindgen.toml`: this
//! test regenerates it and fails when the checked-in file differs.
//! `LONE_BLESS=1 cargo test -p lone-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .expect("cannot read crates/lone-capi/cbindgen.toml");
    // One source file, parsed directly: no `cargo metadata` (which would wait for the lock
    // of the cargo running this test).
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen cannot generate the header from src/lib.rs");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("the generated header is not UTF-8");
    let path = dir.join("include/lone.h");
    if std::env::var_os("LONE_BLESS").is_some_and(|v| v != "0") {
        std::fs::write(&path, &fresh).expect("cannot write include/lone.h");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != fresh {
        let line = current
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| current.lines().count().min(fresh.lines().count()));
        panic!(
            "crates/lone-capi/include/lone.h is not what cbindgen generates from src/lib.rs \
             (first difference at line {}). Refresh it with\n    \
             LONE_BLESS=1 cargo test -p lone-capi --test header\nand commit it.",
            line + 1
        );
    }
}
