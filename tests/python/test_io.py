"""medfast.io: bytes and tensors through the engine, compared byte for byte."""
import errno
import os
import threading
import time

import pytest
import torch

import medfast


def random_bytes(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def test_save_and_load_raw_bytes(tmp_path):
    data = random_bytes((3 << 20) + 4097)
    path = str(tmp_path / "raw.bin")
    medfast.io.save(data, path)
    assert open(path, "rb").read() == data.numpy().tobytes()
    back = medfast.io.load(path)
    assert back.dtype == torch.uint8 and torch.equal(back, data)
    # Into a preallocated tensor of another dtype: its bytes are the file's.
    out = torch.empty(len(data) // 4, dtype=torch.float32)
    assert medfast.io.load(path, out=out) is not None
    assert out.view(torch.uint8).numpy().tobytes() == data.numpy().tobytes()[: out.numel() * 4]
    for backend in ["posix", "odirect", "io_uring"]:
        try:
            again = medfast.io.load(path, backend=backend, block_size="64K", queue_depth=4)
        except RuntimeError as e:  # io_uring blocked in some containers: a clear error, not a crash
            assert "io_uring" in str(e)
            continue
        assert torch.equal(again, data), backend
    assert sorted(os.listdir(tmp_path)) == ["raw.bin"], "no temporary file left behind"


def test_every_io_option_is_a_keyword_argument(tmp_path):
    # One per io_* setting (IoOptions' fields): each is taken by name with its own value,
    # a changed one too, and a bad value or an unknown name is an error naming it.
    options = medfast.io.options()
    assert list(options) == ["backend", "block_size", "queue_depth", "threads", "direct", "cache_first",
                             "alignment"]
    assert options["backend"] == "auto" and options["block_size"] == 1 << 20 and options["direct"] is True
    data = random_bytes(100000, 4)
    path = str(tmp_path / "kw.bin")
    medfast.io.save(data, path, **options)
    assert torch.equal(medfast.io.load(path, **options), data)
    changed = {"backend": "posix", "block_size": "64K", "queue_depth": 8, "threads": 2, "direct": False,
               "cache_first": False, "alignment": 512}
    assert set(changed) == set(options)
    for key, value in changed.items():
        assert torch.equal(medfast.io.load(path, **{key: value}), data), key
        h = medfast.io.FileHandle(path, "r", **{key: value})
        assert h.size == len(data)
    with pytest.raises(ValueError, match="io_queue_depth.*keyword argument queue_depth.*1..4096"):
        medfast.io.load(path, queue_depth=0)
    with pytest.raises(ValueError, match="io_backend.*'nope'.*expected one of auto, posix, odirect, io_uring, cufile"):
        medfast.io.load(path, backend="nope")
    with pytest.raises(ValueError, match="unknown I/O option 'queue'.*queue_depth"):
        medfast.io.load(path, queue=4)


def test_file_handle_pread_pwrite_and_async(tmp_path):
    path = str(tmp_path / "h.bin")
    a, b = random_bytes(10000, 1), random_bytes(5000, 2)
    w = medfast.io.FileHandle(path, "w")
    w.pwrite(a, 0)
    w.async_pwrite(b, 10000).wait()
    w.sync()
    r = medfast.io.FileHandle(path)
    assert r.size == 15000 and r.backend in ("posix", "io_uring", "odirect")
    x, y = torch.empty(10000, dtype=torch.uint8), torch.empty(5000, dtype=torch.uint8)
    assert r.pread(x, 0) == 10000
    f = r.async_pread(y, 10000)
    assert f.wait() == 5000 and f.done()
    assert torch.equal(x, a) and torch.equal(y, b)
    tail = torch.empty(100, dtype=torch.uint8)
    assert r.pread(tail, 14950) == 50, "a read past the end returns the bytes there are"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_save_tensor_round_trips_dtype_and_shape(tmp_path, dtype):
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(3, 5, 7, generator=g) * 50).to(dtype)
    path = str(tmp_path / "t.mft")
    medfast.io.save_tensor(t.transpose(0, 2), path)  # not contiguous: saved as its values
    back = medfast.io.load_tensor(path)
    assert back.dtype == dtype and back.shape == (7, 5, 3)
    assert torch.equal(back, t.transpose(0, 2))
    empty = torch.empty(0, 4, dtype=dtype)
    medfast.io.save_tensor(empty, path, durable=False)
    assert medfast.io.load_tensor(path).shape == (0, 4)


def test_load_tensor_refuses_damaged_and_foreign_files(tmp_path):
    path = tmp_path / "t.mft"
    medfast.io.save_tensor(torch.arange(100000, dtype=torch.float32), str(path))
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        medfast.io.load_tensor(str(path))
    assert medfast.io.load_tensor(str(path), verify=False).numel() == 100000
    (tmp_path / "x.pt").write_bytes(b"PK\x03\x04 not ours")
    with pytest.raises(ValueError, match="not a medfast tensor file"):
        medfast.io.load_tensor(str(tmp_path / "x.pt"))
    path.write_bytes(bytes(raw[:5000]))
    with pytest.raises(ValueError, match="cut short"):
        medfast.io.load_tensor(str(path))


def test_errors_are_python_exceptions(tmp_path):
    with pytest.raises(OSError) as e:
        medfast.io.load(str(tmp_path / "missing.bin"))
    assert e.value.errno == errno.ENOENT and "missing.bin" in str(e.value)
    with pytest.raises(ValueError, match="unknown I/O option 'speed'"):
        medfast.io.load(str(tmp_path / "missing.bin"), speed=3)
    with pytest.raises(ValueError, match="tape"):
        medfast.io.load(str(tmp_path / "missing.bin"), backend="tape")
    with pytest.raises(ValueError, match="mode"):
        medfast.io.FileHandle(str(tmp_path / "x"), "a")


def test_a_fifo_is_refused_at_once_naming_it(tmp_path):
    # Opening a FIFO for reading would block until a writer came: load() refuses it at once.
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        medfast.io.load(fifo, backend="posix")
    assert time.perf_counter() - t0 < 5


def test_the_gil_is_released_while_waiting_on_io(tmp_path):
    # While one thread loads a large file in native code, another keeps running Python. Had
    # load() held the GIL, the other thread would stall for the whole load: its longest pause
    # would be about the load's time. Released, its pauses are the interpreter's switch
    # interval (5 ms), far below the load's.
    path = str(tmp_path / "big.bin")
    medfast.io.save(torch.ones(256 << 20, dtype=torch.uint8), path)  # 256 MiB
    ratios = []
    for _ in range(3):
        done, loaded = threading.Event(), {}

        def reader():
            t0 = time.perf_counter()
            loaded["n"] = medfast.io.load(path, backend="posix").numel()
            loaded["seconds"] = time.perf_counter() - t0
            done.set()

        t = threading.Thread(target=reader)
        stamps = [time.perf_counter()]
        t.start()
        while not done.is_set():
            stamps.append(time.perf_counter())
        t.join(timeout=60)
        assert loaded["n"] == 256 << 20
        longest = max(b - a for a, b in zip(stamps, stamps[1:]))
        ratios.append(longest / loaded["seconds"])
    assert min(ratios) < 0.5, ratios
