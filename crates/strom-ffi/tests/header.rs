//! `include/strom.h` is generated from this crate by cbindgen and checked
//! in. This test regenerates it and fails with the difference when the
//! checked-in copy is stale; `STROM_BLESS_HEADER=1` (what `make header`
//! runs) writes the fresh one instead.

use std::path::PathBuf;

fn generate() -> String {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

#[test]
fn the_checked_in_header_is_fresh() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../include/strom.h");
    let fresh = generate();
    if std::env::var_os("STROM_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/strom.h");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != fresh {
        let diff: Vec<String> = current
            .lines()
            .zip(fresh.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .map(|(i, (a, b))| format!("line {}:\n  checked in: {a}\n  generated:  {b}", i + 1))
            .collect();
        panic!(
            "include/strom.h is stale ({} vs {} lines); run `make header`.\n{}",
            current.lines().count(),
            fresh.lines().count(),
            diff.join("\n")
        );
    }
}

#[test]
fn every_shared_error_code_has_a_c_constant() {
    let header = generate();
    for code in strom_client::ErrorCode::ALL {
        let line = format!("#define STROM_ERR_{} {}", code.name(), code.0);
        assert!(header.contains(&line), "strom.h lacks `{line}`");
    }
}
