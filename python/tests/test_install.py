"""The install seams: muon_cpp.__version__ is the project's (muon --version's), the package
refuses to load under a torch of another release than the one it was built against, naming both
and the rebuild command, says so when its extension is not built, and a wheel requires that torch
release."""
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys

import torch

import muon_cpp
from muon_cpp import _build_info, _install

SOURCE = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SOURCE / "python"))
import build_backend  # noqa: E402


def project_version():
    text = (SOURCE / "CMakeLists.txt").read_text()
    return re.search(r"project\(muon VERSION (\S+)", text).group(1)


def test_version_is_the_projects():
    assert muon_cpp.__version__ == project_version()
    cli = pathlib.Path(_build_info.BUILD_DIR) / "muon"
    if cli.exists():  # a build tree with the CLI: the same version as muon --version
        done = subprocess.run([str(cli), "--version"], capture_output=True, text=True, check=True)
        assert done.stdout.strip() == f"muon {muon_cpp.__version__}"


def import_copy(tmp_path, change):
    """Imports a copy of the package, changed by ``change(package_dir)``, in a child."""
    package = tmp_path / "muon_cpp"
    shutil.copytree(os.path.dirname(muon_cpp.__file__), package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    change(package)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", "import muon_cpp"], env=env,
                          capture_output=True, text=True, cwd=tmp_path)


def test_another_torch_release_is_an_import_error_naming_both_and_the_rebuild(tmp_path):
    def record_another_torch(package):
        info = package / "_build_info.py"
        info.write_text(re.sub(r'TORCH_VERSION = "[^"]*"', 'TORCH_VERSION = "0.9.1"',
                               info.read_text()))

    done = import_copy(tmp_path, record_another_torch)
    assert done.returncode != 0
    assert (f"ImportError: muon_cpp {project_version()} was built against torch 0.9.1, but this "
            f"interpreter imports torch {torch.__version__}; rebuild it against this torch: "
            f"{sys.executable} -m pip install --force-reinstall {_build_info.SOURCE_DIR}"
            ) in done.stderr


def test_an_unbuilt_extension_is_an_import_error_saying_how_to_build_it(tmp_path):
    def remove_core(package):
        for core in package.glob("_core.*"):
            core.unlink()

    done = import_copy(tmp_path, remove_core)
    assert done.returncode != 0
    assert ("ImportError: muon_cpp's C++ extension (_core) is not built in "
            f"{tmp_path / 'muon_cpp'}: build it with cmake --build {_build_info.BUILD_DIR} "
            "--target muon_python") in done.stderr
    assert "circular import" not in done.stderr


def test_releases_compare_by_major_and_minor():
    assert _install.release("2.15.0+cu132") == (2, 15)
    assert _install.release("1.13.0a0") == (1, 13)
    assert _install.release("2.16.0.dev20261201") == (2, 16)
    assert _install.release(_build_info.TORCH_VERSION) == _install.release(torch.__version__)


def test_a_wheel_requires_the_torch_release_it_was_built_against():
    assert build_backend.torch_requirement("2.15.0+cu132") == "torch>=2.15.0a0,<2.16"
    assert build_backend.torch_requirement("1.13.0a0") == "torch>=1.13.0a0,<1.14"
    pip_torch = {"version": "2.15.0+cu132", "in_environment": True}
    assert "Requires-Dist: torch>=2.15.0a0,<2.16\n" in build_backend._metadata(pip_torch)
    # The system's torch, seen from a venv with --system-site-packages, is not required: pip
    # would chase its dependencies' versions, which the distribution chose.
    assert "Requires-Dist" not in build_backend._metadata({"version": "1.13.0a0",
                                                           "in_environment": False})
    try:  # the installed wheel imported here (scripts/pypi_test.sh) carries it
        dist = importlib.metadata.distribution("muon_cpp")
    except importlib.metadata.PackageNotFoundError:
        return  # a build tree: no distribution metadata
    installed = pathlib.Path(dist.locate_file("muon_cpp/__init__.py")).resolve()
    if installed != pathlib.Path(muon_cpp.__file__).resolve():
        return  # a build tree imported ahead of an installed copy
    facts = build_backend._torch_facts()
    assert (dist.requires or []) == ([build_backend.torch_requirement(torch.__version__)]
                                     if facts["in_environment"] else [])


def test_the_public_names_are_all_and_only_all():
    """`from muon_cpp import *` and dir(muon_cpp) show the same public names: __all__ (and the
    submodules, such as muon_cpp.optim once imported) — no module or helper the package uses
    inside."""
    import types
    import muon_cpp.optim  # noqa: F401 (a public submodule)
    public = {name for name in dir(muon_cpp) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(muon_cpp, name), types.ModuleType)}
    assert modules == {"optim"}, modules
    assert public - modules == set(muon_cpp.__all__)
    assert len(muon_cpp.__all__) == len(set(muon_cpp.__all__))
