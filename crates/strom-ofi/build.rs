//! Generates the libfabric bindings and compiles the C wrappers of its
//! `static inline` functions (`fi_send`, `fi_read`, `fi_cq_read`, ...),
//! which bindgen's `wrap_static_fns` emits as ordinary functions. Nothing
//! links libfabric: src/dynload.rs opens it on first use.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set"));
    let wrappers = out.join("fi_static_fns");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_item("fi_.*|FI_.*")
        // Resolved at run time (src/dynload.rs): nothing links libfabric.
        .blocklist_function("fi_getinfo|fi_freeinfo|fi_dupinfo|fi_fabric|fi_strerror")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect(
            "bindgen runs over <rdma/fabric.h> (install libfabric-dev, libclang-dev and clang)",
        );
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
    cc::Build::new()
        .file(wrappers.with_extension("c"))
        .include(std::env::current_dir().expect("current dir"))
        .define("fi_dupinfo", "strom_ofi_fi_dupinfo")
        .warnings(false)
        .compile("strom_ofi_static_fns");
}
