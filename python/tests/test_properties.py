"""Property-based tests of the Python module's entry points: generated keyword arguments, tensors,
YAML documents, state dicts and calls. Each property asserts the contract of docs/robustness.md:
a correct result (equal to a reference where one applies), or an exception of the type a PyTorch
user expects whose message names what is wrong — and after a refusal, parameters, state and
settings exactly as they were. Profiles and the outcome tally: property_support.py."""
import copy
import glob
import math
import os

import pytest
import torch
import yaml
from hypothesis import given, strategies as st

import muon_cpp
from muon_cpp import _core
from helpers import NoAttention, ReferenceMuon, TinyGpt, batches, reference_newton_schulz
from property_support import accepted, refused

ALGORITHMS = {"muon": muon_cpp.Muon, "adamw": muon_cpp.AdamW, "adam": muon_cpp.Adam,
              "lamb": muon_cpp.Lamb, "lion": muon_cpp.Lion}
REPO = os.path.join(os.path.dirname(__file__), "..", "..")

# Values a careless caller may pass for any setting.
wild_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    # beyond what int64 and float64 hold (a float's range ends near 2^1024)
    st.sampled_from([2**63, -2**63 - 1, 2**64, 10**400, -10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["quintic", "polar_express", "dion", "row", "col", "ema", "sum", "original",
                     "plain", "gram", "symmetric", "auto", "none", "float32"]),
    st.tuples(st.floats(-1, 2), st.floats(-1, 2)), st.lists(st.integers(-3, 10), max_size=4),
    st.lists(st.lists(st.floats(-5, 5), max_size=4), max_size=3),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32]),
    st.dictionaries(st.sampled_from(["beta2", "axis", "mode", "eps"]),
                    st.sampled_from([0.95, "row", "col", 2.0, -1, None]), max_size=3),
    st.floats(-1, 1).map(torch.tensor),
)

# Values each option takes when used as intended.
plausible = {
    "lr": st.floats(0, 0.5), "momentum": st.floats(0, 0.99), "nesterov": st.booleans(),
    "weight_decay": st.floats(0, 0.5), "ns_steps": st.integers(1, 8),
    "coefficients": st.sampled_from(["quintic", "polar_express", "dion", "cans", "aol", "cubic5",
                                     "deepseekv4"]),
    "weight_decay_method": st.sampled_from(["decoupled", "independent", "l2", "palm"]),
    "ns_eps": st.sampled_from([None, 1e-7, 1e-3]), "row_equilibration": st.booleans(),
    "mantissa_tracking": st.booleans(),
    "momentum_form": st.sampled_from(["ema", "sum"]),
    "adjust_lr": st.sampled_from(["original", "match_rms_adamw", "spectral", "none"]),
    "ns_method": st.sampled_from(["automatic", "plain", "symmetric", "gram"]),
    "ns_dtype": st.sampled_from([None, torch.float32, torch.float64]),
    "gram_restarts": st.sampled_from([None, (), (2,), (1, 3)]),
    "post_norm": st.sampled_from(["none", "row", "col", "row_col", "col_row", "frobenius"]),
    "post_norm_eps": st.floats(1e-10, 1e-3),
    "normuon": st.sampled_from([None, {"beta2": 0.95, "axis": "row"}, {"axis": "col"}]),
    "cautious_weight_decay": st.booleans(), "cautious": st.booleans(),
    "state_dtype": st.sampled_from([torch.float32, torch.bfloat16]),
    "fused": st.sampled_from([None, True, False]),
    "betas": st.tuples(st.floats(0, 0.99), st.floats(0, 0.999)), "eps": st.floats(1e-12, 1e-3),
}


def setting_value(name):
    return st.one_of(plausible.get(name, wild_values), wild_values)


def snapshot(optimizer, params):
    """Everything an optimizer holds, copied: parameters, settings, state."""
    state = {i: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
             for i, s in optimizer.state_dict()["state"].items()}
    # The groups' settings (muon_cpp.Muon's state dicts add torch.optim.Muon's names derived
    # from them).
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return [p.detach().clone() for p in params], groups, state


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(
            torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(
                a.nan_to_num(0), b.nan_to_num(0)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def assert_unchanged(before, optimizer, params):
    assert same(before, snapshot(optimizer, params)), "a refused call changed the optimizer"


def gradients(shape, dtype, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
            for _ in range(steps)]


def step_with(optimizer, params, grads):
    for g in grads:
        for p in params:
            p.grad = g.clone()
        optimizer.step()


# ---- constructors ----

REFERENCE_KEYS = {"muon": {"lr", "momentum", "nesterov", "weight_decay", "momentum_form",
                           "adjust_lr"},
                  "adamw": {"lr", "betas", "eps", "weight_decay"},
                  "adam": {"lr", "betas", "eps", "weight_decay"}}


def reference_step(algorithm, kwargs, p, grads):
    """The same steps by an outside reference: torch.optim's AdamW and Adam, the straightforward
    Muon of helpers.py (the update as docs/design.md states it)."""
    defaults = {row[0]: row[1] for row in _core.option_schema(algorithm)}
    settings = {key: kwargs.get(key, defaults[key]) for key in REFERENCE_KEYS[algorithm]}
    # Numbers as floats: torch.optim keeps a 0-d tensor a float32 tensor (and rounds), and cannot
    # take an int beyond 64 bits where our options (doubles) can.
    settings = {key: float(v) if isinstance(v, (int, torch.Tensor)) and not isinstance(v, bool)
                else v for key, v in settings.items()}
    theirs = p.detach().clone().requires_grad_(True)
    if algorithm == "muon":
        optimizer = ReferenceMuon(**settings)
        for g in grads:
            theirs.grad = g.clone()
            optimizer.step([theirs])
    else:
        optimizer = (torch.optim.AdamW if algorithm == "adamw" else torch.optim.Adam)(
            [theirs], **settings)
        step_with(optimizer, [theirs], grads)
    return theirs.detach()


@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), data=st.data())
def test_constructor_options(algorithm, data):
    """Constructor keywords of Muon, AdamW, Adam and Lamb: any subset of each one's options, each
    plausible, at a boundary, of a wrong type, non-finite or beyond 64 bits."""
    names = [row[0] for row in _core.option_schema(algorithm)]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    kwargs = {name: data.draw(setting_value(name), label=name) for name in chosen}
    p = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    try:
        optimizer = ALGORITHMS[algorithm]([p], **kwargs)
    except Exception as error:  # noqa: BLE001 -- the contract decides
        refused("constructor_options", error, (ValueError, TypeError), chosen)
        return
    grads = gradients(p.shape, p.dtype, 3)
    start = p.detach().clone()
    p.grad = grads[0].clone()
    before = snapshot(optimizer, [p])
    try:  # what only the parameter's device can tell is refused by the first step
        optimizer.step()
    except Exception as error:  # noqa: BLE001
        refused("constructor_options", error, (RuntimeError, ValueError, TypeError), chosen)
        assert_unchanged(before, optimizer, [p])
        return
    step_with(optimizer, [p], grads[1:])
    accepted("constructor_options")
    if algorithm in REFERENCE_KEYS and set(kwargs) <= REFERENCE_KEYS[algorithm]:
        expected = reference_step(algorithm, kwargs, start, grads)
        if expected.isfinite().all():  # (at lr 1e155 both overflow, each to its own inf or nan)
            torch.testing.assert_close(p.detach(), expected, rtol=1e-9, atol=1e-12)


# ---- parameter tensors ----

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool,
          torch.complex64]


@st.composite
def parameters(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    base = torch.zeros(shape, dtype=dtype) if not (dtype.is_floating_point or dtype.is_complex) \
        else torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    if draw(st.booleans()) and len(shape) >= 2:
        base = base.transpose(-1, -2).contiguous().transpose(-1, -2)  # not contiguous
    if draw(st.sampled_from(["cpu", "cpu", "cpu", "meta"])) == "meta":
        base = base.to("meta")
    return base


@given(algorithm=st.sampled_from(["muon", "adamw"]), p=parameters(),
       gradient=st.sampled_from(["dense", "dense", "none", "sparse", "other dtype"]))
def test_parameter_tensors(algorithm, p, gradient):
    """Parameters of every dtype (float64/32/16, bfloat16, int64, bool, complex64), rank 0–3 with
    empty dimensions, on the CPU or the meta device, contiguous or not, with a dense, sparse,
    differently typed or no gradient."""
    try:
        optimizer = ALGORITHMS[algorithm]([p])
    except Exception as error:  # noqa: BLE001
        refused("parameter_tensors", error, (ValueError, TypeError))
        return
    try:
        if gradient == "dense":
            p.grad = torch.ones_like(p) * 0.5
        elif gradient == "sparse" and p.device.type == "cpu" and p.dim() > 0:
            p.grad = (torch.ones_like(p) * 0.5).to_sparse()
        elif gradient == "other dtype" and p.dtype.is_floating_point:
            p.grad = torch.ones(p.shape, dtype=torch.float64, device=p.device)
    except RuntimeError:
        pass  # PyTorch itself refuses that gradient for this tensor
    before = snapshot(optimizer, [p]) if p.device.type == "cpu" else None
    try:
        optimizer.step()
    except Exception as error:  # noqa: BLE001
        refused("parameter_tensors", error, (RuntimeError, ValueError, TypeError))
        if before is not None:
            assert_unchanged(before, optimizer, [p])
        return
    accepted("parameter_tensors")
    if p.device.type != "cpu" or p.grad is None or p.dtype not in (torch.float32, torch.float64):
        return
    if p.numel() == 0:
        return
    # One step from the same start equals the reference (float64 arithmetic for the reference).
    start = before[0][0].double()
    grad = p.grad.double()
    if algorithm == "adamw":
        expected = reference_step("adamw", {}, start, [grad])
    else:
        expected = start.clone()
        matrices = expected.reshape(-1, *expected.shape[-2:])
        for matrix, g in zip(matrices, grad.reshape(-1, *grad.shape[-2:])):
            reference = ReferenceMuon(0.02)
            m = matrix.clone().requires_grad_(True)
            m.grad = g
            reference.step([m])
            matrix.copy_(m.detach())
        expected = matrices.reshape(expected.shape)
    tolerance = 1e-9 if p.dtype == torch.float64 else 2e-5
    torch.testing.assert_close(p.detach().double(), expected, rtol=tolerance, atol=tolerance)


@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), data=st.data())
def test_setting_assignments(algorithm, data):
    """Settings written into param_groups between steps (as schedulers and users do): any option,
    any value."""
    names = [row[0] for row in _core.option_schema(algorithm)]
    name = data.draw(st.sampled_from(names))
    value = data.draw(setting_value(name), label=name)
    p = torch.nn.Parameter(torch.randn(5, 3))
    optimizer = ALGORITHMS[algorithm]([p])
    step_with(optimizer, [p], gradients(p.shape, p.dtype, 1))
    before = snapshot(optimizer, [p])
    optimizer.param_groups[0][name] = value
    try:
        optimizer.step()
    except Exception as error:  # noqa: BLE001
        refused("setting_assignments", error, (RuntimeError, ValueError, TypeError), [name])
        before[1][0][name] = value  # the assignment itself is the caller's
        assert_unchanged(before, optimizer, [p])
        return
    accepted("setting_assignments")


# ---- YAML documents ----

def example_configs():
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "examples", "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            document = yaml.safe_load(f)
        out.append({"optimizer": document["optimizer"]} if "optimizer" in document else document)
    return out


EXAMPLES = example_configs()


def leaf_paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,)
            yield from leaf_paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from leaf_paths(value, prefix + (index,))


def draw_place(draw, tree):
    """A random entry of a nested dict/list: (its container, its key, its path), or None when
    `tree` is empty."""
    paths = list(leaf_paths(tree))
    if not paths:
        return None
    path = draw(st.sampled_from(paths))
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    return parent, path[-1], path


def yaml_scalars():
    return st.one_of(wild_values.filter(lambda v: not isinstance(v, (torch.Tensor, torch.dtype))),
                     st.sampled_from(["cosine", "warmdown", "power", "muon", "adamw", "muonclip",
                                      "mup", "nanochat", ".nan", "bfloat16", "*"]))


@st.composite
def yaml_documents(draw):
    """(YAML text, names a refusal must mention): an example config, maybe mutated."""
    document = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    names = []
    for _ in range(draw(st.integers(0, 3))):
        place = draw_place(draw, document)
        if place is None:
            break
        parent, key, path = place
        kind = draw(st.sampled_from(["replace", "delete", "unknown key", "rename"]))
        if kind == "replace" or isinstance(parent, list):
            parent[key] = draw(yaml_scalars())
        elif kind == "delete":
            del parent[key]
        elif kind == "unknown key":
            parent[draw(st.sampled_from(["lrr", "nestrov", "tau", "extra", "name"]))] = \
                draw(yaml_scalars())
        else:
            parent[str(key)[:-1] or "x"] = parent.pop(key)
        names += [str(k) for k in path if isinstance(k, str)]
    text = yaml.safe_dump(document, default_flow_style=draw(st.booleans()))
    if draw(st.integers(0, 4)) == 0:  # damage the text itself
        at = draw(st.integers(0, max(0, len(text) - 1)))
        text = text[:at] + draw(st.sampled_from(["", "{", ":", "- ", "\t", "'", "]"])) + \
            text[at + draw(st.integers(0, 3)):]
        names = []
    return text, names


@given(document=yaml_documents(), total_steps=st.sampled_from([400, 1000, 5000]))
def test_yaml_documents(document, total_steps):
    """YAML configurations: every example config, and each with up to three keys replaced by
    other values, deleted, misspelt or joined by an unknown key, or its text damaged."""
    text, names = document
    model = TinyGpt()
    weights_before = [p.detach().clone() for p in model.parameters()]
    try:
        optimizer = muon_cpp.build_optimizer(model, text, total_steps)
    except Exception as error:  # noqa: BLE001
        refused("yaml_documents", error, (ValueError, TypeError), names)
        assert all(torch.equal(a, b.detach()) for a, b in zip(weights_before, model.parameters()))
        return
    accepted("yaml_documents")
    optimizer.set_qk_clip_source(NoAttention())  # QK-clip (muonclip examples) finds no heads
    # It steps. (Not necessarily to finite weights: a mutated config may hold a valid but absurd
    # rate, say 1e38, which diverges here as it would in torch.optim.)
    for tokens in batches(2):
        optimizer.zero_grad()
        model.loss(tokens).backward()
        optimizer.step()
    assert [p.shape for p in model.parameters()] == [w.shape for w in weights_before]


# ---- state dicts ----

def trained(kind):
    torch.manual_seed(0)
    if kind == "hybrid":
        model = TinyGpt()
        optimizer = muon_cpp.build_optimizer(model, "optimizer: {name: muon, state_dtype: "
                                             "bfloat16}", 100)
        params = list(model.parameters())
    else:
        params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
        optimizer = ALGORITHMS[kind](params[:1] if kind == "muon" else params)
        params = params[:1] if kind == "muon" else params
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
    return optimizer, params


def tensor_variants(t):
    return st.sampled_from([t.flatten(), t.double(), t.to(torch.bfloat16), t * float("nan"),
                            t * float("inf"), t.unsqueeze(0), torch.zeros(0), t.to(torch.int32),
                            t + 1])


@st.composite
def state_dict_mutations(draw, state_dict):
    mutated = copy.deepcopy(state_dict)
    for _ in range(draw(st.integers(1, 3))):
        place = draw_place(draw, mutated)
        if place is None:
            break
        parent, key, _ = place
        kind = draw(st.sampled_from(["replace", "delete", "extra"]))
        if kind == "delete" and not isinstance(parent, list):
            del parent[key]
        elif kind == "extra" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["momentum", "exp_avg", "step", 7, "lr"]))] = \
                draw(wild_values)
        elif isinstance(parent[key], torch.Tensor):
            parent[key] = draw(tensor_variants(parent[key]))
        else:
            parent[key] = draw(wild_values)
    return mutated


@given(kind=st.sampled_from(["muon", "adamw", "lamb", "hybrid"]), data=st.data())
def test_state_dicts(kind, data):
    """State dicts of Muon, AdamW, Lamb and the hybrid optimizer after two steps, with one to three
    entries replaced (tensors by other shapes, dtypes, NaN, Inf; settings by any value), deleted or
    joined by unknown ones."""
    optimizer, params = trained(kind)
    mutated = data.draw(state_dict_mutations(optimizer.state_dict()))
    before = snapshot(optimizer, params)
    try:
        optimizer.load_state_dict(mutated)
    except Exception as error:  # noqa: BLE001
        refused("state_dicts", error, (ValueError, TypeError))
        assert_unchanged(before, optimizer, params)
        return
    accepted("state_dicts")
    for p in params:
        p.grad = torch.randn_like(p)
    try:
        optimizer.step()
    except Exception as error:  # noqa: BLE001 -- a setting the state dict carried, refused now
        refused("state_dicts", error, (RuntimeError,))


# ---- functions ----

@given(x=parameters(), coefficients=st.one_of(plausible["coefficients"], wild_values),
       steps=st.one_of(st.integers(0, 12), wild_values),
       method=st.one_of(plausible["ns_method"], wild_values),
       dtype=st.one_of(plausible["ns_dtype"], wild_values),
       gram_restarts=st.one_of(plausible["gram_restarts"], wild_values))
def test_orthogonalize_calls(x, coefficients, steps, method, dtype, gram_restarts):
    """muon_cpp.orthogonalize with tensors as above and any coefficients, steps, method, dtype and
    restart points."""
    before = x.clone()
    try:
        result = muon_cpp.orthogonalize(x, coefficients, steps, method=method, dtype=dtype,
                                        gram_restarts=gram_restarts)
    except Exception as error:  # noqa: BLE001
        refused("orthogonalize_calls", error, (ValueError, TypeError, RuntimeError))
        return
    accepted("orthogonalize_calls")
    assert result.shape == x.shape
    if x.device.type != "cpu":
        return
    assert torch.equal(x, before)
    if (x.dtype == torch.float64 and x.dim() == 2 and x.numel() > 0 and coefficients == "quintic"
            and dtype in (None, torch.float64) and isinstance(steps, int)):
        expected = reference_newton_schulz(x, steps)
        torch.testing.assert_close(result, expected, rtol=1e-8, atol=1e-10)


@st.composite
def model_sources(draw):
    kind = draw(st.sampled_from(["module", "pairs", "bad pairs", "other"]))
    if kind == "module":
        return TinyGpt()
    if kind == "pairs":
        return [(f"w{i}", torch.nn.Parameter(torch.randn(3, 3))) for i in range(2)]
    if kind == "bad pairs":
        return [draw(st.sampled_from([("w", 1.0), (1, torch.zeros(2)), ("w",), "w"]))]
    return draw(st.sampled_from([None, 3, "model", torch.zeros(3), {"w": torch.zeros(3)}]))


@given(source=model_sources(),
       config=st.one_of(st.none(), st.sampled_from(["optimizer: muon", "{}", "lr: 0.01",
                                                    "/nonexistent.yaml", REPO + "/examples/",
                                                    REPO + "/examples/muon.yaml"]),
                        st.dictionaries(st.sampled_from(["optimizer", "lr", "schedule"]),
                                        yaml_scalars(), max_size=2), wild_values),
       total_steps=st.one_of(st.integers(-5, 2000), wild_values))
def test_hybrid_calls(source, config, total_steps):
    """build_optimizer with a module, name/tensor pairs or anything else; config as text, a path
    (missing, a directory, real), a dict or any value; total_steps of any value."""
    try:
        optimizer = muon_cpp.build_optimizer(source, config, total_steps)
    except Exception as error:  # noqa: BLE001
        refused("hybrid_calls", error, (ValueError, TypeError, FileNotFoundError,
                                        IsADirectoryError))
        return
    accepted("hybrid_calls")
    assert len(optimizer.param_groups) >= 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
