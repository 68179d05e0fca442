"""Routing decides by the model's structure first (docs/design.md §Routing): the three ways names
alone once sent layers to the wrong algorithm, example_inputs= finding the output layer by a
traced forward, the one warning a build gives for roles that still rest on a name or a guess, and
the one it gives for matrices given without names, routed by shape (routing="shape" says so)."""
import warnings

import pytest
import torch
from torch import nn

import muon_cpp
from helpers import TinyGpt


def roles(model, **keywords):
    """{name: (role, reason)} of a build with no warning allowed (warnings raise)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = muon_cpp.build_optimizer(model, **keywords)
    return {row["name"]: (row["role"], row["reason"]) for row in optimizer.report()}


def build_warnings(model, **keywords):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        muon_cpp.build_optimizer(model, **keywords)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


class Mlp(nn.Module):
    """A block's MLP whose projections are named as output layers often are."""

    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)
        self.output_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.output_proj(self.out(torch.relu(self.up(x))))


class Lm(nn.Module):
    """An embedding, repeated blocks, and an untied head named `proj` over the vocabulary."""

    def __init__(self, vocab=40, d=8, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Mlp(d) for _ in range(layers))
        self.proj = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.proj(x)


def test_matrices_inside_repeated_blocks_are_hidden_whatever_their_names():
    routed = roles(Lm())
    for layer in range(2):
        for name in ("out", "output_proj", "up"):
            assert routed[f"blocks.{layer}.{name}.weight"] == ("matrices", "hidden 2-D matrix")


def test_a_head_over_the_vocabulary_is_an_output_layer_whatever_its_name():
    assert roles(Lm())["proj.weight"] == (
        "others", "an output head: its 40 rows match the embedding 'tok.weight'")


def test_the_readme_sequential_sends_its_logits_head_to_adamw():
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 256))
    routed = roles(model)
    assert routed["1.weight"] == ("matrices", "hidden 2-D matrix")
    assert routed["3.weight"] == ("others",
                                  "an output head: its 256 rows match the embedding '0.weight'")
    classifier = roles(nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 64), nn.ReLU(),
                                     nn.Linear(64, 10)))
    assert classifier["3.weight"] == ("others", "the last layer of a sequential model "
                                               "(it produces the output)")


class Scorer(nn.Module):
    """Continuous inputs, no embedding: only names or a traced forward tell the output layer."""

    def __init__(self, head_name):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 16)
        self.head_name = head_name
        self.add_module(head_name, nn.Linear(16, 3))

    def forward(self, x):
        hidden = torch.relu(self.fc2(torch.relu(self.norm(self.fc1(x)))))
        return {"logits": getattr(self, self.head_name)(hidden), "hidden": hidden}


def test_a_role_resting_on_a_name_or_a_guess_is_warned_once_per_build():
    [by_name] = build_warnings(Scorer("score"))
    assert by_name.startswith(
        "routing: 1 parameter's role rests on a name or a guess, not on the model's structure: "
        "'score.weight' → others (name part 'score' marks an input/output layer). If one is "
        "wrong, route it with a routing.adamw or routing.muon pattern (or a tag in C++); from "
        "Python, example_inputs= finds the output layer by a traced forward")
    [guessed] = build_warnings(Scorer("final"))
    assert "'final.weight' → matrices (hidden 2-D matrix (a guess: the model's last matrix" in guessed
    assert build_warnings(Scorer("final"), config={"optimizer": {"routing": {
        "adamw": ["final.*"]}}}) == []


def test_example_inputs_finds_the_output_layer_and_changes_nothing():
    torch.manual_seed(0)
    model = Scorer("final")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    routed = roles(model, example_inputs=torch.randn(4, 8))
    assert routed["final.weight"] == ("others", "produces the model's output (routing.outputs)")
    assert routed["fc2.weight"] == ("matrices", "hidden 2-D matrix")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm's statistics too
    assert all(m.training for m in model.modules())
    model.eval()
    roles(model, example_inputs=(torch.randn(4, 8),))  # positional arguments, in eval mode
    assert not any(m.training for m in model.modules())
    # The names go into the configuration: copies and state dicts keep the routing.
    optimizer = muon_cpp.build_optimizer(Scorer("final"), example_inputs={"x": torch.randn(2, 8)})
    assert "routing.outputs" in optimizer.report_text()
    import copy
    assert "routing.outputs" in copy.deepcopy(optimizer).report_text()


def test_example_inputs_needs_the_model():
    model = Scorer("final")
    with pytest.raises(TypeError, match="example_inputs= traces a model: give the nn.Module "
                                        "itself as params, not generator"):
        muon_cpp.build_optimizer(model.parameters(), example_inputs=torch.randn(2, 8))


def test_common_gpt_naming_routes_as_before_without_a_warning():
    """nanoGPT / HF GPT-2 style (tied head): the hidden matrices to Muon, nothing guessed."""
    routed = roles(TinyGpt())
    assert {name for name, (role, _) in routed.items() if role == "matrices"} == {
        name for name, p in TinyGpt().named_parameters()
        if p.dim() == 2 and name.startswith("blocks.")}
    assert routed["wte.weight"][0] == "others"


# ---- tensors given without names: routed by shape, and warned of ----

def lm_without_head_names():
    """The README's model: an embedding and an output head that only names and types tell."""
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 64))


def hf_groups(model):
    """What HF Trainer's optimizer_cls_and_kwargs passes: decayed and undecayed groups, unnamed."""
    return [{"params": [p for p in model.parameters() if p.dim() == 2], "weight_decay": 0.05},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


BY_SHAPE = ("routing: 3 rank-2 tensors given without names went to Muon by shape alone, and shape "
            "cannot tell an embedding or an output head from a hidden matrix. To route by names "
            "and module types, pass the model itself or model.named_parameters() (HF Trainer's "
            "optimizer_cls_and_kwargs: add \"model\": model to its kwargs); to route by shape "
            "knowingly, pass routing=\"shape\"")


def shape_warnings(build):
    """The warnings about routing by shape that one call of ``build`` gives, with their lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [(str(w.message), w.filename) for w in caught
            if issubclass(w.category, UserWarning) and "by shape alone" in str(w.message)]


@pytest.mark.parametrize("form", ["parameters()", "list", "HF groups"])
def test_matrices_given_without_names_are_warned_of_once_naming_their_count(form):
    model = lm_without_head_names()
    build = {"parameters()": lambda: muon_cpp.build_optimizer(model.parameters()),
             "list": lambda: muon_cpp.HybridOptimizer(list(model.parameters()), lr=0.02),
             "HF groups": lambda: muon_cpp.HybridOptimizer(hf_groups(model), lr=0.02)}[form]
    assert shape_warnings(build) == [(BY_SHAPE, __file__)]  # the caller's line, not ours
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="3 rank-2 tensors given without names"):
            build()


def test_routing_shape_routes_by_shape_knowingly_without_a_warning():
    model = lm_without_head_names()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for params in (model.parameters(), hf_groups(model)):
            report = muon_cpp.build_optimizer(params, routing="shape").report()
            assert [row["role"] for row in report if len(row["shape"]) == 2] == ["matrices"] * 3
        muon_cpp.build_optimizer(model.parameters(), routing={"names": False})
    # Patterns keep the rest routed by shape: the embedding pinned, two matrices still warned of.
    [(pinned, _)] = shape_warnings(lambda: muon_cpp.build_optimizer(
        model.parameters(), routing={"adamw": ["param_groups.0.0"]}))
    assert pinned.startswith("routing: 2 rank-2 tensors given without names went to Muon")


def test_routing_takes_shape_or_the_configuration_section():
    with pytest.raises(ValueError, match="routing must be 'shape' \\(route by rank and dtype "
                                         "alone\\) or a dict of the configuration's routing keys "
                                         "\\(muon, adamw, higher_rank, split_heads, names, "
                                         "outputs\\), got 'names'"):
        muon_cpp.build_optimizer(lm_without_head_names(), routing="names")


def test_no_shape_warning_for_names_rank_1_tensors_or_optimizers_that_do_not_route():
    model = lm_without_head_names()
    assert shape_warnings(lambda: muon_cpp.build_optimizer(model)) == []
    assert shape_warnings(lambda: muon_cpp.build_optimizer(model.named_parameters())) == []
    assert shape_warnings(lambda: muon_cpp.build_optimizer(
        [{"params": list(model.named_parameters())}])) == []
    matrices = [p for p in model.parameters() if p.dim() == 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        muon_cpp.build_optimizer([p for p in model.parameters() if p.dim() == 1])
        muon_cpp.optim.Muon(matrices)  # torch.optim.Muon's drop-in: every tensor is Muon's
        muon_cpp.Muon(matrices)
