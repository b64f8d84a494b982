//! Puts the libexitscope folder that exitscope-sys linked (DEP_EXITSCOPE_LIB_DIR) in the rpath
//! of this crate's tests and examples, so they run without LD_LIBRARY_PATH. A VMM that ships
//! libexitscope.so elsewhere sets its own rpath or installs the library in the linker's path.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_EXITSCOPE_LIB_DIR");
    if let Some(dir) = std::env::var_os("DEP_EXITSCOPE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
}
