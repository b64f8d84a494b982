//! Links libexitscope.so: an installed one, found with pkg-config, or a CMake build's.
//!
//! Where the library is looked for, first match wins:
//! 1. EXITSCOPE_LIB_DIR, the folder that holds libexitscope.so (an override, e.g. `<build>/lib`);
//! 2. `pkg-config exitscope` (an install: `cmake --install`, the libexitscope-dev package;
//!    PKG_CONFIG_PATH picks a prefix), its version checked against this crate's;
//! 3. `../../build/lib` of the source tree (what `make` builds), if it exists.
//! The folder is passed on to dependents as DEP_EXITSCOPE_LIB_DIR (for their rpath).
use std::env;
use std::path::PathBuf;
use std::process::Command;

// `pkg-config ARGS exitscope`: its output, or why it gave none.
fn pkg_config(args: &[&str]) -> Result<String, String> {
    let out = Command::new(env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into()))
        .args(args)
        .arg("exitscope")
        .output()
        .map_err(|e| format!("pkg-config: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=EXITSCOPE_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo:rerun-if-changed=build.rs");
    let crate_version = env::var("CARGO_PKG_VERSION").unwrap();
    let (dir, how) = match env::var_os("EXITSCOPE_LIB_DIR") {
        Some(d) if !d.is_empty() => (PathBuf::from(d), "EXITSCOPE_LIB_DIR".to_string()),
        _ => match pkg_config(&["--variable=libdir"]) {
            Ok(libdir) if !libdir.is_empty() => {
                let version = pkg_config(&["--modversion"]).unwrap_or_default();
                // Before 1.0 every minor release may break the ABI (the SONAME says so).
                let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
                if minor(&version) != minor(&crate_version) {
                    eprintln!(
                        "exitscope-sys: pkg-config finds exitscope {version} in {libdir}, this \
                         crate is {crate_version}: install a matching libexitscope or set \
                         EXITSCOPE_LIB_DIR"
                    );
                    std::process::exit(1);
                }
                (PathBuf::from(libdir), format!("pkg-config (exitscope {version})"))
            }
            other => {
                let why = match other {
                    Err(e) => e,
                    Ok(_) => "no libdir".into(),
                };
                let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
                let tree = manifest.join("../../../build/lib");
                if !tree.join("libexitscope.so").is_file() {
                    eprintln!(
                        "exitscope-sys: libexitscope not found: pkg-config exitscope: {why}; \
                         install it (cmake --install, or the libexitscope-dev package) and set \
                         PKG_CONFIG_PATH to its lib/pkgconfig, or set EXITSCOPE_LIB_DIR to a \
                         folder holding libexitscope.so (e.g. build/lib)"
                    );
                    std::process::exit(1);
                }
                (tree, "the source tree's build/lib".to_string())
            }
        },
    };
    let lib = dir.join("libexitscope.so");
    if !lib.is_file() {
        // One line naming what is missing and how to fix it, then stop the build.
        eprintln!(
            "exitscope-sys: {} not found (from {how}): build the CMake target exitscope_c and \
             set EXITSCOPE_LIB_DIR to its folder (e.g. build/lib), or install exitscope",
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
