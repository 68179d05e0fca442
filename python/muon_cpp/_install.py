"""The checks `import muon_cpp` makes before loading its C++ extension, which would otherwise fail
with an undefined symbol (another torch) or a confusing circular-import error (not built)."""

import os
import sys

from . import _build_info


def release(version):
    """(major, minor) of a torch version such as '2.15.0+cu132' or '1.13.0a0'."""
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def rebuild_hint():
    """How to build muon_cpp again against the torch this interpreter imports."""
    return (f"rebuild it against this torch: {sys.executable} -m pip install --force-reinstall "
            f"{_build_info.SOURCE_DIR} (an installed package), or cmake --build "
            f"{_build_info.BUILD_DIR} --target muon_python (a build tree; scripts/setup.sh "
            "muon_python)")


def check_build(torch_version, package_dir=os.path.dirname(__file__)):
    """ImportError unless the extension is built here, against this torch's major.minor (the C++
    ABI a PyTorch extension is built for holds within one release)."""
    built = _build_info.TORCH_VERSION
    if release(torch_version) != release(built):
        raise ImportError(f"muon_cpp {_build_info.VERSION} was built against torch {built}, but "
                          f"this interpreter imports torch {torch_version}; {rebuild_hint()}")
    if not any(name.startswith("_core.") for name in os.listdir(package_dir)):
        raise ImportError(f"muon_cpp's C++ extension (_core) is not built in {package_dir}: "
                          f"build it with cmake --build {_build_info.BUILD_DIR} --target "
                          "muon_python (or scripts/setup.sh muon_python; scripts/test.sh builds "
                          f"it too), or pip install {_build_info.SOURCE_DIR}")
