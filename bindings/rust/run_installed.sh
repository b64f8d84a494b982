#!/bin/sh
# bindings/rust/run_installed.sh BUILD_DIR EXITSCOPE_BIN TARGET_DIR
#
# The Rust crates against an installed libexitscope, as a Rust VMM outside this tree uses them:
# `cmake --install BUILD_DIR` into a temporary prefix; then, with EXITSCOPE_LIB_DIR unset and
# PKG_CONFIG_PATH naming only that prefix (exitscope-sys finds it with pkg-config),
# `cargo test --offline --workspace` and `cargo package --offline --workspace` (both crates
# packaged, and each package built from its .crate alone). Exit 77 with the reason printed where
# cargo or pkg-config is missing (run_tests.sh says the same for cargo).
set -eu
if [ $# -ne 3 ]; then
  echo "usage: $0 BUILD_DIR EXITSCOPE_BIN TARGET_DIR" >&2
  exit 2
fi
build=$1 bin=$2 target=$3
src=$(cd "$(dirname "$0")" && pwd)
cargo=$(command -v cargo || true)
[ -n "$cargo" ] || [ ! -x "${HOME:-/root}/.cargo/bin/cargo" ] || cargo=${HOME:-/root}/.cargo/bin/cargo
if [ -z "$cargo" ] || ! "$cargo" --version >/dev/null 2>&1; then
  echo "SKIPPED: no usable cargo (PATH, \$HOME/.cargo/bin)"
  exit 77
fi
command -v pkg-config >/dev/null || { echo "SKIPPED: pkg-config is not on PATH"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/exitscope-rust-installed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
unset EXITSCOPE_LIB_DIR LD_LIBRARY_PATH
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" PKG_CONFIG_LIBDIR="$tmp/prefix/lib/pkgconfig"
export EXITSCOPE_BIN="$bin" CARGO_TARGET_DIR="$target" CARGO_TERM_COLOR=never
echo "libexitscope $(pkg-config --modversion exitscope) from $(pkg-config --variable=libdir exitscope)"
cd "$src"
"$cargo" test --offline --workspace
# The source folder may hold uncommitted work when run by hand: package what is there.
"$cargo" package --offline --workspace --allow-dirty 2>&1 | tee "$tmp/package.log"
for c in exitscope exitscope-sys; do
  [ -f "$target/package/$c-0.1.0.crate" ] || { echo "rust: $c-0.1.0.crate was not made"; exit 1; }
done
echo "rust installed: both crates tested against the prefix's libexitscope (pkg-config) and packaged"
