"""One option schema: the Python keywords, their defaults and each param_groups entry are the C++
options', and the Adam family's defaults are torch.optim's."""
import inspect

import pytest
import torch

import muon_cpp
from muon_cpp import _core

CLASSES = {"muon": muon_cpp.Muon, "adamw": muon_cpp.AdamW, "adam": muon_cpp.Adam,
           "lamb": muon_cpp.Lamb}


def keywords(cls):
    return [p for p in inspect.signature(cls).parameters.values() if p.name != "params"]


@pytest.mark.parametrize("algorithm", sorted(CLASSES))
def test_keywords_and_param_groups_are_the_schema(algorithm):
    schema = _core.option_schema(algorithm)
    cls = CLASSES[algorithm]
    # The schema's options, then torch.optim's implementation flags and the peers' flags of the
    # class (amsgrad, use_addmm), and Muon's torch.optim.Muon names and its preset keyword
    # (test_torch_muon.py), and last the process group (test_distributed.py).
    flags = [("foreach", None), ("maximize", False), ("capturable", False),
             ("differentiable", False)]
    own = {"muon": [("use_addmm", None)], "adamw": [("amsgrad", False)],
           "adam": [("amsgrad", False)]}.get(algorithm, [])
    extra = ([("ns_coefficients", None), ("eps", None), ("adjust_lr_fn", None),
              ("use_gram_newton_schulz", None), ("gram_newton_schulz_config", None)] + flags
             + own + [("preset", None)]) if algorithm == "muon" else flags + own
    extra.append(("process_group", None))
    assert [(p.name, p.default) for p in keywords(cls)] == [
        (n, d) for n, d, _, _ in schema] + extra
    # The first four are positional, as in torch.optim; the rest keyword-only.
    kinds = [p.kind for p in keywords(cls)]
    assert kinds[:4] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 4
    assert set(kinds[4:]) == {inspect.Parameter.KEYWORD_ONLY}
    # A param_groups entry holds every option, as the C++ group's options give it back.
    p = torch.nn.Parameter(torch.zeros(4, 3))
    group = cls([p]).param_groups[0]
    assert {k: v for k, v in group.items() if k != "params"} == {n: d for n, d, _, _ in schema}
    # Each option's doc line is there (the docs tables are made from it).
    assert all(doc for _, _, doc, _ in schema)


def test_a_class_line_naming_an_algorithm_makes_the_whole_optimizer():
    """A class naming a registered algorithm in its first line gets its engine, name and schema
    __init__ (docs/design.md §Adding an algorithm): a second Lion made so steps as muon_cpp.Lion."""
    from muon_cpp._engine import _EngineOptimizer

    class OneLineLion(_EngineOptimizer, algorithm="lion", positional=3):
        pass

    assert OneLineLion._algorithm == "lion"
    assert ([(p.name, p.default, p.kind) for p in keywords(OneLineLion)]
            == [(p.name, p.default, p.kind) for p in keywords(muon_cpp.Lion)])
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 3))
    b = torch.nn.Parameter(a.detach().clone())
    ours = OneLineLion([a], 1e-2, (0.9, 0.99), 0.1)
    reference = muon_cpp.Lion([b], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    for _ in range(3):
        g = torch.randn(5, 3)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        reference.step()
    assert not torch.equal(a, torch.zeros(5, 3)) and torch.equal(a, b)
    assert torch.equal(ours.state[a]["exp_avg"], reference.state[b]["exp_avg"])
    with pytest.raises(ValueError, match="Nope: algorithm 'signum' is not registered; "
                                         "registered are muon, dion, adamw, adam, lamb, lion"):
        class Nope(_EngineOptimizer, algorithm="signum", positional=3):
            pass


@pytest.mark.parametrize("ours,theirs", [(muon_cpp.AdamW, torch.optim.AdamW),
                                         (muon_cpp.Adam, torch.optim.Adam)])
def test_adam_family_defaults_are_torch_optims(ours, theirs):
    torch_defaults = {p.name: p.default for p in inspect.signature(theirs).parameters.values()}
    for p in keywords(ours)[:4]:  # lr, betas, eps, weight_decay
        assert p.default == torch_defaults[p.name], p.name


def test_unknown_keyword_and_positional_overflow_are_type_errors():
    p = torch.nn.Parameter(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="ns_stepz"):
        muon_cpp.Muon([p], ns_stepz=3)
    with pytest.raises(TypeError):
        muon_cpp.Muon([p], 0.02, 0.95, True, 0.0, 5)  # ns_steps is keyword-only
    optimizer = muon_cpp.Muon([p], 0.01, 0.9, False, 0.1, ns_steps=3, gram_restarts=(2,))
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == \
        (0.01, 0.9, False, 0.1)
    assert group["ns_steps"] == 3 and group["gram_restarts"] == (2,)


def test_every_option_reaches_the_cpp_optimizer():
    # A setting the C++ side does not accept is refused when the engine is built, naming it.
    p = torch.nn.Parameter(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="Muon: post_norm_eps must be > 0"):
        muon_cpp.Muon([p], post_norm_eps=0.0)
    with pytest.raises(ValueError, match="Lamb: nesterov is not supported"):
        muon_cpp.Lamb([p], nesterov=True)
    with pytest.raises(TypeError, match="gram_restarts must be a list or tuple of ints"):
        muon_cpp.Muon([p], gram_restarts="2")


YAML_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def yaml_of(value):
    """How the C++ config writer spells a Python default (written out here, independently)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, torch.dtype):
        return YAML_DTYPES[value]
    if isinstance(value, tuple):
        return "[" + ", ".join(yaml_of(v) for v in value) + "]"
    return str(value)


def same(yaml_text, value):
    """A YAML scalar or flow list equals the Python default (numbers by value)."""
    if isinstance(value, float):
        return float(yaml_text) == value
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return [float(v) for v in yaml_text.strip("[]").split(",")] == list(value)
    return yaml_text == yaml_of(value)


@pytest.mark.parametrize("algorithm", ["muon", "adamw"])
def test_yaml_sections_have_the_python_names_and_defaults(algorithm):
    python = _core.option_schema(algorithm)
    yaml = _core.config_schema(algorithm)
    assert [key for key, *_ in yaml] == [name for name, *_ in python]
    for (key, _, text, *_), (_, default, _, _) in zip(yaml, python):
        assert same(text, default), (key, text, default)


def named(model):
    return list(model.named_parameters())


def test_every_schedule_and_group_key_is_accepted_from_a_dict_and_typos_are_not():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for key, _, default, _, _, kinds in _core.config_schema("schedule"):
        kind = (kinds.split() or ["cosine"])[0]
        if key in ("name", "tail"):
            continue
        value = 3 if default.lstrip("-").isdigit() or default == "null" else (
            "cosine" if key == "shape" else 0.5)
        config = {"optimizer": {"schedule": {"name": kind, key: value}}}
        muon_cpp.build_optimizer(model, config, 100)
    group = {"name": "all", "patterns": ["*"], "lr_multiplier": 0.5, "lr": 0.01,
             "weight_decay": 0.0, "betas": [0.9, 0.95], "eps": 1e-9, "momentum": 0.9,
             "schedule": {"name": "constant"}, "num_heads": 1, "split_sizes": [12]}
    assert sorted(group) == sorted(k for k, *_ in _core.config_schema("param_group"))
    optimizer = muon_cpp.build_optimizer(model, {"optimizer": {"param_groups": [group]}}, 100)
    assert {g["lr"] for g in optimizer.param_groups} == {0.01}
    with pytest.raises(ValueError, match=r"optimizer.schedule.warmup_step: unknown key; "
                                         r"did you mean 'warmup_steps'\?"):
        muon_cpp.build_optimizer(model, {"optimizer": {"schedule": {"name": "cosine",
                                                                    "warmup_step": 3}}}, 100)
    with pytest.raises(ValueError, match="optimizer.schedule.pct_start: only the one_cycle "
                                         "schedule has a pct_start"):
        muon_cpp.build_optimizer(model, {"optimizer": {"schedule": {"name": "cosine",
                                                                    "pct_start": 0.5}}}, 100)


def test_the_package_imports_in_one_direction():
    """scripts/import_graph.py over the package's source: no module imports one that imports it
    back, deferred imports included; and the script finds a circle where there is one."""
    import importlib.util
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("import_graph", root / "scripts/import_graph.py")
    import_graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(import_graph)
    edges = import_graph.graph(root / "python/muon_cpp")
    assert "_schema" in edges["_engine"] and edges["_schema"] == []
    assert import_graph.circles(edges) == []
    assert import_graph.circles({"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}) == [
        ["a", "b", "c", "a"]]
