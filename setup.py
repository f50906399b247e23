"""pip install --no-build-isolation .   (into the environment whose torch medfast builds against)

Builds medfast with CMake against the libtorch of the torch this Python imports
(torch.utils.cmake_prefix_path: a pip or conda torch; Debian's python3-torch has none, and
its libtorch is the system's) and installs the `medfast` package: the Python module, the two
native programs of the `medfast` command (medfast/bin/medfast, which hands what needs tensors
to medfast/bin/medfast-torch beside it) and a `medfast` console script that runs them, so that
`import medfast` and `medfast train` work from any folder.

The build folder: MEDFAST_BUILD_DIR if set; else build/ where it was configured with this
libtorch (scripts/run.sh and scripts/test.sh build there: what is built is reused, nothing
compiled twice); else build/python-<torch version>-<hash of its path>, one per torch.
MEDFAST_CMAKE_ARGS (space-separated) go to CMake's first configure of the folder.
"""
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)  # setup.cfg puts setuptools' folders there
PROGRAMS = ["medfast", "medfast-torch"]  # the command: the light front and the libtorch binary


def version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(medfast VERSION ([0-9.]+)", text).group(1)


def torch_cmake_dir():
    """(Torch's CMake folder, torch's version) of the torch this Python imports; the folder is
    None where the torch ships none (Debian's: its libtorch is the system's, found by CMake)."""
    try:
        import torch
    except ImportError as e:
        sys.exit(f"medfast: this Python ({sys.executable}) cannot import torch ({e}): install PyTorch into it first "
                 "(pip or conda; Debian: apt-get install python3-torch)")
    folder = os.path.join(torch.utils.cmake_prefix_path, "Torch")
    return (os.path.realpath(folder) if os.path.isfile(os.path.join(folder, "TorchConfig.cmake")) else None,
            torch.__version__)


def cached(build_dir, key):
    """A build folder's CMake cache value of `key`: None where the folder is not configured,
    "" where the cache has no such key."""
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    for line in open(cache, errors="replace"):
        if line.startswith(key + ":"):
            return line.split("=", 1)[1].strip()
    return ""


def same_file(a, b):
    return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)


def build_folder(torch_dir, torch_version):
    """MEDFAST_BUILD_DIR; else build/ where it is unconfigured or configured with this libtorch
    and this interpreter (a venv's python is its base interpreter); else one folder per torch
    and interpreter."""
    if os.environ.get("MEDFAST_BUILD_DIR"):
        return os.path.abspath(os.environ["MEDFAST_BUILD_DIR"])
    shared = os.path.join(ROOT, "build")
    has_torch = cached(shared, "Torch_DIR")
    has_python = cached(shared, "MEDFAST_PYTHON_EXECUTABLE")
    if has_torch is None:
        return shared
    torch_fits = torch_dir is None or same_file(has_torch, torch_dir)
    python_fits = not has_python or same_file(has_python, sys.executable)
    if torch_fits and python_fits:
        return shared
    tag = hashlib.sha1(f"{torch_dir}|{os.path.realpath(sys.executable)}".encode()).hexdigest()[:8]
    return os.path.join(ROOT, "build", f"python-{re.sub(r'[^0-9A-Za-z.]+', '_', torch_version)}-{tag}")


class CMakeBuild(build_ext):
    def run(self):
        torch_dir, torch_version = torch_cmake_dir()
        build_dir = build_folder(torch_dir, torch_version)
        configure = ["cmake", "-S", ROOT, "-B", build_dir]
        # The interpreter the module is for, unless the folder has it already (a venv's python
        # is its base interpreter: the folder keeps its own name for it, its tests use that one).
        if not same_file(cached(build_dir, "MEDFAST_PYTHON_EXECUTABLE"), sys.executable):
            configure.append(f"-DMEDFAST_PYTHON_EXECUTABLE={sys.executable}")
        if torch_dir:
            configure.append(f"-DTorch_DIR={torch_dir}")
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", *shlex.split(os.environ.get("MEDFAST_CMAKE_ARGS", ""))]
        print(f"medfast: building in {build_dir} against torch {torch_version}"
              f" ({torch_dir or 'the system libtorch'})", flush=True)
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "medfast_python", "medfast_front",
                               "medfast_cli", "-j", str(os.cpu_count() or 1)])
        package = os.path.join(build_dir, "python", "medfast")
        built = [f for f in os.listdir(package) if f.startswith("_medfast") and f.endswith(".so")]
        if not built:
            raise RuntimeError(f"CMake did not build the module into {package}: see CMake's message "
                               "'medfast: Python module not built' for why")
        for ext in self.extensions:
            dest = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.join(package, built[0]), dest)
            # The command's programs beside the module (their libraries found by the paths the
            # build recorded in them: this torch's, the system's).
            bin_dir = os.path.join(os.path.dirname(dest), "bin")
            os.makedirs(bin_dir, exist_ok=True)
            for program in PROGRAMS:
                shutil.copy2(os.path.join(build_dir, program), os.path.join(bin_dir, program))


setup(
    name="medfast",
    version=version(),
    description="Fast end-to-end training of 3D medical-image segmentation models (libtorch engine)",
    license="see the repository",
    packages=["medfast"],
    package_dir={"": "python"},
    package_data={"medfast": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("medfast._medfast", sources=[])],
    entry_points={"console_scripts": ["medfast = medfast._command:main"]},
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
