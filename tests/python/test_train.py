"""medfast.train.run and the package as a whole: settings, threads, Ctrl-C."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import medfast
from conftest import write_config


def test_run_returns_the_runs_metrics(tiny_config):
    epochs = []
    r = medfast.train.run(tiny_config, on_epoch=epochs.append)
    assert len(r["history"]) == 2 and [e["epoch"] for e in epochs] == [1, 2]
    assert all(e["loss"] > 0 for e in r["history"])
    assert r["history"][-1]["dice"] is not None
    assert os.path.exists(os.path.join(tiny_config["train"]["run_dir"], "last.ckpt"))
    with pytest.raises(ValueError, match="already holds a run"):
        medfast.train.run(tiny_config)
    again = medfast.train.run(tiny_config, overwrite=True)
    assert again["history"][0]["loss"] == r["history"][0]["loss"], "same seed, same run"


def test_run_config_errors_are_value_errors(tiny_config):
    tiny_config["optimizer"]["momentum"] = 0.9  # Adam takes none
    with pytest.raises(ValueError, match="optimizer.momentum: unknown argument for Adam"):
        medfast.train.run(tiny_config)


def test_a_number_written_as_text_is_refused_naming_the_dict(tiny_config):
    # PyYAML (YAML 1.1) reads 1e-05 as a string: the error names the dict it came in, not a
    # built-in config, and says how to write the number.
    tiny_config["optimizer"]["lr"] = "1e-05"
    with pytest.raises(ValueError) as e:
        medfast.train.run(tiny_config)
    assert "the config dict given to medfast.train.run" in str(e.value)
    assert "optimizer.lr" in str(e.value) and "1.0e-05 as a number" in str(e.value)
    assert "built-in default" not in str(e.value)


def test_a_plan_reads_the_same_in_pyyaml(medfast_binary, synth_dir, tmp_path):
    # Every number of a plan's YAML is a number to a YAML 1.1 reader too (1.0e-05, not 1e-05).
    yaml = pytest.importorskip("yaml")
    out = tmp_path / "plan.yaml"
    subprocess.run([medfast_binary, "plan", "--dataset", str(synth_dir), "--device", "cpu", "--memory", "2GiB",
                    "--out", str(out)], check=True, capture_output=True)
    text = open(out).read()
    ours = json.loads(subprocess.run([medfast_binary, "config", "resolve", "--config", str(out)], check=True,
                                     capture_output=True, text=True).stdout)
    theirs = yaml.safe_load(text)
    assert isinstance(theirs["optimizer"]["weight_decay"], float), theirs["optimizer"]
    for section in ("optimizer", "loss", "validation"):
        for key, value in theirs[section].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert value == pytest.approx(ours[section][key]), (section, key)
            assert not (isinstance(value, str) and value.replace(".", "").replace("e-", "").isdigit()), (section, key)


def test_settings_and_threads():
    assert medfast.settings.get("gzip_level") == "6"
    medfast.settings.set("gzip_level", 9)
    assert medfast.settings.show()["gzip_level"] == ("9", "flag")
    medfast.settings.set("gzip_level", 6)
    with pytest.raises(ValueError, match="gzip_level"):
        medfast.settings.set("gzip_level", 99)
    with pytest.raises(ValueError, match="unknown setting"):
        medfast.settings.get("speed")


def test_import_changes_no_torch_setting():
    code = ("import torch; torch.set_num_threads(3); before = (torch.get_num_threads(), torch.get_default_dtype()); "
            "import medfast; after = (torch.get_num_threads(), torch.get_default_dtype()); "
            "print(before == after, after[0])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env=dict(os.environ)).stdout.split()
    assert out == ["True", "3"]


def test_ctrl_c_interrupts_a_run(tiny_config, tmp_path):
    tiny_config["train"]["epochs"] = 1000
    config = write_config(tmp_path / "run.json", tiny_config)
    code = f"import medfast, sys; medfast.train.run({str(config)!r}); print('finished')"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    run_dir = tiny_config["train"]["run_dir"]
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(run_dir, "config.json")) and time.time() < deadline:
        time.sleep(0.2)  # training has started
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "finished" not in out
    assert "KeyboardInterrupt" in err, err


def test_check_backends_reports_the_self_check():
    r = medfast.train.check_backends("cpu", "float32")
    assert r["ran"] and r["passed"], r
    assert r["device"] == "cpu" and r["dtype"] == "float32"
    # 12 of libtorch's; on a CPU with AVX2 and FMA (or AVX-512), two of medfast's direct convolution
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    direct = [o for o in r["ops"] if o["backend"].startswith("medfast direct convolution")]
    assert len(direct) == (2 if {"avx2", "fma"} <= flags else 0), r["ops"]
    assert len(r["ops"]) == 12 + len(direct)
    assert all(op["passed"] and op["worst_ratio"] <= 1 for op in r["ops"]), r["ops"]
    # Once per process, device and dtype: the same report again.
    assert medfast.train.check_backends("cpu", "float32")["seconds"] == r["seconds"]
    with pytest.raises(ValueError, match="not float32, bfloat16 or float16"):
        medfast.train.check_backends("cpu", "int8")
    with pytest.raises(ValueError, match="not cpu, cuda or cuda:N"):
        medfast.train.check_backends("tpu")


def test_run_refuses_to_train_alone_under_a_launcher(tiny_config, monkeypatch):
    # Under torchrun each process would train on its share with no gradient averaging.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="rank 1 of 2.*medfast launch"):
        medfast.train.run(tiny_config)


def test_default_config_follows_the_device():
    cpu = medfast.train.default_config("cpu")
    assert cpu["train"]["device"] == "auto"  # the recipe trains where auto chooses; its settings are the CPU's
    assert cpu["train"]["amp"] is False and cpu["data"]["cache"]["kind"] == "memory"
    auto = medfast.train.default_config()
    if not torch.cuda.is_available():
        assert auto == cpu
    else:
        assert auto["train"]["amp"] in ("bf16", "fp16") and auto["data"]["cache"]["kind"] == "device"
