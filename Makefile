# Front door: `make demo` and `make test` install missing Debian packages, configure, build, run.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# CI (.ci/run) sets EXITSCOPE_CI=1: warnings are errors, the HTML report's plotting library
# must build, and scripts/check-skips.py fails (not warns) when the kvm, tracefs or bpf tests
# did not run on a KVM host. Off, the options are set off again (a build tree CI used before).
EXITSCOPE_CI ?=
CI_CMAKE_FLAGS = $(if $(EXITSCOPE_CI),-DEXITSCOPE_WERROR=ON -DEXITSCOPE_REQUIRE_HTML=ON,-DEXITSCOPE_WERROR=OFF -DEXITSCOPE_REQUIRE_HTML=OFF)
# The demo installs no npm: its HTML report is built only where npm already is.
DEMO_CMAKE_FLAGS = $(if $(EXITSCOPE_CI),-DEXITSCOPE_WERROR=ON,-DEXITSCOPE_WERROR=OFF) -DEXITSCOPE_REQUIRE_HTML=OFF

.PHONY: all deps configure build demo test bench asan tsan format clean fuzz deb

all: build

deps:
	@scripts/install-deps.sh

# Full debug info and one object per source file (a build tree `make demo` used is set back).
configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" -DCMAKE_UNITY_BUILD=OFF -DEXITSCOPE_BUILD_TESTS=ON -DEXITSCOPE_BUILD_BENCH=ON $(CI_CMAKE_FLAGS) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The demo installs and builds only what it runs: the tool (no test, no benchmark), as a unity
# build (a few large translation units: a third of the compile time) with line tables only
# (-g1: the stacks it shows keep file:line). A later `make test` in the same build tree turns
# tests, benchmarks, full debug info and one object per file back on. CI runs it too, so a
# name two files of one library both define breaks CI, not the demo (docs/development.md).
demo:
	@scripts/install-deps.sh --demo
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON -DEXITSCOPE_BUILD_TESTS=OFF -DEXITSCOPE_BUILD_BENCH=OFF $(DEMO_CMAKE_FLAGS) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target exitscope
	@scripts/demo.sh $(BUILD)

# Then the skip check: on a KVM host, did the kvm, tracefs and bpf tests run? (docs/development.md)
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --output-junit $(abspath $(BUILD))/ctest-junit.xml
	@scripts/check-skips.py $(BUILD) $(if $(EXITSCOPE_CI),,--warn-only)

# Debian packages (cmake/package.cmake, docs/install.md): libexitscope0, libexitscope-dev,
# exitscope, into $(BUILD)/ as *.deb.
deb: build
	@cd $(BUILD) && cpack -G DEB

bench: build
	@scripts/bench.sh $(BUILD)

# Sanitizer builds, one command each (docs/development.md).
# LeakSanitizer ignores the few bytes Debian's libtraceevent/libtracecmd keep (scripts/lsan.supp).
asan: export LSAN_OPTIONS = suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0
asan: export UBSAN_OPTIONS = print_stacktrace=1
asan:
	@$(MAKE) --no-print-directory test BUILD=build-asan CMAKE_FLAGS="-DEXITSCOPE_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug -DEXITSCOPE_BUILD_BENCH=OFF"

# ThreadSanitizer ignores a race inside Debian's civetweb (gmtime in its workers; scripts/tsan.supp).
# It builds only the concurrency tests' executables (target concurrency_tests), not the tree.
tsan: export TSAN_OPTIONS = suppressions=$(CURDIR)/scripts/tsan.supp
tsan:
	@$(MAKE) --no-print-directory configure BUILD=build-tsan CMAKE_FLAGS="-DEXITSCOPE_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEXITSCOPE_BUILD_BENCH=OFF"
	@cmake --build build-tsan -j $(JOBS) --target concurrency_tests
	@cd build-tsan && ctest --output-on-failure -L concurrency

# AFL++ on every parser for FUZZ_SECONDS each (build-fuzz/, docs/fuzzing.md); fails on a crash.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/fuzz.sh $(FUZZ_SECONDS)

format:
	@git ls-files '*.cc' '*.h' '*.c' | xargs clang-format -i

clean:
	rm -rf build build-asan build-tsan
