"""scripts/run.sh's choice of libtorch and its prerequisites (--check: it decides, checks and
says, then stops before installing or building anything), with a stand-in `torch` package (its
version, CUDA and CMake folder) and stand-in tools on PATH: what a GPU user's machine (a pip
torch with CUDA, the bundle .gpu/) and a CPU user's make it do."""
import os
import shutil
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_torch(root, version, cuda, with_cmake=True):
    """A `torch` package that reports `version`, `cuda` (None: a CPU build) and a CMake folder."""
    pkg = root / "site" / "torch"
    pkg.mkdir(parents=True)
    cmake = root / "torch-cmake"
    if with_cmake:
        (cmake / "Torch").mkdir(parents=True)
        (cmake / "Torch" / "TorchConfig.cmake").write_text("# a stand-in\n")
    (pkg / "__init__.py").write_text(f'''
__version__ = {version!r}
class version:
    cuda = {cuda!r}
class utils:
    cmake_prefix_path = {str(cmake)!r}
class cuda:
    @staticmethod
    def get_device_capability(i=0):
        raise RuntimeError("no GPU")
    @staticmethod
    def get_arch_list():
        return ["sm_80", "sm_90"]
''')
    return root / "site"


def tool(bin_dir, name, script):
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def checkout(tmp_path, bundle):
    """run.sh in a folder of its own (it works from its checkout's root), with a bundle or not."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "scripts", "run.sh"), repo / "scripts" / "run.sh")
    if bundle:
        (repo / ".gpu" / "usr" / "include").mkdir(parents=True)
    return repo


def run_sh(repo, site, bin_dir, *args):
    """`bash scripts/run.sh --check ARGS` with python3 importing the stand-in torch, and PATH: the
    stand-in tools, then only what run.sh needs from the system (no apt-get, nvcc or nvidia-smi
    unless a stand-in is there)."""
    system = bin_dir.parent / "system"
    system.mkdir(exist_ok=True)
    for name in ("bash", "cut", "head", "tr", "nproc", "cmake", "ninja", "g++", "sed", "cat", "dirname", "id"):
        found = shutil.which(name)
        if found and not (system / name).exists():
            (system / name).symlink_to(found)
    if not (bin_dir / "python3").exists():
        tool(bin_dir, "python3", f'exec {sys.executable} "$@"')
    env = {"PATH": f"{bin_dir}:{system}", "PYTHONPATH": str(site), "HOME": str(bin_dir.parent),
           "CUDA_HOME": str(bin_dir.parent / "no-cuda-here")}  # this machine's /usr/local/cuda hidden
    return subprocess.run(["bash", str(repo / "scripts" / "run.sh"), "--check", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def bin_dir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    return d


def test_a_cuda_torch_with_the_bundle_and_a_gpu_builds_against_it(tmp_path, bin_dir):
    site = fake_torch(tmp_path, "2.11.0+cu130", "13.0")
    tool(bin_dir, "nvcc", "echo nvcc")
    tool(bin_dir, "nvidia-smi", "echo 9.0")
    r = run_sh(checkout(tmp_path, bundle=True), site, bin_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "building against the PyTorch of" in r.stdout and "(2.11.0+cu130, CUDA 13.0)" in r.stdout, r.stdout
    assert "come from the bundle .gpu/" in r.stdout
    assert "CUDA architecture: compute capability 9.0" in r.stdout
    assert "decided: torch python (2.11.0+cu130, CUDA 13.0" in r.stdout and "libraries from bundle" in r.stdout
    assert "build in build-python" in r.stdout


def test_without_a_visible_gpu_the_architecture_is_the_newest_torch_knows(tmp_path, bin_dir):
    site = fake_torch(tmp_path, "2.11.0+cu130", "13.0")
    tool(bin_dir, "nvcc", "echo nvcc")
    r = run_sh(checkout(tmp_path, bundle=True), site, bin_dir, "--torch", "python")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no GPU visible: building for compute capability 9.0" in r.stdout, r.stdout


def test_each_missing_prerequisite_is_named_with_its_remedy(tmp_path, bin_dir):
    # A CUDA torch without the toolkit, no bundle and no package registry.
    site = fake_torch(tmp_path, "2.11.0+cu130", "13.0")
    r = run_sh(checkout(tmp_path, bundle=False), site, bin_dir)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "install the CUDA toolkit 13.0" in r.stderr, r.stderr
    assert "bash scripts/gpu_bundle.sh" in r.stderr and "carry .gpu/" in r.stderr, r.stderr
    # A torch too old, and one without CMake files.
    old = fake_torch(tmp_path / "old", "1.12.1", None)
    r = run_sh(checkout(tmp_path / "old", bundle=True), old, bin_dir, "--torch", "python")
    assert r.returncode == 2 and "older than medfast supports (1.13 and later)" in r.stderr, r.stderr
    bare = fake_torch(tmp_path / "bare", "2.6.0", None, with_cmake=False)
    r = run_sh(checkout(tmp_path / "bare", bundle=True), bare, bin_dir, "--torch", "python")
    assert r.returncode == 2 and "ships no CMake files" in r.stderr, r.stderr


def test_a_torch_without_cuda_or_none_at_all_means_debians_libtorch(tmp_path, bin_dir):
    site = fake_torch(tmp_path, "2.6.0+cpu", None)
    r = run_sh(checkout(tmp_path, bundle=False), site, bin_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "building against Debian's libtorch: the PyTorch of" in r.stdout and "has no CUDA" in r.stdout, r.stdout
    assert "decided: torch debian, build in build" in r.stdout
    absent = tmp_path / "absent" / "torch"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text('raise ImportError("No module named torch")\n')  # hides any torch
    r = run_sh(checkout(tmp_path / "none", bundle=False), absent.parent, bin_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no python3 here imports torch" in r.stdout, r.stdout
    r = run_sh(checkout(tmp_path / "bad", bundle=False), site, bin_dir, "--torch", "cuda")
    assert r.returncode == 2 and "expected auto, python or debian" in r.stderr


def test_a_torch_without_cmake_files_means_debians_libtorch_and_says_why(tmp_path, bin_dir):
    # Debian's python3-torch (1.13.0a0: no CUDA, no CMake files), and a CUDA torch without them.
    debian = fake_torch(tmp_path / "debian", "1.13.0a0", None, with_cmake=False)
    r = run_sh(checkout(tmp_path / "debian", bundle=False), debian, bin_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(1.13.0a0) has no CUDA and ships no CMake files to build against" in r.stdout, r.stdout
    assert "--torch python builds against it anyway" not in r.stdout
    assert "decided: torch debian, build in build" in r.stdout
    cuda = fake_torch(tmp_path / "cuda", "2.6.0+cu124", "12.4", with_cmake=False)
    r = run_sh(checkout(tmp_path / "cuda", bundle=False), cuda, bin_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(2.6.0+cu124, CUDA 12.4) ships no CMake files to build against" in r.stdout, r.stdout
    assert "decided: torch debian" in r.stdout
