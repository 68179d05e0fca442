"""Ranks as processes for the distributed tests: each runs python/tests/distributed_ranks.py (or
another ranks script) with RANK, WORLD_SIZE and a file:// rendezvous, importing the muon_cpp the test imported."""
import os
import pathlib
import subprocess
import sys

import muon_cpp

RANKS_SCRIPT = pathlib.Path(__file__).with_name("distributed_ranks.py")
# float32 round-off of a few steps: the owners batch other sets of same-shape matrices together
# than one process does, which may change the order of a product's sums, nothing more.
ROUND_OFF = 1e-5


def python_path():
    """PYTHONPATH for a rank: the muon_cpp this test imported, wherever it came from, first."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(muon_cpp.__file__)))
    return os.pathsep.join([package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])


def run_ranks(tmp_path, world, *args, timeout=240, check=True, script=RANKS_SCRIPT):
    init_file = tmp_path / "rendezvous"
    processes = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), INIT_FILE=str(init_file),
                   OMP_NUM_THREADS="1", PYTHONPATH=python_path())
        processes.append(subprocess.Popen([sys.executable, str(script), *map(str, args)],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    except subprocess.TimeoutExpired:
        for p in processes:
            p.kill()
        outputs = [p.communicate()[0] for p in processes]
        raise AssertionError(f"ranks still running after {timeout} s:\n" + "\n".join(outputs))
    for rank, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0 or not check, f"rank {rank} failed:\n{output}"
    return outputs
