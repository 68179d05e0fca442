"""muon_cpp's optimizers over a torch.distributed process group (docs/distributed.md): at 1, 2
and 4 ranks (Gloo on the CPU, each rank a process of python/tests/distributed_ranks.py) the
parameters after every step, the gathered state dict and a run resumed from a one-process state
dict equal the one-process optimizer's within float32 round-off, and every parameter is updated
by exactly one rank."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import muon_cpp

RANKS_SCRIPT = pathlib.Path(__file__).with_name("distributed_ranks.py")
DDP_EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "ddp_muon.py"
# float32 round-off of a few steps: the owners batch other sets of same-shape matrices together
# than one process does, which may change the order of a product's sums, nothing more.
ROUND_OFF = 1e-5


def python_path():
    """PYTHONPATH for a rank: the muon_cpp this test imported, wherever it came from, first."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(muon_cpp.__file__)))
    return os.pathsep.join([package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])


def run_ranks(tmp_path, world, *args, timeout=240, check=True):
    init_file = tmp_path / "rendezvous"
    processes = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), INIT_FILE=str(init_file),
                   OMP_NUM_THREADS="1", PYTHONPATH=python_path())
        processes.append(subprocess.Popen([sys.executable, str(RANKS_SCRIPT), *map(str, args)],
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


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("algorithm", ["muon", "dion", "adamw", "lamb", "lion", "hybrid"])
def test_ranks_equal_one_process(tmp_path, world, algorithm):
    run_ranks(tmp_path, world, algorithm, 4, tmp_path)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    owners = [sum(r["owned"][i] for r in reports) for i in range(len(reports[0]["owned"]))]
    assert owners == [1] * len(owners)  # each parameter updated by one rank
    if world > 1:  # and the work shared
        assert all(any(r["owned"]) for r in reports)
    for report in reports:
        assert max(report["steps"]) <= ROUND_OFF, report
        assert report["state"] <= ROUND_OFF, report
        assert report["resumed"] <= ROUND_OFF, report


def has_distributed_checkpoint_state_dict():
    try:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not has_distributed_checkpoint_state_dict(),
                    reason="torch.distributed.checkpoint.state_dict (get/set_optimizer_state_dict) "
                           "arrived in torch 2.2; this torch is " + torch.__version__)
@pytest.mark.parametrize("algorithm, saved_at, loaded_at",
                         [("muon", 2, 4), ("muon", 4, 1), ("adamw", 2, 1)])
def test_distributed_checkpoint_resumes_at_another_world_size(tmp_path, algorithm, saved_at,
                                                              loaded_at):
    """Half the steps at one world size, saved with torch.distributed.checkpoint; loaded at
    another and run to the end: the parameters equal a one-process run that never stopped."""
    run_ranks(tmp_path, saved_at, "dcp-save:" + algorithm, 6, tmp_path)
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    run_ranks(tmp_path, loaded_at, "dcp-load:" + algorithm, 6, tmp_path)
    for rank in range(loaded_at):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["resumed"] <= ROUND_OFF, report


def test_the_torchrun_ddp_example_trains_the_same_model_at_1_2_and_4_ranks(tmp_path):
    """examples/python/ddp_muon.py as docs/distributed.md runs it, under torchrun: each rank its
    slice of one global batch, so every world size trains the same model."""
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("torchrun of torch 1.13 fails under Python 3.11 before it starts a rank (its "
                    "Std.from_str returns None); the file:// rendezvous tests above run the same "
                    "ranks")
    finals = {}
    for world in (1, 2, 4):
        out = tmp_path / f"params{world}.pt"
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc_per_node={world}", str(DDP_EXAMPLE), "--steps", "20", "--out", str(out)],
            env=dict(os.environ, PYTHONPATH=python_path(), OMP_NUM_THREADS="1"),
            capture_output=True, text=True, timeout=300, check=False)
        output = result.stdout + result.stderr
        if result.returncode != 0 and "libuv" in output:
            pytest.skip("this torch is built without libuv, which torchrun's TCP store needs "
                        "(Debian's 2.14); the file:// rendezvous tests above run the same ranks")
        assert result.returncode == 0, output
        assert "step 20: loss" in result.stdout, output
        finals[world] = torch.load(out)
    for world in (2, 4):
        for ours, one in zip(finals[world], finals[1]):
            assert ((ours - one).abs().max() / one.abs().max()).item() <= ROUND_OFF


def test_a_rank_that_exits_mid_run_is_an_error_on_the_others_not_a_hang(tmp_path):
    """The last of 3 ranks exits after its first step: the next step of the others raises a
    RuntimeError naming the collective and this rank, within the group's 10 s timeout."""
    run_ranks(tmp_path, 3, "killed", 0, tmp_path, timeout=120, check=False)
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["error"] is not None, report
        assert f"failed on rank {rank} of 3" in report["error"], report
        assert "another rank exited, hung past the process group's timeout" in report["error"]
        assert report["seconds"] < 10 + 20, report


def test_a_process_group_needs_torch_distributed_and_every_group_up_front(tmp_path):
    p = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match="process_group: torch.distributed is not initialized; "
                                         "call torch.distributed.init_process_group first"):
        muon_cpp.Muon([p], process_group=object())
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "rendezvous"),
                            rank=0, world_size=1)
    try:
        optimizer = muon_cpp.AdamW([p], process_group=dist.group.WORLD)
        with pytest.raises(ValueError, match="AdamW: with a process_group, give every parameter "
                                             "group to the constructor"):
            optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        assert len(optimizer.param_groups) == 1
        model = torch.nn.Linear(3, 2)
        with pytest.raises(ValueError, match="timeout must be > 0 seconds, got 0"):
            muon_cpp.build_optimizer(model, None, 10, process_group=dist.group.WORLD, timeout=0)
        with pytest.raises(TypeError, match="timeout must be a datetime.timedelta or a number"):
            muon_cpp.build_optimizer(model, None, 10, process_group=dist.group.WORLD, timeout="1m")
    finally:
        dist.destroy_process_group()
