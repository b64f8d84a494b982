#!/usr/bin/env python3
"""scripts/check-skips.py on made-up ctest results: on a KVM host it fails when a label's tests
all skipped or skipped for want of their facility, and passes when they ran; without KVM it
passes and names the skipped tests. Run by ctest (scripts_check_skips)."""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "check-skips.py")

# name: (labels, None when it ran, else the reason it printed after "Skipped")
RAN = None
KVM_GONE = "/dev/kvm not available: No such file or directory"
TRACEFS_GONE = "tracefs not usable: no tracefs mounted"
BPF_GONE = "--bpf not possible here: no BTF"


def junit(cases):
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<testsuite name="t" tests="%d">' % len(cases)]
    for name, (_, reason) in cases.items():
        if reason is RAN:
            out.append(f'<testcase name="{name}" status="run"><system-out>[       OK ] {name}'
                       '</system-out></testcase>')
        else:
            out.append(f'<testcase name="{name}" status="notrun">'
                       '<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/><system-out>'
                       f'[ RUN      ] {name}\nx_test.cc:12: Skipped\n{reason}\n'
                       f'[  SKIPPED ] {name} (0 ms)</system-out></testcase>')
    out.append("</testsuite>")
    return "\n".join(out)


def labels(cases):
    tests = [{"name": n, "properties": [{"name": "LABELS", "value": ls}] if ls else []}
             for n, (ls, _) in cases.items()]
    return json.dumps({"kind": "ctestInfo", "tests": tests})


# A suite like the real one: each label has tests that need the facility and a usage test that
# runs anywhere.
def suite(kvm=RAN, tracefs=RAN, bpf=RAN):
    return {
        "Boot.GuestReportsPass": (["kvm"], kvm),
        "FaultMatrix.SigkillWhileWritingADump": (["kvm"], RAN),
        "TracefsSessionTest.Restores": (["tracefs"], tracefs),
        "TracefsBufferSizeTest.ParsesTheThreeForms": (["tracefs"], RAN),
        "Pairing/BpfKvmStatTest.MmioStorm/KvmRun": (["tracefs", "bpf"], bpf),
        "BpfKvmStatCli.BadUsageGetsOneLine": (["tracefs"], RAN),
        "HistogramTest.Buckets": ([], RAN),
    }


class CheckSkips(unittest.TestCase):
    def run_script(self, cases, kvm, *extra):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "ctest-junit.xml"), "w", encoding="utf-8") as f:
                f.write(junit(cases))
            with open(os.path.join(d, "labels.json"), "w", encoding="utf-8") as f:
                f.write(labels(cases))
            r = subprocess.run([sys.executable, SCRIPT, d, "--labels",
                                os.path.join(d, "labels.json"), "--kvm", kvm, *extra],
                               capture_output=True, text=True)
            return r.returncode, r.stdout + r.stderr

    def test_everything_ran_on_a_kvm_host_passes(self):
        rc, out = self.run_script(suite(), "yes")
        self.assertEqual(rc, 0, out)
        self.assertIn("kvm: 2 of 2 tests ran", out)
        self.assertIn("bpf: 1 of 1 tests ran", out)

    def test_every_test_of_a_label_skipped_on_a_kvm_host_fails(self):
        cases = suite(bpf="kvm-run not possible on this host")  # not the facility's words
        rc, out = self.run_script(cases, "yes")
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: bpf: every test skipped on a host with /dev/kvm", out)

    def test_facility_missing_on_a_kvm_host_fails_though_usage_tests_ran(self):
        for kw, reason, label in (("kvm", KVM_GONE, "kvm"), ("tracefs", TRACEFS_GONE, "tracefs"),
                                  ("bpf", BPF_GONE, "bpf")):
            with self.subTest(label=label):
                rc, out = self.run_script(suite(**{kw: reason}), "yes")
                self.assertEqual(rc, 1, out)
                # bpf: its only test here needs BPF, so every one of them skipped.
                self.assertRegex(out, f"FAILED: {label}: (1 test skipped for want of {label}|"
                                 "every test skipped)")

    def test_other_skips_on_a_kvm_host_pass_and_are_listed(self):
        rc, out = self.run_script(suite(tracefs="trace-cmd not installed"), "yes")
        self.assertEqual(rc, 0, out)
        self.assertIn("1 skipped (TracefsSessionTest.Restores): trace-cmd not installed", out)

    def test_without_kvm_everything_skipped_passes_and_says_so(self):
        rc, out = self.run_script(suite(kvm=KVM_GONE, tracefs=TRACEFS_GONE, bpf=KVM_GONE), "no")
        self.assertEqual(rc, 0, out)
        self.assertIn("kvm: 1 of 2 tests ran, 1 skipped", out)
        self.assertIn("1 skipped (Boot.GuestReportsPass): " + KVM_GONE, out)
        self.assertIn("no /dev/kvm on this host", out)

    def test_warn_only_reports_and_passes(self):
        rc, out = self.run_script(suite(kvm=KVM_GONE), "yes", "--warn-only")
        self.assertEqual(rc, 0, out)
        self.assertIn("warning: kvm: 1 test skipped for want of kvm", out)

    def test_unreadable_results_exit_2(self):
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent", "--kvm", "yes"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
