"""`pip install --no-build-isolation .` into a fresh environment (a venv over Debian's torch,
--system-site-packages), then, from another folder, `import medfast` and `medfast train`
(the built-in default run) to its Dice target: what a user with their own PyTorch does
(docs/python.md). The build folder is this test run's own (MEDFAST_BUILD_DIR): nothing is
compiled again."""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pip_install_gives_the_module_and_the_command(tmp_path):
    binary = os.environ.get("MEDFAST_TEST_BINARY", "")
    build_dir = os.path.dirname(binary)
    if not binary or not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        pytest.skip("MEDFAST_TEST_BINARY does not name a build folder's medfast (ctest sets it)")
    venv = tmp_path / "env"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"python3 -m venv does not work here ({made.stderr.strip()[-200:]}): "
                    "scripts/setup.sh --test installs python3-venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEDFAST_TEST_BINARY")}
    env["MEDFAST_BUILD_DIR"] = build_dir
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-build-isolation",
                          "--no-deps", "--no-index", REPO], capture_output=True, text=True, env=env, timeout=900)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env.pop("MEDFAST_BUILD_DIR")
    # The installed package, not this checkout's python/ folder.
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import medfast, torch; print(medfast.__file__); print(medfast.__version__)"],
                           capture_output=True, text=True, cwd=elsewhere, env=env)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines()[0].startswith(str(venv)), probe.stdout
    command = venv / "bin" / "medfast"
    assert command.exists()
    version = subprocess.run([str(command), "--version"], capture_output=True, text=True, cwd=elsewhere, env=env)
    assert version.returncode == 0 and version.stdout.startswith("medfast "), version.stdout + version.stderr
    run = subprocess.run([str(command), "--threads", "2", "train", "--overwrite", "--json"], capture_output=True,
                         text=True, cwd=elsewhere, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["reached_target"], run.stdout[-2000:]
    assert os.path.exists(elsewhere / "runs" / "default" / "best.ckpt")
    # Its programs live in the package, and the light one hands training to the one beside it.
    package = os.path.dirname(probe.stdout.splitlines()[0])
    assert os.access(os.path.join(package, "bin", "medfast"), os.X_OK)
    assert os.access(os.path.join(package, "bin", "medfast-torch"), os.X_OK)
    shutil.rmtree(venv)
