//! Gives libstrom.so its soname, so that programs linked against it load
//! `libstrom.so.0` (what `make install` puts next to libstrom.so).
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libstrom.so.0");
    }
}
