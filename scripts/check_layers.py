#!/usr/bin/env python3
"""Fails on an include that points up a layer, or a target that exports src/ publicly.

The layers (docs/development.md), each a folder of src/ and a CMake target, lowest first.
A file in src/LAYER/ may include "LAYER/...", the public headers "exitscope/...", and the
folders of the layers LAYER is allowed to use; nothing else under src/. Run by `make test`
(ctest: layers_check) on the tree, and on a planted tree with --self-test to show it can fail.

usage: check_layers.py SOURCE_DIR | --self-test
"""
import os
import re
import sys
import tempfile

# What each layer may include, besides itself and exitscope/ (the public headers).
ALLOWED = {
    "base": set(),
    "recorder": {"base"},
    "metrics": {"recorder", "base"},
    "capi": {"recorder", "metrics", "base"},
    "sources": {"recorder", "base"},
    "analysis": {"sources", "recorder", "base"},
    "report": {"analysis", "sources", "recorder", "base"},
    "vmm": {"recorder", "base", "guests"},
    "cli": {"report", "analysis", "sources", "metrics", "vmm", "recorder", "base"},
}
LAYERS = set(ALLOWED) | {"guests"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]*"', re.M)
PUBLIC_SRC = re.compile(r"target_include_directories\s*\([^)]*\bPUBLIC\b[^)]*\$\{CMAKE_SOURCE_DIR\}/src\b",
                        re.S)


def check(root):
    problems = []
    src = os.path.join(root, "src")
    for layer in sorted(os.listdir(src)):
        top = os.path.join(src, layer)
        if not os.path.isdir(top):
            continue
        if layer not in ALLOWED:
            problems.append(f"src/{layer}/: not a known layer: add it to ALLOWED in {sys.argv[0]}"
                            " and to docs/development.md")
            continue
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if name == "CMakeLists.txt":
                    text = open(path, encoding="utf-8", errors="replace").read()
                    if PUBLIC_SRC.search(text):
                        problems.append(f"{rel}: exports src/ publicly (include roots are PRIVATE)")
                    continue
                if not name.endswith((".h", ".cc", ".c")):
                    continue
                text = open(path, encoding="utf-8", errors="replace").read()
                for m in INCLUDE.finditer(text):
                    to = m.group(1)
                    if to in (layer, "exitscope") or to not in LAYERS:
                        continue
                    if to not in ALLOWED[layer]:
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append(f"{rel}:{line}: {layer}/ includes {to}/, a layer it may not "
                                        f"use (allowed: {', '.join(sorted(ALLOWED[layer])) or 'none'})")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        put("src/analysis/a.h", '#include "sources/event.h"\n#include "exitscope/status.h"\n')
        put("src/sources/bpf/b.cc", '#include "base/text.h"\n')
        assert check(root) == [], check(root)
        put("src/sources/bpf/c.cc", '#include <x>\n  #include "analysis/kvm_stats.h"\n')
        put("src/base/CMakeLists.txt",
            "target_include_directories(x PRIVATE a\n  PUBLIC ${CMAKE_SOURCE_DIR}/src)\n")
        got = check(root)
        assert len(got) == 2, got
        assert got[0].startswith("src/base/CMakeLists.txt: exports src/ publicly"), got
        assert got[1].startswith("src/sources/bpf/c.cc:2: sources/ includes analysis/"), got
    print("check_layers: self-test passed (a planted upward include and a PUBLIC src/ fail)")


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    if sys.argv[1] == "--self-test":
        self_test()
        return 0
    problems = check(sys.argv[1])
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layers: no include points up a layer; no target exports src/ publicly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
