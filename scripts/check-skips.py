#!/usr/bin/env python3
"""scripts/check-skips.py BUILD [--junit FILE] [--labels FILE] [--kvm yes|no] [--warn-only]

The gate after ctest (`make test`, docs/development.md): did the tests labelled kvm, tracefs
and bpf really run? Reads ctest's JUnit report of the run (BUILD/ctest-junit.xml, written by
`ctest --output-junit`) and each test's labels (`ctest --show-only=json-v1` in BUILD).

On a host where /dev/kvm opens read-write, it fails (exit 1) when, for one of those labels,
  - no test ran (every one skipped or was not run), or
  - a test skipped because its facility was missing: "/dev/kvm not available" (kvm),
    "tracefs not usable" / "tracefs not mounted" (tracefs), "--bpf not possible here" (bpf),
    the reasons tests/support prints. Those skip all together when the facility is
    missing, while a few tests of each label (usage errors) run anywhere.
Without /dev/kvm it passes and says which of those tests skipped, and why.

--warn-only prints the same but exits 0 (`make test` outside CI: a developer's KVM host
may lack root for tracefs). --junit / --labels / --kvm replace what is read from BUILD and the
host (tests/scripts/check_skips_test.py). Exit 2: the report could not be read.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

LABELS = ("kvm", "tracefs", "bpf")
# What a test prints when it skips because the label's facility is missing.
FACILITY_MISSING = {
    "kvm": re.compile(r"/dev/kvm not available|/dev/kvm: .*no KVM on this host"),
    "tracefs": re.compile(r"tracefs not (usable|mounted)"),
    "bpf": re.compile(r"--bpf not possible here"),
}


def kvm_present():
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
        return True
    except OSError:
        return False


def read_labels(build, labels_file):
    """{test name: set of labels}."""
    if labels_file:
        with open(labels_file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                              capture_output=True, text=True).stdout
    out = {}
    for t in json.loads(text).get("tests", []):
        labels = set()
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels.update(p.get("value", []))
        out[t["name"]] = labels
    return out


def skip_reason(case):
    """The reason a skipped test gave: GoogleTest prints "FILE:LINE: Skipped" and the reason on
    the next line; else ctest's own message (e.g. "Unable to find executable")."""
    out = case.findtext("system-out") or ""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1].strip() or "(no reason printed)"
    skipped = case.find("skipped")
    msg = skipped.get("message", "") if skipped is not None else ""
    return msg or "(no reason printed)"


def read_results(junit):
    """{test name: (ran, skip reason or "")}."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        skipped = case.find("skipped") is not None or case.get("status") in ("notrun",
                                                                              "disabled")
        out[case.get("name")] = (not skipped, skip_reason(case) if skipped else "")
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--junit", help="ctest's JUnit report (default BUILD/ctest-junit.xml)")
    ap.add_argument("--labels", help="`ctest --show-only=json-v1` output (default: run it)")
    ap.add_argument("--kvm", choices=("yes", "no"), help="whether /dev/kvm opens (default: try)")
    ap.add_argument("--warn-only", action="store_true")
    args = ap.parse_args(argv)
    junit = args.junit or os.path.join(args.build, "ctest-junit.xml")
    try:
        results = read_results(junit)
        labels = read_labels(args.build, args.labels)
    except (OSError, ET.ParseError, ValueError, KeyError, subprocess.CalledProcessError) as e:
        print(f"check-skips: cannot read the test results: {e}", file=sys.stderr)
        return 2
    kvm = kvm_present() if args.kvm is None else args.kvm == "yes"

    problems = []
    for label in LABELS:
        names = sorted(n for n, ls in labels.items() if label in ls and n in results)
        ran = [n for n in names if results[n][0]]
        skipped = [n for n in names if not results[n][0]]
        print(f"check-skips: {label}: {len(ran)} of {len(names)} tests ran, "
              f"{len(skipped)} skipped")
        by_reason = {}
        for n in skipped:
            by_reason.setdefault(results[n][1], []).append(n)
        for reason, tests in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            more = f" and {len(tests) - 1} more" if len(tests) > 1 else ""
            print(f"check-skips:   {len(tests)} skipped ({tests[0]}{more}): {reason}")
        missing = [n for n in skipped if FACILITY_MISSING[label].search(results[n][1])]
        if not kvm or not names:
            continue
        if not ran:
            problems.append(f"{label}: every test skipped on a host with /dev/kvm")
        elif missing:
            tests = "1 test" if len(missing) == 1 else f"{len(missing)} tests"
            problems.append(f"{label}: {tests} skipped for want of {label} on a host with "
                            f"/dev/kvm (first: {missing[0]})")

    if not kvm:
        print("check-skips: no /dev/kvm on this host: the tests above that need it were skipped "
              "(not a failure here)")
        return 0
    if not problems:
        print("check-skips: /dev/kvm here, and the kvm, tracefs and bpf tests ran")
        return 0
    for p in problems:
        print(f"check-skips: {'warning' if args.warn_only else 'FAILED'}: {p}", file=sys.stderr)
    return 0 if args.warn_only else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
