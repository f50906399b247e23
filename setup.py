"""pip install --no-build-isolation .  (Debian's python3-pip, setuptools, no package index)

Builds the extension module with CMake into build/ (the folder scripts/run.sh and
scripts/test.sh use, so nothing is compiled twice), against the libtorch of the
torch this Python imports, and installs the `medfast` package with it.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)  # setup.cfg puts setuptools' folders there


def version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(medfast VERSION ([0-9.]+)", text).group(1)


class CMakeBuild(build_ext):
    def run(self):
        build_dir = os.environ.get("MEDFAST_BUILD_DIR", os.path.join(ROOT, "build"))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, f"-DMEDFAST_PYTHON_EXECUTABLE={sys.executable}"]
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"]
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "medfast_python", "-j",
                               str(os.cpu_count() or 1)])
        package = os.path.join(build_dir, "python", "medfast")
        built = [f for f in os.listdir(package) if f.startswith("_medfast") and f.endswith(".so")]
        if not built:
            raise RuntimeError(f"CMake did not build the module into {package}: see CMake's message "
                               "'medfast: Python module not built' for why")
        for ext in self.extensions:
            dest = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.join(package, built[0]), dest)


setup(
    name="medfast",
    version=version(),
    description="Fast end-to-end training of 3D medical-image segmentation models (libtorch engine)",
    license="see the repository",
    packages=["medfast"],
    package_dir={"": "python"},
    package_data={"medfast": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("medfast._medfast", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
