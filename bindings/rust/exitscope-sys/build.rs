//! Links libexitscope.so from a CMake build of exitscope.
//!
//! EXITSCOPE_LIB_DIR names the folder that holds libexitscope.so (`<build>/lib`); without it,
//! `../../build/lib` of the source tree (what `make` builds) is used if it exists. The folder
//! is passed on to dependents as DEP_EXITSCOPE_LIB_DIR (for their rpath).
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=EXITSCOPE_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = match env::var_os("EXITSCOPE_LIB_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
            manifest.join("../../../build/lib")
        }
    };
    let lib = dir.join("libexitscope.so");
    if !lib.is_file() {
        // One line naming what is missing and how to fix it, then stop the build.
        eprintln!(
            "exitscope-sys: {} not found: build the CMake target exitscope_c and set \
             EXITSCOPE_LIB_DIR to its folder (e.g. build/lib)",
            lib.display()
        );
        std::process::exit(1);
    }
    let dir = dir.canonicalize().unwrap_or(dir);
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=exitscope");
    // The crate's own tests run against the same library without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:lib_dir={}", dir.display());
}
