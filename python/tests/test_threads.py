"""Same bits at any thread count (docs/algorithms.md §Same bits at any thread count), through
the Python module on this interpreter's torch — whose GEMM and oneDNN (PyPI's wheels bundle
MKL and a newer oneDNN) the products may run on: a hybrid step of each algorithm pair, with
clipping, on tensors whose reductions ATen would split between threads, and Newton–Schulz in
fp32 and bf16, give on 2 and 4 threads the bits of one thread."""
import pytest
import torch

import muon_cpp


def model():
    torch.manual_seed(31)
    return torch.nn.ModuleDict({
        "wte": torch.nn.Embedding(1024, 512),  # 2^19 elements: the others' algorithm
        "blocks": torch.nn.ModuleList([torch.nn.ModuleDict({
            "q_proj": torch.nn.Linear(512, 512, bias=False),
            "k_proj": torch.nn.Linear(512, 512, bias=False),
            "v_proj": torch.nn.Linear(512, 512, bias=False),
            "down": torch.nn.Linear(256, 1024, bias=False),
            "norm": torch.nn.LayerNorm(512),
        })]),
    })


def on_threads(threads, run):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return run()
    finally:
        torch.set_num_threads(before)


def two_steps(config):
    net = model()
    optimizer = muon_cpp.build_optimizer(net, config)
    generator = torch.Generator().manual_seed(32)
    for _ in range(2):
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor)]
    return [p.detach().clone() for p in net.parameters()] + state


@pytest.mark.parametrize("config", [
    "optimizer: {name: muon, grad_clip: 1.0}",
    "optimizer: {name: muon, others: lamb, grad_clip: 1.0, ns_dtype: bfloat16, normuon: {},"
    " muon_plus: true, row_equilibration: true}",
    "optimizer: {name: dion, others: lion, grad_clip: 1.0}",
])
def test_a_hybrid_step_gives_the_bits_of_one_thread(config):
    one = on_threads(1, lambda: two_steps(config))
    for threads in (2, 4):
        many = on_threads(threads, lambda: two_steps(config))
        assert len(one) == len(many)
        for i, (a, b) in enumerate(zip(one, many)):
            assert torch.equal(a, b), (config, threads, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(512, 512), (3, 128, 640), (1024, 2048), (2048, 1024)])
def test_newton_schulz_gives_the_bits_of_one_thread(dtype, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(33))
    one = on_threads(1, lambda: muon_cpp.orthogonalize(x, dtype=dtype))
    for threads in (2, 4):
        assert torch.equal(one, on_threads(threads, lambda: muon_cpp.orthogonalize(x, dtype=dtype)))
