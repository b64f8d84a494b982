#!/bin/sh
# bindings/rust/run_tests.sh LIB_DIR EXITSCOPE_BIN TARGET_DIR
#
# Runs the Rust crate's tests (`cargo test --offline`, both crates of the workspace) against
# the libexitscope.so in LIB_DIR and the exitscope binary EXITSCOPE_BIN of the same CMake build,
# with CARGO_TARGET_DIR=TARGET_DIR. Exit 77 (ctest SKIP_RETURN_CODE) with the reason printed
# where there is no usable cargo: Rust is optional, the C++ build never needs it.
set -eu
if [ $# -ne 3 ]; then
  echo "usage: $0 LIB_DIR EXITSCOPE_BIN TARGET_DIR" >&2
  exit 2
fi
lib_dir=$1 bin=$2 target=$3
src=$(cd "$(dirname "$0")" && pwd)

cargo=$(command -v cargo || true)
if [ -z "$cargo" ] && [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
  cargo=${HOME:-/root}/.cargo/bin/cargo
fi
if [ -z "$cargo" ]; then
  echo "SKIPPED: cargo not found (PATH, \$HOME/.cargo/bin): the Rust crate's tests need a Rust toolchain"
  exit 77
fi
if ! version=$("$cargo" --version 2>&1); then
  echo "SKIPPED: $cargo does not run: $version"
  exit 77
fi
# The crate's rust-version (Cargo.toml): an older toolchain (Debian 12 ships 1.63) cannot build it.
rustc=$(dirname "$cargo")/rustc
[ -x "$rustc" ] || rustc=rustc
need=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' "$src/Cargo.toml")
have=$("$rustc" --version 2>/dev/null | sed -n 's/^rustc \([0-9]*\.[0-9]*\).*/\1/p')
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  echo "SKIPPED: rustc ${have:-missing} is older than the crate's rust-version $need ($version)"
  exit 77
fi
if [ ! -f "$lib_dir/libexitscope.so" ]; then
  echo "rust: $lib_dir/libexitscope.so not found: build the CMake target exitscope_c" >&2
  exit 1
fi
if [ ! -x "$bin" ]; then
  echo "rust: $bin not found: build the CMake target exitscope" >&2
  exit 1
fi

echo "$version; libexitscope from $lib_dir; inspect with $bin"
cd "$src"
export EXITSCOPE_LIB_DIR="$lib_dir" EXITSCOPE_BIN="$bin" CARGO_TARGET_DIR="$target"
export CARGO_TERM_COLOR=never
# The tests carry an rpath to LIB_DIR; LD_LIBRARY_PATH covers doctests as well.
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$cargo" test --offline --workspace
