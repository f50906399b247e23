"""The GPU campaign's own checks (scripts/gpu_check.py), on the outputs the H100 gave them:
what it counts as a failed test and what a medfast trace must hold. No GPU needed."""
import importlib.util
import os

import pytest

_spec = importlib.util.spec_from_file_location(
    "gpu_check", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_check.py"))
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

CTEST_FAILURES = """
0% tests passed, 5 tests failed out of 5

The following tests did not run:
\t519 - GpuTensorIoPath.DevicePathIsReported (Skipped)
The following tests FAILED:
\t582 - python/test_data (SEGFAULT)                       python
\t583 - python/test_examples (Failed)                     python
\t590 - python/test_train (Timeout)                       python
Errors while running CTest
"""


def test_every_failure_status_is_a_failure_and_skips_are_not():
    assert gpu_check.failed_tests(CTEST_FAILURES) == [
        "python/test_data (SEGFAULT)", "python/test_examples (Failed)", "python/test_train (Timeout)"]
    assert gpu_check.failed_tests("100% tests passed, 0 tests failed out of 49\n") == []


def summary(**counts):
    s = {"producer": "medfast"}
    for key in ("step", "first_load", "batch_load", "forward", "backward"):
        s[key] = {"count": counts.get(key, 0), "median_ms": 1.0}
    return s


def test_a_trace_counts_its_batch_waits_as_first_and_batch_loads():
    # `medfast trace summarize --json` of the H100's trace: the waits are named first_load/batch_load
    got = gpu_check.check_trace_summary([summary(step=2, batch_load=2, forward=2, backward=2)])
    assert got == {"step ranges": 2, "data_wait ranges": 2, "forward ranges": 2, "backward ranges": 2}
    # several files: counted together
    got = gpu_check.check_trace_summary([summary(step=1, first_load=1, forward=1, backward=1),
                                         summary(step=1, batch_load=1, forward=1, backward=1)])
    assert got["data_wait ranges"] == 2


def test_a_trace_without_a_range_or_not_medfasts_is_refused():
    with pytest.raises(RuntimeError, match=r"lacks the ranges \['data_wait', 'backward'\]"):
        gpu_check.check_trace_summary([summary(step=2, forward=2)])
    other = summary(step=2, batch_load=2, forward=2, backward=2)
    other["producer"] = "torch"
    with pytest.raises(RuntimeError, match="not medfast's"):
        gpu_check.check_trace_summary([other])


def test_a_dry_run_in_a_clean_clone_builds_as_run_sh_chooses(tmp_path):
    # No build folder: the dry run builds one through run.sh's own choice of libtorch (on a
    # machine whose python3 torch has no CMake files, Debian's), instead of failing.
    class Args:
        build = str(tmp_path / "build-gpu")
        out = str(tmp_path / "out")
        dry_run = True
        targets = None
        phase = "all"
        only = None
    c = gpu_check.Campaign(Args())
    calls = []

    def sh(cmd, timeout=None, env=None, cwd=None, check=True):
        calls.append(cmd)
        return ("run.sh: building against Debian's libtorch: the PyTorch of /usr/bin/python3 (1.13.0a0) has no CUDA "
                "and ships no CMake files to build against\n")
    c.sh = sh
    figures = c.step_build()
    assert len(calls) == 1
    cmd = calls[0]
    assert cmd[1].endswith("scripts/run.sh") and cmd[cmd.index("--torch") + 1] == "auto", cmd
    assert cmd[cmd.index("--build-dir") + 1] == Args.build and "--no-run" in cmd, cmd
    assert "medfast_gpu_tests" in cmd and "-DMEDFAST_BUILD_TESTS=ON" in cmd, cmd
    assert "Debian's libtorch" in figures["build folder"] and "no CMake files" in figures["build folder"], figures
