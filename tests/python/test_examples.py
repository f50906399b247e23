"""examples/python run as their docstrings say."""
import importlib.util
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")


def test_tensor_io_example(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "tensor_io.py"), "--mb", "8", "--dir", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    for line in ["medfast.io.save_tensor", "medfast.io.load_tensor", "torch.load", "FileHandle.async_pread"]:
        assert line in r.stdout, r.stdout
    assert os.listdir(tmp_path) == []


def test_monai_example_trains_to_its_dice(tmp_path):
    # MONAI is a peer to compare with, not a dependency: this runs where MONAI_PATH
    # names a MONAI (the project's benchmarks use the MONAI 1.3.2 peer copy beside the repository).
    path = os.environ.get("MONAI_PATH")
    if not path and importlib.util.find_spec("monai") is None:
        pytest.skip("MONAI is not importable and MONAI_PATH is not set")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "monai_train_with_medfast.py"), "--epochs", "40",
                        "--target", "0.8"], capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ),
                       timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reached dice 0.8" in r.stdout
