"""medfast.data: CachedDataset as a torch Dataset, and the Loader against the CLI's."""
import subprocess

import pytest
import torch
import torch.utils.data

import medfast
from conftest import write_config


def test_cached_dataset_is_a_torch_dataset(tiny_config):
    ds = medfast.data.CachedDataset(tiny_config)
    assert isinstance(ds, torch.utils.data.Dataset)
    assert len(ds) == 5  # 6 cases, the last one for validation
    item = ds[0]
    assert set(item) >= {"image", "label", "image_affine", "label_affine"}
    assert item["image"].dim() == 4 and item["image"].dtype == torch.float32
    assert item["image_affine"].shape == (4, 4)
    assert torch.equal(ds[-1]["image"], ds[4]["image"])
    with pytest.raises(IndexError):
        ds[5]
    val = medfast.data.CachedDataset(tiny_config, validation=True)
    assert len(val) == 1
    report = ds.fill()
    assert report["items"] == 5 and report["reused"] + report["computed"] == 5


@pytest.mark.parametrize("workers,cache", [(0, "memory"), (2, "memory"), (2, "disk")])
def test_cached_dataset_with_a_torch_data_loader(tiny_config, tmp_path, workers, cache):
    # Forked workers read the parent's cache: memory, or disk entries through the I/O engine
    # (whose worker pools a child must not inherit).
    tiny_config["data"]["cache"] = {"kind": cache, "dir": str(tmp_path / "cache")}
    medfast.settings.set("io_backend", "posix")
    medfast.settings.set("io_threads", 2)
    ds = medfast.data.CachedDataset(tiny_config)
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=workers,
                                         collate_fn=lambda items: items)
    seen = [batch[0]["image"] for batch in loader]
    assert len(seen) == 5
    for i, image in enumerate(seen):
        assert torch.equal(image, ds[i]["image"]), i
    medfast.settings.set("io_backend", "auto")
    medfast.settings.set("io_threads", 0)


def test_loader_batches_equal_the_cli_loaders(tiny_config, tmp_path, medfast_binary):
    config = write_config(tmp_path / "data.json", tiny_config)
    out = tmp_path / "batches"
    subprocess.run([medfast_binary, "--threads", "2", "bench", "loader", "--config", str(config), "--check-epochs", "2",
                    "--repeats", "1", "--min-seconds", "0", "--save-batches", str(out)], check=True, capture_output=True)
    ds = medfast.data.CachedDataset(tiny_config)
    loader = medfast.data.Loader(ds, threads=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) == 3  # 5 items, batch size 2
        for b, batch in enumerate(batches):
            for key in ["image", "label"]:
                cli = medfast.io.load_tensor(str(out / f"epoch{epoch}_batch{b}_{key}.mft"))
                assert torch.equal(batch[key], cli), (epoch, b, key)
    # The same seed gives the same batches whatever the thread count.
    one = medfast.data.Loader(ds, threads=1, prefetch=1)
    one.set_epoch(1)
    assert all(torch.equal(x["image"], y["image"]) for x, y in zip(one, batches))


def test_loader_options_are_checked(tiny_config):
    ds = medfast.data.CachedDataset(tiny_config)
    with pytest.raises(ValueError, match="unknown argument 'batchsize'"):
        medfast.data.Loader(ds, batchsize=2)
    with pytest.raises(ValueError, match="batch_size 0"):
        medfast.data.Loader(ds, batch_size=0)


def test_a_bad_config_is_a_value_error_naming_the_key(tiny_config):
    tiny_config["data"]["cache"] = {"kind": "ram"}
    with pytest.raises(ValueError, match="data.cache.kind"):
        medfast.data.CachedDataset(tiny_config)


def test_pipeline_from_a_yaml_file_is_shared_by_datasets(tiny_config, tmp_path):
    import json
    # JSON is YAML: a run config file as the CLI reads it, relative paths from its folder.
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(tiny_config))
    pipeline = medfast.data.Pipeline(str(path))
    assert (pipeline.items, pipeline.validation_items) == (5, 1)
    train = medfast.data.CachedDataset(pipeline)
    val = medfast.data.CachedDataset(pipeline, validation=True)
    from_dict = medfast.data.CachedDataset(tiny_config)
    assert torch.equal(train[2]["image"], from_dict[2]["image"])
    assert len(val) == 1
    with pytest.raises(FileNotFoundError, match="missing.yaml"):  # an OSError with errno ENOENT
        medfast.data.Pipeline(str(tmp_path / "missing.yaml"))


def test_two_pipelines_with_different_settings_in_one_process(tiny_config, tmp_path):
    import copy
    # Reading a config changes nothing process-wide: each pipeline keeps its own settings
    # (its config's settings map), whichever was made last.
    small = copy.deepcopy(tiny_config)
    small["settings"] = {"max_volume_bytes": "1KiB", "threads": 1}
    large = copy.deepcopy(tiny_config)
    large["settings"] = {"threads": 2}
    before = medfast.settings.get("max_volume_bytes")
    p_small = medfast.data.Pipeline(small)
    p_large = medfast.data.Pipeline(large)
    assert medfast.settings.get("max_volume_bytes") == before
    with pytest.raises(ValueError, match="max_volume_bytes"):
        medfast.data.CachedDataset(p_small)
    ds = medfast.data.CachedDataset(p_large)
    assert len(ds) == 5
    batch = next(iter(medfast.data.Loader(ds, shuffle=False)))
    assert batch["image"].dim() == 5
    p_small_again = medfast.data.Pipeline(small)  # made after the large one: still limited
    with pytest.raises(ValueError, match="max_volume_bytes"):
        medfast.data.CachedDataset(p_small_again)
    assert len(medfast.data.CachedDataset(p_large)) == 5


def test_a_pipeline_writes_its_synthetic_dataset_first(tiny_config, tmp_path):
    c = dict(tiny_config)
    c["data"] = dict(tiny_config["data"])
    c["data"]["dataset"] = str(tmp_path / "synth" / "dataset.json")
    c["data"]["synth"] = {"cases": 3, "size": "24,24,8", "seed": 2}
    c["data"]["validation"] = None
    pipeline = medfast.data.Pipeline(c)
    assert pipeline.items == 3
    assert (tmp_path / "synth" / "dataset.json").exists()


def test_loader_on_the_cpu_with_pinned_batches(tiny_config):
    ds = medfast.data.CachedDataset(tiny_config)
    loader = medfast.data.Loader(ds, device="cpu", pin_memory=torch.cuda.is_available(), prefetch=3, threads=2)
    batch = next(iter(loader))
    crops = tiny_config["data"]["random"][0]["num_samples"]  # RandCropByPosNegLabel's crops per item
    assert batch["image"].device.type == "cpu" and batch["image"].shape[0] == 2 * crops
    with pytest.raises(ValueError, match="device"):
        medfast.data.Loader(ds, device="tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine runs it)")
def test_gpu_loader_and_io_load_to_cuda(tiny_config, tmp_path):
    ds = medfast.data.CachedDataset(tiny_config)
    batch = next(iter(medfast.data.Loader(ds, device="cuda", threads=2)))
    assert batch["image"].is_cuda
    data = torch.arange(1 << 20, dtype=torch.int32).view(torch.uint8)
    path = str(tmp_path / "g.bin")
    medfast.io.save(data, path)
    back = medfast.io.load(path, device="cuda")
    assert back.is_cuda and torch.equal(back.cpu(), data)
    medfast.io.save_tensor(data.cuda(), str(tmp_path / "g.mft"))
    assert torch.equal(medfast.io.load_tensor(str(tmp_path / "g.mft"), device="cuda").cpu(), data)
