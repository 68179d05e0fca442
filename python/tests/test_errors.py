"""Bad inputs raise the Python exception a PyTorch user expects, with the C++ message."""
import pytest
import torch

import muon_cpp
from helpers import TinyGpt, reference_newton_schulz




@pytest.mark.parametrize("make", [
    lambda p: muon_cpp.AdamW([p]),
    lambda p: muon_cpp.Adam([p]),
    lambda p: muon_cpp.Lamb([p]),
    lambda p: muon_cpp.Lion([p]),
    lambda p: muon_cpp.Muon([p]),
])
def test_sparse_gradient_is_a_runtime_error_and_changes_nothing(make):
    p = torch.nn.Parameter(torch.zeros(4, 3))
    optimizer = make(p)
    p.grad = torch.zeros(4, 3).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        optimizer.step()
    assert torch.equal(p.detach(), torch.zeros(4, 3))
    assert optimizer.state == {}


def test_sparse_gradient_in_hybrid():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 4))
    optimizer = muon_cpp.build_optimizer(model, None, 10)
    model(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()


def test_config_errors_are_value_errors():
    model = TinyGpt()
    with pytest.raises(ValueError, match="optimizer.lrr: unknown key; did you mean 'lr'"):
        muon_cpp.build_optimizer(model, "optimizer: {name: muon, lrr: 0.1}", 10)
    with pytest.raises(ValueError, match="optimizer.name"):
        muon_cpp.build_optimizer(model, "optimizer: {name: sgd}", 10)
    with pytest.raises(ValueError, match="total_steps must be > 0"):
        muon_cpp.build_optimizer(model, None, 0)
    with pytest.raises(ValueError, match="parameter 'blocks.0.norm.bias' of shape \\[12\\] .* "
                       "overridden to muon \\(routing.muon pattern"):
        muon_cpp.build_optimizer(model, "optimizer: {name: muon, routing: {muon: ['*.bias']}}", 10)
    with pytest.raises(FileNotFoundError):
        muon_cpp.build_optimizer(model, "no_such_config.yaml", 10)
    # Control characters and bytes that are not UTF-8 in a quoted value are written escaped: the
    # message is neither cut at a NUL nor lost to a decoding error. (yaml-cpp 0.7 reads the escape
    # \N as the lone byte 0x85 rather than U+0085's UTF-8 form; either is shown escaped.)
    for text, shown in [('"\\N"', r"\\(x85|u0085)"), ('"a\\0b"', r"a\\x00b"),
                        ('"\\e[2J"', r"\\x1b\[2J"), ('{name: "caf\u00e9"}', "caf\u00e9")]:
        with pytest.raises(ValueError, match=f"^optimizer.name: unknown optimizer '{shown}'; "
                                             "valid optimizers are muon"):
            muon_cpp.build_optimizer(model, f"optimizer: {text}\n", 10)


def test_wrong_types_are_type_errors():
    model = TinyGpt()
    with pytest.raises(TypeError, match="config must be YAML text, a path, a dict or None, got int"):
        muon_cpp.build_optimizer(model, 42, 10)
    with pytest.raises(TypeError, match="total_steps must be an int or None, got float"):
        muon_cpp.build_optimizer(model, None, 10.0)
    forms = (r"HybridOptimizer takes an nn.Module, parameters \(tensors, or \(name, tensor\) pairs "
             r"as named_parameters\(\) gives them\) or param groups \(dicts with 'params'\)")
    with pytest.raises(TypeError, match=forms + ", got Tensor"):
        muon_cpp.build_optimizer(torch.zeros(3), None, 10)
    with pytest.raises(TypeError, match=forms + "; parameter 0 of param group 0 is a list among "
                                                r"\(name, tensor\) pairs"):
        muon_cpp.build_optimizer([("w", [1.0])], None, 10)
    with pytest.raises(TypeError, match=forms + ": " + r"give param groups \(dicts\) alone"):
        muon_cpp.build_optimizer([{"params": [w0 := torch.nn.Parameter(torch.zeros(2))]}, w0])
    w = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(TypeError, match="lr must be a number, got str 'fast'"):
        muon_cpp.AdamW([w], lr="fast")
    with pytest.raises(TypeError, match="betas must be a pair"):
        muon_cpp.AdamW([w], betas=0.9)
    with pytest.raises(TypeError, match="nesterov must be True or False, got int"):
        muon_cpp.Muon([w], nesterov=1)
    with pytest.raises(TypeError, match="ns_steps must be an int, got float"):
        muon_cpp.Muon([w], ns_steps=5.0)
    with pytest.raises(TypeError, match="state_dtype must be a torch.dtype, got int"):
        muon_cpp.Muon([w], state_dtype=8)
    with pytest.raises(ValueError, match="state_dtype: expected float32, bfloat16 or int8 "
                                         r"\(or a torch.dtype\), got 'float16'"):
        muon_cpp.Muon([w], state_dtype="float16")
    with pytest.raises(TypeError, match="params argument given to the optimizer should be"):
        muon_cpp.AdamW(w)  # PyTorch's own check
    optimizer = muon_cpp.AdamW([w])
    optimizer.param_groups[0]["eps"] = None
    w.grad = torch.ones(4, 4)
    with pytest.raises(TypeError, match="eps must be a number, got NoneType"):
        optimizer.step()
    assert torch.equal(w.detach(), torch.zeros(4, 4))


def test_invalid_values_are_value_errors_then_runtime_errors_in_step():
    w = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="lr"):
        muon_cpp.AdamW([w], lr=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        muon_cpp.Muon([w], momentum=1.5)
    with pytest.raises(ValueError, match="unknown mode 'sqrt'; valid modes are original"):
        muon_cpp.Muon([w], adjust_lr="sqrt")
    with pytest.raises(ValueError, match="beta2, axis"):
        muon_cpp.Muon([w], normuon=dict(beta=0.9))
    with pytest.raises(ValueError, match="Muon"):
        muon_cpp.Muon([torch.nn.Parameter(torch.zeros(4))])  # a vector is not a matrix
    with pytest.raises(ValueError, match="state_dtype"):
        muon_cpp.Lamb([w], lr=0.1).add_param_group({"params": [torch.nn.Parameter(
            torch.zeros(2))], "state_dtype": torch.bfloat16})
    optimizer = muon_cpp.AdamW([w])
    optimizer.param_groups[0]["lr"] = -0.5  # as a buggy scheduler might
    w.grad = torch.ones(4, 4)
    with pytest.raises(RuntimeError, match="lr"):
        optimizer.step()
    assert torch.equal(w.detach(), torch.zeros(4, 4))


def test_closure_runs_once_with_grad_and_its_errors_propagate():
    w = torch.nn.Parameter(torch.ones(3, 3))
    optimizer = muon_cpp.Muon([w])
    calls = []

    def closure():
        calls.append(torch.is_grad_enabled())
        optimizer.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    with torch.no_grad():
        loss = optimizer.step(closure)
    assert calls == [True] and loss.item() == 9.0

    def failing():
        raise KeyError("from the closure")

    with pytest.raises(KeyError, match="from the closure"):
        optimizer.step(failing)


def test_hybrid_groups_are_fixed():
    model = TinyGpt()
    optimizer = muon_cpp.build_optimizer(model, None, 10)
    with pytest.raises(ValueError, match="come from its configuration"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(TypeError, match="keeps its state in C\\+\\+"):
        optimizer.state = {model.wte.weight: {}}


def test_out_of_range_numbers_name_the_setting_and_change_nothing():
    p = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"ns_steps must be an int that fits 64 bits, got 10{30}"):
        muon_cpp.Muon([p], ns_steps=10**30)
    # Numbers beyond a float's range (they raised OverflowError, naming no setting).
    with pytest.raises(ValueError, match=r"^lr must be a number a float holds \(\|x\| < 1.8e308\), "
                                         r"got 100000000000\.\.\. \(401 characters\)"):
        muon_cpp.AdamW([p], lr=10**400)
    with pytest.raises(ValueError, match=r"normuon\['beta2'\] must be a number a float holds"):
        muon_cpp.Muon([p], normuon={"beta2": 10**400})
    with pytest.raises(ValueError, match=r"^rank_fraction must be a number a float holds"):
        muon_cpp.Dion([p], rank_fraction=-10**400)
    with pytest.raises(ValueError, match=r"^steps must be an int that fits 64 bits"):
        muon_cpp.orthogonalize(torch.randn(4, 8), steps=10**30)
    optimizer = muon_cpp.Muon([p])
    before = p.detach().clone()
    optimizer.param_groups[0]["weight_decay"] = 10**400  # written between steps
    p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=r"^weight_decay must be a number a float holds"):
        optimizer.step()
    assert torch.equal(p.detach(), before)
    model = torch.nn.Linear(3, 4)
    with pytest.raises(ValueError,
                       match=r"total_steps must be > 0 and <= 2\^53 \(or None when unknown, without "
                             r"schedules\), got 1180591620717411303424"):
        muon_cpp.build_optimizer(model, None, 2**70)
    # A state's step is checked before it becomes an integer (NaN, 1e30, fractions).
    optimizer = muon_cpp.AdamW([p])
    p.grad = torch.ones_like(p)
    optimizer.step()
    before = optimizer.state_dict()
    for bad in (float("nan"), 1e30, 2.5, -1.0):
        state = optimizer.state_dict()
        state["state"][0]["step"] = torch.tensor(bad)
        with pytest.raises(ValueError, match=r"\['step'\] must be a whole number in \[0, 2\^53\]"):
            optimizer.load_state_dict(state)
        after = optimizer.state_dict()
        assert float(after["state"][0]["step"]) == float(before["state"][0]["step"])
        assert torch.equal(after["state"][0]["exp_avg"], before["state"][0]["exp_avg"])


def test_setting_errors_name_the_setting_and_change_nothing():
    # Found by the property tests: errors from a setting's domain must name the setting.
    p = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match="coefficients: unknown coefficient table 'row'; valid"):
        muon_cpp.Muon([p], coefficients="row")
    with pytest.raises(ValueError, match="Muon: coefficients: table 'custom' has no rows"):
        muon_cpp.Muon([p], coefficients=[])
    with pytest.raises(ValueError, match=r"Muon: ns_steps must be a whole number in \[1, 1000\], "
                                         "got 0"):
        muon_cpp.Muon([p], ns_steps=0)
    with pytest.raises(ValueError, match=r"ns_steps must be a whole number in \[1, 1000\], got "
                                         r"1e\+12"):
        muon_cpp.Muon([p], ns_steps=10**12)  # found by the property tests: it ran for ever
    with pytest.raises(ValueError, match="Muon: ns_dtype must be a floating-point type"):
        muon_cpp.Muon([p], ns_dtype=torch.int32)
    # float16 products on the CPU: refused where LibTorch lacks them (1.13), computed where not.
    optimizer = muon_cpp.Muon([p], ns_dtype=torch.float16)
    p.grad = torch.ones_like(p)
    start = p.detach().clone()
    try:
        optimizer.step()
        torch.testing.assert_close(p.detach(), start - 0.02 * reference_newton_schulz(
            torch.ones(4, 3)) * 1.1547005383792517, rtol=0, atol=2e-3)  # √(4/3)
    except RuntimeError as error:
        assert "Muon: parameter 0 of param group 0 with ns_dtype Half: orthogonalize: float16 on " \
            "CPU needs half-precision matrix products" in str(error), error
        assert torch.equal(p.detach(), start) and optimizer.state == {}
    optimizer = muon_cpp.Muon([p])
    p.grad = torch.ones_like(p)
    optimizer.step()
    before = p.detach().clone(), optimizer.state[p]["momentum_buffer"].clone()
    optimizer.param_groups[0]["coefficients"] = []  # between steps, as a scheduler would
    with pytest.raises(RuntimeError, match="Muon: coefficients: table 'custom' has no rows"):
        optimizer.step()
    assert torch.equal(p.detach(), before[0])
    assert torch.equal(optimizer.state[p]["momentum_buffer"], before[1])


def test_errors_say_what_to_pass():
    """A configuration without its optimizer section, a keyword of another algorithm, a
    schedule without the run's length: each message names what to pass instead."""
    model = nn_model()
    with pytest.raises(ValueError, match=r"^config: name, lr are keys of the optimizer section, "
                                         r"found at the top level; put them under `optimizer:` "):
        muon_cpp.build_optimizer(model, "name: muon\nlr: 0.02\n")
    with pytest.raises(TypeError, match=r"^Muon: got an unexpected keyword argument 'betas'; its "
                                        r"keywords are lr, momentum, .*\. betas is an option of "
                                        r"adamw, adam, lamb, lion: give those parameters to that "
                                        r"optimizer, or every parameter to "
                                        r"muon_cpp.HybridOptimizer"):
        muon_cpp.Muon([model[1].weight], betas=(0.9, 0.95))
    with pytest.raises(TypeError, match=r"^AdamW: got an unexpected keyword argument 'nesterovv'; "
                                        r"its keywords are lr, betas, eps"):
        muon_cpp.AdamW(model.parameters(), nesterovv=True)
    muon_cpp.build_optimizer(model, "optimizer: {name: muon, lr: 0.02}")  # no schedule: no length
    with pytest.raises(ValueError, match="schedules need: pass the number of steps the run "
                                         "takes\\), got 0"):
        muon_cpp.build_optimizer(model, {"optimizer": {"schedule": {"name": "cosine"}}})
    # model.parameters(): plain tensors, routed by shape, no error.
    report = muon_cpp.build_optimizer(model.parameters()).report()
    assert {row["role"] for row in report} == {"matrices", "others"}


def nn_model():
    return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 16))
