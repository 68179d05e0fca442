"""The build backend of `pip install .` (PEP 517): CMake builds the extension muon_cpp._core
against the torch of the interpreter that runs pip, and the wheel is assembled here.

It needs nothing from PyPI (pyproject.toml lists no build requirements), so it works offline and
with or without pip's build isolation: when isolation hides the interpreter's own packages, torch
is asked about by a child interpreter that sees them.

Settings, as environment variables:
    MUON_CMAKE_ARGS   extra CMake arguments (shell words), e.g. "-DMUON_USE_BLIS=OFF"
    MUON_BUILD_DIR    the CMake build directory (default: build-pip/<interpreter tag> in the tree)
    MUON_JOBS         parallel compile jobs (default: the CPU count)
"""
import base64
import csv
import hashlib
import io
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAME = "muon_cpp"


def _version():
    for line in (ROOT / "CMakeLists.txt").read_text().splitlines():
        if line.startswith("project(muon VERSION"):
            return line.split("VERSION")[1].split()[0]
    raise RuntimeError("CMakeLists.txt names no project version")


def _torch_facts():
    """torch's version, CMake prefix and C++ ABI, from this interpreter (its site packages
    visible even under build isolation)."""
    probe = ("import json, os, sys, torch, torch.utils\n"
             "inside = os.path.realpath(torch.__file__).startswith("
             "os.path.realpath(sys.prefix) + os.sep)\n"
             "print(json.dumps({'version': torch.__version__, "
             "'cmake': torch.utils.cmake_prefix_path, "
             "'cuda': torch.version.cuda, 'in_environment': inside}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"muon_cpp builds against the torch of {sys.executable}, which cannot "
                           f"import it:\n{done.stderr.strip()}\nInstall PyTorch first "
                           "(Debian: apt install python3-torch).")
    return json.loads(done.stdout)


def _pybind11_dir():
    """pybind11's CMake directory when it is a Python package (pip), else None (Debian's
    pybind11-dev is found by CMake itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    done = subprocess.run([sys.executable, "-m", "pybind11", "--cmakedir"], env=env,
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _tag():
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    implementation = f"cp{version}" if sys.implementation.name == "cpython" else f"py{version}"
    abi = implementation + getattr(sys, "abiflags", "")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return implementation, abi, platform


def _build_extension(torch):
    """Configures and builds the extension against ``torch`` (_torch_facts()); returns the
    directory holding muon_cpp/."""
    implementation, abi, platform = _tag()
    build = pathlib.Path(os.environ.get("MUON_BUILD_DIR") or ROOT / "build-pip" / abi)
    prefixes = [p for p in [torch["cmake"]] if os.path.isdir(p)]
    args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}", "-DMUON_BUILD_TESTS=OFF",
            "-DMUON_BUILD_BENCHMARKS=OFF", "-DMUON_BUILD_CLI=OFF", "-DMUON_BUILD_PYTHON=ON"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if prefixes:
        args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
    pybind11_dir = _pybind11_dir()
    if pybind11_dir:
        args.append(f"-Dpybind11_DIR={pybind11_dir}")
    args += shlex.split(os.environ.get("MUON_CMAKE_ARGS", ""))
    print(f"muon_cpp: building against torch {torch['version']} "
          f"({'CUDA ' + torch['cuda'] if torch['cuda'] else 'CPU'}) in {build}", file=sys.stderr)
    subprocess.run(args, check=True, stdout=sys.stderr)
    jobs = os.environ.get("MUON_JOBS") or str(os.cpu_count() or 1)
    subprocess.run(["cmake", "--build", str(build), "--target", "muon_python", "-j", jobs],
                   check=True, stdout=sys.stderr)
    return build / "python"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def torch_requirement(torch_version):
    """The torch releases the extension built against ``torch_version`` loads in: its major.minor
    (pre-releases and local builds such as Debian's 1.13.0a0 or PyPI's 2.15.0+cu132 included)."""
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0)
                    for part in torch_version.split(".")[:2])
    return f"torch>={major}.{minor}.0a0,<{major}.{minor + 1}"


def _metadata(torch):
    """METADATA for a build against ``torch`` (_torch_facts()). A torch inside the environment
    the wheel goes into (a venv's pip install torch) is required at the release built against; the
    system's, seen from outside it (Debian's python3-torch through --system-site-packages), is
    the distribution's to upgrade, and requiring it would send pip after its dependencies'
    versions, which the distribution chose."""
    requires = (f"Requires-Dist: {torch_requirement(torch['version'])}\n"
                if torch.get("in_environment") else "")
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: Muon and AdamW optimizers for PyTorch, routed automatically, from "
            "muon-cpp's C++ library\nRequires-Python: >=3.8\n" + requires)


# ---- PEP 517 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []  # torch is the interpreter's own; nothing is installed for the build


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = pathlib.Path(metadata_directory) / f"{NAME}-{_version()}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata(_torch_facts()))
    return info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    torch = _torch_facts()
    package = _build_extension(torch) / NAME
    implementation, abi, platform = _tag()
    version = _version()
    info = f"{NAME}-{version}.dist-info"
    files = {}
    for source in sorted(package.iterdir()):
        # The build tree links the pure-Python files; the wheel holds their contents.
        if source.suffix == ".py" or (source.name.startswith("_core") and source.suffix == ".so"):
            files[f"{NAME}/{source.name}"] = source.resolve().read_bytes()
    if not any(name.startswith(f"{NAME}/_core") for name in files):
        raise RuntimeError(f"the build made no {NAME}/_core extension in {package}")
    files[f"{info}/METADATA"] = _metadata(torch).encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: muon-cpp build_backend\n"
                              f"Root-Is-Purelib: false\nTag: {implementation}-{abi}-{platform}\n"
                              ).encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        writer.writerow(_record_line(path, data))
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    wheel = f"{NAME}-{version}-{implementation}-{abi}-{platform}.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel
