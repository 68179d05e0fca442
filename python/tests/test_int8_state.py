"""8-bit block-quantized state (docs/algorithms.md §8-bit state) against a reference written here
from the definitions: the maps, codes as the nearest map entry, AdamW's step on the dequantized
moments; and the state through state_dict(), torch.optim and the nonfinite policy."""
import logging

import pytest
import torch

import muon_cpp

BLOCK = 256
TOP = 1.875


def format_value(signed, code):
    """The value of `code` in the signed E4M3 or the unsigned E5M3 format (before scaling)."""
    bias = 15 if signed else 31
    magnitude = code % 128 if signed else code
    exponent, mantissa = magnitude // 8, magnitude % 8
    if exponent == 0:
        value = mantissa / 8 * 2.0 ** (1 - bias)
    else:
        value = (1 + mantissa / 8) * 2.0 ** (exponent - bias)
    return -value if signed and code >= 128 else value


def formats(signed):
    values = torch.tensor([format_value(signed, c) for c in range(256)], dtype=torch.float64)
    if signed:
        values[128] = -0.0
    return values


def divided(a, b):
    """a / b correctly rounded to fp32 (through fp64, exact enough for that): some torch builds'
    vectorized fp32 division is off by an ulp (PyPI's 2.15 on AVX-512)."""
    return (torch.as_tensor(a).double() / torch.as_tensor(b).double()).float()




def blocks_of(x):
    """x (rank ≥ 2) as rows cut into blocks of BLOCK, the last of a row shorter: a list of
    (row, start, stop)."""
    rows = x.reshape(x.shape[0], -1)
    length = rows.shape[1]
    return rows, [(r, s, min(length, s + BLOCK)) for r in range(rows.shape[0])
                  for s in range(0, max(length, 1), BLOCK)]


def quantize_reference(x, signed):
    """(codes, absmax) of fp32 x: per block absmax (0 under the smallest normal float), then for
    y = fp32(x · fp32(1.875/absmax)) the nearest format value, ties to the even code."""
    rows, blocks = blocks_of(x.float())
    codes = torch.zeros(rows.shape, dtype=torch.uint8)
    absmax = torch.zeros(rows.shape[0], len(blocks) // rows.shape[0])
    values = formats(signed)
    sign = torch.signbit(values)
    for i, (r, s, e) in enumerate(blocks):
        block = rows[r, s:e]
        top = block.abs().max()
        top = torch.zeros(()) if top < torch.finfo(torch.float32).tiny else top
        absmax[r, i % absmax.shape[1]] = top
        factor = torch.zeros(()) if top == 0 else divided(TOP, top)
        y = block * factor
        if not signed:
            y = y.abs()
        distance = (y.double()[:, None] - values[None, :]).abs()
        if signed:  # only entries of y's own sign (−0 for negatives)
            distance[torch.signbit(y)[:, None] != sign[None, :]] = float("inf")
        nearest = distance == distance.min(1, keepdim=True).values
        even = nearest & (torch.arange(256) % 2 == 0)
        pick = torch.where(even.any(1), even.int().argmax(1), nearest.int().argmax(1))
        codes[r, s:e] = pick.to(torch.uint8)
    return codes.reshape(x.shape), absmax


def dequantize_reference(codes, absmax, signed):
    """x = fp32(absmax / 1.875) · v(code)."""
    rows, blocks = blocks_of(codes)
    out = torch.empty(rows.shape)
    table = formats(signed).float()  # exact in fp32
    for i, (r, s, e) in enumerate(blocks):
        step = divided(absmax[r, i % absmax.shape[1]], TOP)
        out[r, s:e] = step * table[rows[r, s:e].long()]
    return out.reshape(codes.shape)


def loaded_state(exp_avg, exp_avg_sq, shape=None):
    """An int8 AdamW over one parameter whose fp32 state is loaded (and so quantized by muon_cpp)."""
    p = torch.nn.Parameter(torch.zeros(shape or exp_avg.shape))
    optimizer = muon_cpp.AdamW([p], lr=1e-3, state_dtype="int8")
    saved = optimizer.state_dict()
    saved["state"] = {0: {"step": torch.tensor(1.0), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}}
    optimizer.load_state_dict(saved)
    return optimizer.state_dict()["state"][0]


def test_every_code_midpoints_zeros_and_subnormals_quantize_to_the_nearest_entry():
    for signed in (True, False):
        values = formats(signed).float() * 2  # absmax 3.75 per row: y is the value itself
        mids = ((formats(signed)[1:] + formats(signed)[:-1]) / 2 * 2).float()
        beside = torch.cat([mids.nextafter(torch.tensor(float("inf"))),
                            mids.nextafter(torch.tensor(-float("inf")))])
        specials = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-39, 3.75])
        x = torch.cat([values, mids, beside, specials])
        x = x[torch.isfinite(x)]
        if not signed:
            x = x.abs()
        x = torch.cat([x, torch.zeros((-x.numel()) % 300)]).reshape(-1, 300)
        x[:, 0] = 3.75
        x = torch.cat([x, torch.zeros(16 - x.shape[0], 300)])  # ≥ 4096 elements
        other = x.abs() if signed else torch.randn(x.shape)
        state = loaded_state(x if signed else other, other if signed else x)
        name = "exp_avg" if signed else "exp_avg_sq"
        codes, absmax = quantize_reference(x, signed)
        assert torch.equal(state[name + "_absmax"], absmax)
        assert torch.equal(state[name + "_codes"], codes)
        assert torch.equal(dequantize_reference(codes, absmax, signed),
                           dequantize_reference(state[name + "_codes"], state[name + "_absmax"],
                                                signed))


def adamw_int8_reference(p, grads, lr, betas, eps, weight_decay):
    """AdamW with int8 moments, written out: each step dequantizes, updates in fp32 in the fused
    kernel's order of operations, and quantizes again."""
    b1, b2 = betas
    f = torch.float32
    m_codes, m_absmax = quantize_reference(torch.zeros(p.shape), True)
    v_codes, v_absmax = quantize_reference(torch.zeros(p.shape), False)
    w = p.detach().clone()
    for t, g in enumerate(grads, start=1):
        m = dequantize_reference(m_codes, m_absmax, True)
        v = dequantize_reference(v_codes, v_absmax, False)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        decay = torch.tensor(1 - lr * weight_decay, dtype=f)
        step_size = torch.tensor(lr / bc1, dtype=f)
        inv_sqrt_bc2 = divided(1.0, torch.tensor(bc2 ** 0.5, dtype=f))
        grad = g + torch.tensor(0.0) * w
        w = w * decay
        m = m * torch.tensor(b1, dtype=f) + grad * torch.tensor(1 - b1, dtype=f)
        v = v * torch.tensor(b2, dtype=f) + torch.tensor(1 - b2, dtype=f) * grad * grad
        denom = v.double().sqrt().float() * inv_sqrt_bc2 + torch.tensor(eps, dtype=f)
        w = w - step_size * divided(m, denom)
        m_codes, m_absmax = quantize_reference(m, True)
        v_codes, v_absmax = quantize_reference(v, False)
    return w, (m_codes, m_absmax, v_codes, v_absmax)


def test_adamw_with_int8_moments_equals_the_reference_bit_for_bit():
    torch.manual_seed(0)
    settings = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    p = torch.nn.Parameter(torch.randn(20, 300))
    grads = [torch.randn(20, 300) * 10.0 ** torch.randint(-6, 1, (20, 1)) for _ in range(4)]
    expected, (mc, ma, vc, va) = adamw_int8_reference(p, grads, **settings)
    optimizer = muon_cpp.AdamW([p], state_dtype=torch.int8, **settings)
    for g in grads:
        p.grad = g.clone()
        optimizer.step()
    state = optimizer.state_dict()["state"][0]
    assert torch.equal(state["exp_avg_codes"], mc) and torch.equal(state["exp_avg_absmax"], ma)
    assert torch.equal(state["exp_avg_sq_codes"], vc)
    assert torch.equal(state["exp_avg_sq_absmax"], va)
    assert torch.equal(p.detach(), expected)


def test_first_step_is_fp32_states_and_torch_adamws():
    torch.manual_seed(1)
    settings = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    init, grad = torch.randn(64, 128), torch.randn(64, 128)
    results = []
    for make in (lambda ps: muon_cpp.AdamW(ps, state_dtype="int8", **settings),
                 lambda ps: muon_cpp.AdamW(ps, **settings),
                 lambda ps: torch.optim.AdamW(ps, **settings)):
        p = torch.nn.Parameter(init.clone())
        p.grad = grad.clone()
        make([p]).step()
        results.append(p.detach())
    assert torch.equal(results[0], results[1])  # quantized after the update
    assert torch.allclose(results[0], results[2], rtol=0, atol=1e-6)


def trained_int8(steps, seed=2):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8))
    optimizer = muon_cpp.AdamW(model.parameters(), lr=1e-2, state_dtype="int8")
    data = [torch.randn(16, 64) for _ in range(steps)]
    for x in data:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    return model, optimizer


def test_state_dict_round_trips_and_the_run_goes_on_bit_for_bit():
    model, optimizer = trained_int8(3)
    saved = optimizer.state_dict()
    state = saved["state"][0]
    assert state["exp_avg_codes"].dtype == torch.uint8 and state["exp_avg_codes"].shape == (96, 64)
    assert state["exp_avg_absmax"].shape == (96, 1)
    assert "exp_avg" in saved["state"][1]  # the bias: under 4096 elements, float32
    twin, other = trained_int8(0)
    twin.load_state_dict(model.state_dict())
    other.load_state_dict(saved)
    again = other.state_dict()
    for index, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(again["state"][index][key], value), key
    x = torch.randn(16, 64)
    for m, o in ((model, optimizer), (twin, other)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_torch_adamws_state_comes_in_within_one_quantization_step_and_goes_back(caplog):
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(48, 200))
    theirs = torch.optim.AdamW([p], lr=1e-3)
    for _ in range(3):
        p.grad = torch.randn(p.shape)
        theirs.step()
    torch_state = theirs.state_dict()
    ours = muon_cpp.AdamW([p], lr=1e-3, state_dtype="int8")
    with caplog.at_level(logging.WARNING, logger="muon_cpp"):
        ours.load_state_dict(torch_state)
    assert "2 optimizer state tensors converted to this optimizer's state_dtype" in caplog.text
    state = ours.state_dict()["state"][0]
    for name, signed in (("exp_avg", True), ("exp_avg_sq", False)):
        x = torch_state["state"][0][name]
        codes, absmax = quantize_reference(x, signed)
        assert torch.equal(state[name + "_codes"], codes)
        back = dequantize_reference(codes, absmax, signed)
        # Within half the widest step of the map (1/8 before scaling) of its block's absmax.
        bound = absmax.repeat_interleave(BLOCK, 1)[:, :x.shape[1]] * (0.0625 / TOP)
        assert ((back - x).abs() <= bound * 1.0001).all()
    # Back to torch: through a float32 muon_cpp optimizer, which dequantizes (the saved groups
    # say int8, and load_state_dict restores group settings: they are switched first).
    saved = ours.state_dict()
    for group in saved["param_groups"]:
        group["state_dtype"] = torch.float32
    full = muon_cpp.AdamW([p], lr=1e-3)
    full.load_state_dict(saved)
    again = torch.optim.AdamW([p], lr=1e-3)
    again.load_state_dict(full.state_dict())
    assert torch.equal(again.state_dict()["state"][0]["exp_avg"],
                       dequantize_reference(state["exp_avg_codes"], state["exp_avg_absmax"], True))
    p.grad = torch.randn(p.shape)
    again.step()


def test_a_group_switched_between_steps_converts_its_state_once():
    model, optimizer = trained_int8(2)
    codes = optimizer.state_dict()["state"][0]
    optimizer.param_groups[0]["state_dtype"] = torch.float32
    x = torch.randn(16, 64)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()
    state = optimizer.state_dict()["state"][0]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
    # The step ran on the dequantized moments: m = β1·m_old + (1 − β1)·g.
    m_old = dequantize_reference(codes["exp_avg_codes"], codes["exp_avg_absmax"], True)
    grad = model[0].weight.grad
    expected = m_old * torch.tensor(0.9) + grad * torch.tensor(1 - 0.9, dtype=torch.float32)
    assert torch.equal(state["exp_avg"], expected)


def test_nonfinite_gradients_skip_the_step_and_keep_the_codes():
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8))
    optimizer = muon_cpp.build_optimizer(model, "optimizer: {name: muon, state_dtype: int8}", 10)
    x = torch.randn(16, 64)
    model(x).square().mean().backward()
    optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state[model[0].weight].items()}
    assert before["momentum_buffer_codes"].dtype == torch.uint8
    for bad in (float("nan"), float("inf")):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        model[0].weight.grad[0, 0] = bad
        optimizer.step()
        assert optimizer.last_step["skipped"]
        for key, value in optimizer.state[model[0].weight].items():
            assert torch.equal(value, before[key]), key


def test_bad_state_dtypes_parameters_and_scales_are_refused_naming_them():
    with pytest.raises(ValueError, match="expected float32, bfloat16 or int8 .*got 'int4'"):
        muon_cpp.AdamW([torch.nn.Parameter(torch.zeros(64, 64))], state_dtype="int4")
    wide = torch.nn.Parameter(torch.zeros(64, 64, dtype=torch.float64))
    wide.grad = torch.ones_like(wide)
    with pytest.raises(Exception, match="is float64; int8 state is kept for float32, bfloat16 "
                                        "and float16 parameters"):
        muon_cpp.AdamW([wide], state_dtype="int8").step()
    assert torch.equal(wide, torch.zeros_like(wide))
    with pytest.raises(ValueError, match="state_dtype: dion .* has no int8 state"):
        muon_cpp.build_optimizer(torch.nn.Linear(64, 64),
                                 "optimizer: {name: dion, state_dtype: int8}", 10)
    model, optimizer = trained_int8(2)
    good = optimizer.state_dict()
    for change, message in (
            (lambda s: s.neg_(), "exp_avg_absmax holds a negative scale"),
            (lambda s: s.fill_(float("nan")), "exp_avg_absmax holds NaN or Inf"),
            (lambda s: s.fill_(float("inf")), "exp_avg_absmax holds NaN or Inf")):
        bad = optimizer.state_dict()
        bad["state"][0] = dict(bad["state"][0])
        bad["state"][0]["exp_avg_absmax"] = change(bad["state"][0]["exp_avg_absmax"].clone())
        with pytest.raises(ValueError, match=message):
            optimizer.load_state_dict(bad)
    bad = optimizer.state_dict()
    bad["state"][0] = dict(bad["state"][0], exp_avg_absmax=torch.zeros(96, 2))
    with pytest.raises(ValueError, match=r"exp_avg_absmax has shape \[96, 2\], this optimizer "
                                         r"needs \[96, 1\]"):
        optimizer.load_state_dict(bad)
    after = optimizer.state_dict()  # nothing changed
    for index, entry in good["state"].items():
        for key, value in entry.items():
            assert torch.equal(after["state"][index][key], value), key
