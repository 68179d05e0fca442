"""The paths a GPU runs, on the device MUON_TEST_DEVICE names (default cpu; scripts/gpu_check.sh
sets cuda): the fp32 and bf16 Newton–Schulz chains against float64, the bf16 state's stochastic
rounding against the CPU's bits and an independent transcription of its hash, and — on a CUDA GPU —
an NCCL process group of one: the C++ Communicator (over torch's group, and the group it makes
from torchrun's variables), the Python optimizers' process groups, DDP and FSDP2.

On the CPU the same tests run the CPU's paths (bf16 products where the CPU has them) and the ATen
form the GPUs run (generic=True); the NCCL test skips there, saying it needs a CUDA GPU.
"""
import os
import socket

import pytest
import torch

import muon_cpp
import needs
from helpers import max_rel_diff, reference_newton_schulz

DEVICE = torch.device(os.environ.get("MUON_TEST_DEVICE", "cpu"))
ON_CPU = DEVICE.type == "cpu"
SHAPES = [(192, 192), (96, 288), (288, 96), (136, 200)]


def test_float32_newton_schulz_on_the_device_is_the_float64_chain():
    """fp32 products: within float32 round-off of the float64 iteration (1e-6 measured on CPU)."""
    torch.manual_seed(3)
    for shape in SHAPES:
        x = torch.randn(shape)
        ours = muon_cpp.orthogonalize(x.to(DEVICE), dtype=torch.float32, method="plain")
        assert ours.device.type == DEVICE.type and ours.dtype == torch.float32
        reference = reference_newton_schulz(x.double())
        assert max_rel_diff(ours.cpu(), reference) < 1e-4, shape


def test_bf16_newton_schulz_on_the_device_is_the_float64_chain_to_bf16_precision():
    """bf16 operands: 1.6e-2 to 3.0e-2 from the float64 iteration on CPU; the lower bound shows
    the products did run in bf16."""
    if ON_CPU:
        needs.bf16_products()
    torch.manual_seed(4)
    for shape in SHAPES:
        x = torch.randn(shape)
        ours = muon_cpp.orthogonalize(x.to(DEVICE), dtype=torch.bfloat16, method="plain")
        reference = reference_newton_schulz(x.double())
        distance = ((ours.cpu().double() - reference).norm() / reference.norm()).item()
        assert 1e-3 < distance < 4e-2, (shape, distance)


def fmix32(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def round_bits(x, seed, index):
    """The hash of docs/design.md §Stochastic rounding, transcribed in Python integers."""
    bits = int(torch.tensor([x], dtype=torch.float32).view(torch.int32).item()) & 0xFFFFFFFF
    noise = fmix32((index * 0x9E3779B1 + seed) & 0xFFFFFFFF) & 0xFFFF
    if bits & 0x7FFFFFFF > 0x7F800000:  # NaN stays a quiet NaN
        return (bits >> 16) | 0x0040
    return ((bits + noise) & 0xFFFFFFFF) >> 16


def test_stochastic_rounding_on_the_device_gives_the_cpus_bits():
    """The same bf16 bits for every element on the device as the CPU's vectorized loop — also for
    ±0, subnormals, the largest finite values, ±Inf and NaN — and, on a sample, as the hash
    transcribed here."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(300_001, generator=generator) * torch.logspace(-44, 37, 300_001)
    x[:8] = torch.tensor([0.0, -0.0, 1e-45, -1e-40, 3.4028235e38, float("inf"), -float("inf"),
                          float("nan")])
    for seed in (0, 0x9E3779B9, 123456789):
        cpu = muon_cpp._core.stochastic_round_bf16(x, seed)
        device = muon_cpp._core.stochastic_round_bf16(x.to(DEVICE), seed, generic=True)
        assert device.device.type == DEVICE.type and device.dtype == torch.bfloat16
        assert torch.equal(device.cpu().view(torch.int16), cpu.view(torch.int16)), seed
        bits = cpu.view(torch.int16).to(torch.int32) & 0xFFFF
        for i in list(range(8)) + list(range(1000, 300_001, 9973)):
            assert bits[i].item() == round_bits(x[i].item(), seed, i), (seed, i)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nccl_group_of_one(tmp_path):
    import torch.distributed as dist
    if ON_CPU or not torch.cuda.is_available():
        needs.hardware("a CUDA GPU, for an NCCL process group (MUON_TEST_DEVICE=cuda)")
    if not dist.is_available() or not dist.is_nccl_available():
        needs.software("a torch with NCCL (torch.distributed.is_nccl_available())")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="file://" + str(tmp_path / "rendezvous"),
                            rank=0, world_size=1)
    return dist


def test_an_nccl_group_of_one_runs_the_collectives_and_the_data_parallel_optimizers(
        tmp_path, monkeypatch):
    """One GPU, one rank: the C++ Communicator over torch's NCCL group and over the group it makes
    from torchrun's variables runs every collective on the GPU; Muon with that process group, Muon
    beside DDP and Muon on FSDP2's sharded parameters each step as one process does."""
    dist = nccl_group_of_one(tmp_path)
    try:
        collectives = muon_cpp._core.Collectives(dist.group.WORLD)
        assert collectives.device.type == "cuda"
        x = torch.arange(12.0, device="cuda")
        flat = torch.zeros(12, device="cuda")
        collectives.all_gather(x, flat)
        collectives.broadcast(x, 0)
        parts = [torch.zeros(12, device="cuda")]
        collectives.gather(x, parts, 0)
        received = torch.zeros(12, device="cuda")
        collectives.scatter(received, [x.clone()], 0)
        assert torch.equal(flat, x) and torch.equal(parts[0], x) and torch.equal(received, x)

        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        own = muon_cpp._core.Collectives.from_environment()
        assert own.device.type == "cuda"
        total = torch.full((5,), 2.0, device="cuda")
        own.all_reduce_sum(total)
        assert torch.equal(total, torch.full((5,), 2.0, device="cuda"))

        steps_like_one_process(lambda model: muon_cpp.Muon(
            model.parameters(), lr=0.02, process_group=dist.group.WORLD))
        steps_like_one_process(lambda model: muon_cpp.Muon(model.parameters(), lr=0.02),
                               wrap=lambda model: torch.nn.parallel.DistributedDataParallel(
                                   model, device_ids=[0]))
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cuda", (1,))
        steps_like_one_process(lambda model: muon_cpp.Muon(model.parameters(), lr=0.02),
                               wrap=lambda model: fully_shard(model, mesh=mesh), sharded=True)
    finally:
        dist.destroy_process_group()


def steps_like_one_process(make, wrap=lambda model: model, sharded=False):
    """Three Muon steps on a model of 2-D layers on the GPU, wrapped, against the same on a bare
    model."""
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 16, bias=False)).cuda()

    plain, wrapped = model(), wrap(model())
    plain_optimizer, wrapped_optimizer = muon_cpp.Muon(plain.parameters(), lr=0.02), make(wrapped)
    data = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(8, 32, generator=data).cuda()
        for net, optimizer in ((plain, plain_optimizer), (wrapped, wrapped_optimizer)):
            optimizer.zero_grad()
            net(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(plain.parameters(), wrapped.parameters()):
        b = b.full_tensor() if sharded else b
        assert max_rel_diff(b.detach().cpu(), a.detach().cpu()) < 1e-5
