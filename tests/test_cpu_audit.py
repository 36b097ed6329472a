"""The test run's CPU audit (tests/cpu_audit.py): its hook in real Pythons, its tables."""

from __future__ import annotations

import os
import subprocess
import sys

import cpu_audit


def test_each_python_notes_its_test_and_cpu_and_the_summary_adds_them_up(tmp_path):
    """The hook, imported as the venv's .pth would (from a folder of the test's own, not the
    venv: other tests run beside this one), in three real Pythons started with -S, so that
    a run audited itself (DISTRUN_TEST_CPU) does not import its own hook in them first: one
    that spins, one that imports a module the audit names, one started outside any test.
    Each notes its test and its CPU in a file of its own (0600 in a 0700 folder), and the
    summary adds them up."""
    audit, hook = tmp_path / "audit", tmp_path / "hook"
    audit.mkdir(mode=0o700)
    hook.mkdir()
    source = cpu_audit.HOOK.replace("@FOLDER@", repr(str(audit)))
    (hook / f"{cpu_audit.MODULE}.py").write_text(source.replace("@HEAVY@", repr(("csv",))))
    start = f"import sys; sys.path.insert(0, {str(hook)!r}); import {cpu_audit.MODULE}; "
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    runs = [(spin, "tests/test_a.py::test_spins (call)"),
            ("import csv", "tests/test_a.py::test_imports (setup)"), ("pass", None)]  # fmt: skip
    for code, test in runs:
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        if test:
            env["PYTEST_CURRENT_TEST"] = test
        subprocess.run([sys.executable, "-S", "-c", start + code], env=env, check=True, timeout=60)
    files = sorted(audit.iterdir())
    assert len(files) == 3 and {f.stat().st_mode & 0o777 for f in files} == {0o600}
    lines = cpu_audit.summary(audit)
    assert lines[0].startswith("3 Python processes")
    by_test = lines[lines.index(next(x for x in lines if x.startswith("-- by test:"))) + 1 :]
    first = by_test[0].split()
    assert first[-1] == "tests/test_a.py::test_spins" and float(first[0]) >= 0.3, by_test
    assert any(x.endswith("tests/test_a.py::test_imports") for x in by_test[:3]), by_test
    assert any("outside any test" in x for x in lines), lines
    imported = {p["test"]: p["imported"] for p in cpu_audit._processes(audit)}
    assert imported == {"tests/test_a.py::test_spins": [], "": [],
                        "tests/test_a.py::test_imports": ["csv"]}  # fmt: skip


def test_a_process_is_named_by_what_it_runs():
    assert cpu_audit.kind(["python", "-m", "jupyter_dist.cli", "run", "job.yml"]) == (
        "jupyter distrun run"
    )
    assert cpu_audit.kind(["python", "-u", "/x/ddp_train.py", "--epochs", "3"]) == "ddp_train.py"
    assert cpu_audit.kind(["/v/python", "/n/agent-0a1b.py", "--cwd", "/w"]) == "node agent"
    assert cpu_audit.kind(["python", "-I", "-c", "print(1)"]) == "-c (code)"
    assert cpu_audit.kind(["python", "-m", "ray.util.client.server"]) == "-m ray.util.client.server"
