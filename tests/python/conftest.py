"""Fixtures for the Python package's tests (run by ctest with PYTHONPATH at the built package)."""
import json
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def medfast_binary():
    path = os.environ.get("MEDFAST_TEST_BINARY", "")
    if not path or not os.path.exists(path):
        pytest.skip("MEDFAST_TEST_BINARY is not set (ctest sets it)")
    return path


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory, medfast_binary):
    """Six small spleen-like cases written by `medfast data synth`."""
    out = tmp_path_factory.mktemp("synth") / "ds"
    subprocess.run([medfast_binary, "data", "synth", "--out", str(out), "--cases", "6", "--size", "40,40,12-14", "--spacing", "2", "2", "3",
                    "--seed", "1"], check=True, capture_output=True)
    return out


@pytest.fixture
def tiny_config(tmp_path, synth_dir):
    """The built-in default run at a tiny size (as tests/train/test_trainer.cpp's tiny_config)."""
    import medfast

    c = medfast.train.default_config("cpu")  # the CPU's recipe on any machine
    c["train"]["device"] = "cpu"
    c["data"]["dataset"] = str(synth_dir / "dataset.json")
    del c["data"]["synth"]
    c["data"]["validation"] = {"num": 1}
    c["data"]["random"][0]["spatial_size"] = [16, 16, 8]
    c["model"]["channels"] = [4, 8, 16]
    c["model"]["strides"] = [2, 2]
    c["validation"]["sliding_window"]["roi_size"] = [16, 16, 8]
    c["train"]["run_dir"] = str(tmp_path / "run")
    c["train"]["epochs"] = 2
    c["train"]["target_dice"] = 0
    c["train"]["threads"] = 1
    return c


def write_config(path, config):
    path.write_text(json.dumps(config))
    return path
