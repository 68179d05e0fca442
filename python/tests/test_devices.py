"""Tensors on any device: the device-generic form of every update (fused=False on CPU, and what
every other device runs) against the fused CPU kernels and torch.optim.

On CPU the generic form gives the fused kernels' bits wherever LibTorch rounds float32 square
roots correctly, as the fused kernels do (Debian's builds). PyPI's torch computes them with MKL's
vector math, one ulp off for about 16% of inputs (PyTorch 2.15; division, products and sums
are exact there too), so there, as on a GPU, the two agree to the tolerance of different arithmetic.
MUON_TEST_DEVICE=cuda (scripts/gpu_check.sh sets it) runs the same checks with the model on a GPU,
against the CPU results to that tolerance.
"""
import os

import pytest
import torch

import muon_cpp
from helpers import TinyGpt, batches, max_rel_diff, train, weights

DEVICE = torch.device(os.environ.get("MUON_TEST_DEVICE", "cpu"))
ON_CPU = DEVICE.type == "cpu"


def sqrt_rounds_correctly():
    """Whether this LibTorch's float32 sqrt on CPU is the correctly rounded one (that of float64,
    rounded: exact for float32 inputs)."""
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 10
    return torch.equal(x.sqrt(), x.double().sqrt().float())


BITWISE = ON_CPU and sqrt_rounds_correctly()


def model_on(device, seed=0):
    torch.manual_seed(seed)
    return TinyGpt().to(device)


def data_on(device, count, seed=0):
    return [tokens.to(device) for tokens in batches(count, seed=seed)]


def matrices(model):
    return [p for p in model.parameters() if p.dim() == 2 and p.requires_grad]


def assert_match(device_weights, cpu_weights, gpu_tolerance):
    for a, b in zip(device_weights, cpu_weights):
        assert a.device.type == DEVICE.type
        if BITWISE:
            assert torch.equal(a, b)
        else:
            assert max_rel_diff(a.cpu(), b) < gpu_tolerance


@pytest.mark.parametrize("cautious", [False, True])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ["AdamW", "Adam", "NAdam"])
def test_adam_family_on_the_device_equals_the_fused_cpu_kernels(algorithm, state_dtype, cautious):
    make = getattr(muon_cpp, "Adam" if algorithm == "Adam" else "AdamW")
    settings = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, state_dtype=state_dtype,
                    nesterov=algorithm == "NAdam", cautious=cautious)
    cpu, device = model_on("cpu"), model_on(DEVICE)
    cpu_opt = make(cpu.parameters(), **settings)
    device_opt = make(device.parameters(), fused=False, **settings)
    train(cpu, cpu_opt, data_on("cpu", 30))
    train(device, device_opt, data_on(DEVICE, 30))
    # Where the arithmetic differs, a last-bit difference can flip a stochastic rounding of the
    # bfloat16 moments, a change of one bf16 step (2^-8 relative): 4.6e-4 measured after 30 steps
    # on PyPI's torch 2.15, against < 1e-4 with float32 moments. Half a bf16 step bounds it.
    assert_match(weights(device), weights(cpu), 1e-4 if state_dtype == torch.float32 else 2e-3)
    for p in device.parameters():
        if p.requires_grad:
            state = device_opt.state[p]
            assert state["exp_avg"].device.type == DEVICE.type
            assert state["exp_avg"].dtype == state_dtype


def test_adamw_on_the_device_equals_torch_adamw():
    ours, theirs = model_on(DEVICE), model_on(DEVICE)
    settings = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    data = data_on(DEVICE, 60, seed=1)
    train(ours, muon_cpp.AdamW(ours.parameters(), fused=False, **settings), data)
    train(theirs, torch.optim.AdamW(theirs.parameters(), **settings), data)
    for a, b in zip(weights(ours), weights(theirs)):
        assert max_rel_diff(a, b) < 2e-5


def test_lamb_on_the_device_agrees_with_the_fused_cpu_kernel():
    cpu, device = model_on("cpu"), model_on(DEVICE)
    train(cpu, muon_cpp.Lamb(cpu.parameters(), lr=1e-2, weight_decay=0.01), data_on("cpu", 20))
    train(device, muon_cpp.Lamb(device.parameters(), lr=1e-2, weight_decay=0.01, fused=False),
          data_on(DEVICE, 20))
    for a, b in zip(weights(device), weights(cpu)):  # norms summed in another order
        assert max_rel_diff(a.cpu(), b) < 1e-5


@pytest.mark.parametrize("settings", [
    dict(),
    dict(momentum_form="sum", nesterov=False, weight_decay=0.1),
    dict(coefficients="polar_express", normuon=dict(beta2=0.9), cautious_weight_decay=True,
         weight_decay=0.2),
    dict(post_norm="row_col", adjust_lr="match_rms_adamw", cautious=True),
    dict(state_dtype=torch.bfloat16),
])
def test_muon_on_the_device_follows_the_plain_chain_on_cpu(settings):
    cpu, device = model_on("cpu"), model_on(DEVICE)
    # On CPU the same Newton–Schulz (the plain chain) gives the same bits; on a GPU it runs in
    # bfloat16 (the default there), close to the fp32 CPU result.
    cpu_opt = muon_cpp.Muon(matrices(cpu), lr=0.02, ns_method="plain", **settings)
    device_opt = muon_cpp.Muon(matrices(device), lr=0.02, fused=False, **settings)
    train(cpu, cpu_opt, data_on("cpu", 10))
    train(device, device_opt, data_on(DEVICE, 10))
    assert_match([p.detach() for p in matrices(device)], [p.detach() for p in matrices(cpu)],
                 5e-2)
    for p in matrices(device):
        assert device_opt.state[p]["momentum_buffer"].device.type == DEVICE.type


@pytest.mark.parametrize("rank_fraction", [1.0, 0.5])
def test_dion_on_the_device_follows_the_cpu(rank_fraction):
    cpu, device = model_on("cpu"), model_on(DEVICE)
    # The same first Q on every device (drawn on the CPU); on CPU the generic update gives the
    # fused kernel's bits; a GPU's fp32 QR and products differ by rounding.
    cpu_opt = muon_cpp.Dion(matrices(cpu), lr=0.02, rank_fraction=rank_fraction)
    device_opt = muon_cpp.Dion(matrices(device), lr=0.02, rank_fraction=rank_fraction,
                               fused=False)
    train(cpu, cpu_opt, data_on("cpu", 10))
    train(device, device_opt, data_on(DEVICE, 10))
    assert_match([p.detach() for p in matrices(device)], [p.detach() for p in matrices(cpu)],
                 1e-3)
    for p in matrices(device):
        assert device_opt.state[p]["dion_q"].device.type == DEVICE.type


def test_hybrid_with_fused_false_equals_the_fused_path_and_state_moves_between_them():
    config = {"optimizer": {"name": "muon", "adamw_lr": 0.01, "ns_method": "plain",
                            "grad_clip": 1.0, "state_dtype": "bfloat16",
                            "schedule": {"name": "cosine", "warmup_steps": 3}}}
    generic_config = {"optimizer": dict(config["optimizer"], fused=False)}
    cpu, device = model_on("cpu"), model_on(DEVICE)
    cpu_opt = muon_cpp.build_optimizer(cpu, config, total_steps=20)
    device_opt = muon_cpp.build_optimizer(device, generic_config, total_steps=20)
    assert all(group["fused"] is False for group in device_opt.param_groups)
    assert all(group["fused"] is None for group in cpu_opt.param_groups)
    train(cpu, cpu_opt, data_on("cpu", 8))
    train(device, device_opt, data_on(DEVICE, 8))
    assert_match(weights(device), weights(cpu), 5e-2)
    # The fused optimizer's state_dict resumes the generic one (and the schedules' position).
    resumed = model_on(DEVICE, seed=1)
    resumed.load_state_dict(cpu.state_dict())
    resumed_opt = muon_cpp.build_optimizer(resumed, generic_config, total_steps=20)
    saved = cpu_opt.state_dict()
    for group in saved["param_groups"]:
        group["fused"] = False
    resumed_opt.load_state_dict(saved)
    assert resumed_opt.step_count == 8
    train(cpu, cpu_opt, data_on("cpu", 4, seed=5))
    train(resumed, resumed_opt, data_on(DEVICE, 4, seed=5))
    assert_match(weights(resumed), weights(cpu), 5e-2)


def test_qk_clip_scales_the_offending_head_on_the_device():
    model = model_on(DEVICE)
    block = model.blocks[0]
    optimizer = muon_cpp.build_optimizer(
        model, {"optimizer": {"name": "muonclip", "qk_clip": {"tau": 10.0}}}, 10)

    class Source:  # statistics on the model's device, head 0 over tau
        def qk_clip_targets(self):
            return [dict(layer="blocks.0", q_weight=block.q_proj.weight,
                         k_weight=block.k_proj.weight, n_heads=2, n_kv_heads=2, head_dim=6)]

        def qk_max_logits(self):
            return {"blocks.0": torch.tensor([40.0, 5.0], device=DEVICE)}

    optimizer.set_qk_clip_source(Source())
    train(model, optimizer, data_on(DEVICE, 1))
    gamma = 10.0 / (40.0 + 1e-6)
    assert optimizer.last_step["qk_clip"] == [
        {"layer": "blocks.0", "head": 0, "factor": pytest.approx(gamma ** 0.5)}]
    assert block.q_proj.weight.device.type == DEVICE.type


def test_fused_true_refuses_tensors_off_the_cpu_and_fused_must_be_a_bool():
    meta = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    with pytest.raises(ValueError, match="is on meta; fused: true runs the fused CPU kernels"):
        muon_cpp.AdamW([meta], fused=True)
    with pytest.raises(TypeError, match="fused must be None, True or False, got str 'yes'"):
        muon_cpp.AdamW([torch.nn.Parameter(torch.ones(2))], fused="yes")
    muon_cpp.AdamW([meta])  # unset: the device-generic form takes it
