"""HybridOptimizer / build_optimizer on nn.Modules: routing (docs/design.md §Routing), configs,
schedules, QK-clip."""
import pathlib

import pytest
import torch

import muon_cpp
from helpers import NoAttention, TinyGpt, batches, train, weights

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_routing_of_a_gpt_with_tied_weights_and_a_frozen_table():
    torch.manual_seed(0)
    model = TinyGpt(layers=2)
    optimizer = muon_cpp.build_optimizer(model, "optimizer: muon\n", total_steps=10)
    rows = {row["name"]: row for row in optimizer.report()}
    # The tied head appears once, under the embedding's name; frozen tensors are reported.
    assert "lm_head.weight" not in rows
    assert rows["wte.weight"]["role"] == "others"
    assert "embedding" in rows["wte.weight"]["reason"]
    assert rows["pos"]["role"] == "frozen" and rows["pos"]["group"] is None
    for layer in range(2):
        for matrix in ("q_proj", "k_proj", "up_proj", "down_proj"):
            row = rows[f"blocks.{layer}.{matrix}.weight"]
            assert row["role"] == "matrices" and row["shape"] == tuple(
                model.blocks[layer].get_submodule(matrix).weight.shape)
            assert row["dtype"] == torch.float32 and row["lr"] == 0.02
        assert rows[f"blocks.{layer}.norm.weight"]["role"] == "others"
        assert rows[f"blocks.{layer}.up_proj.bias"]["role"] == "others"
    muon_count = sum(row["role"] == "matrices" for row in rows.values())
    assert muon_count == 8
    # param_groups hold every trainable tensor once, the frozen one nowhere.
    listed = [p for g in optimizer.param_groups for p in g["params"]]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(listed) == len(trainable) == len({id(p) for p in listed})
    assert all(any(p is q for q in listed) for p in trainable)
    assert {g["algorithm"] for g in optimizer.param_groups} == {"muon", "adamw"}
    for group in optimizer.param_groups:
        if group["algorithm"] == "muon":
            assert all(rows_for(rows, p, model)["role"] == "matrices" for p in group["params"])
    text = optimizer.report_text()
    assert "blocks.1.down_proj.weight" in text and "hidden 2-D matrix" in text


class Positional(torch.nn.Module):
    """A positional table as a bare parameter (T, D), a hidden layer and an output layer `out`."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.zeros(16, 8))
        self.hidden = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 3)


def test_routing_sends_output_layers_and_positional_tables_to_adamw():
    def roles(model):
        return {row["name"]: (row["role"], row["reason"])
                for row in muon_cpp.build_optimizer(model, None, 10).report()}

    sequential = roles(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                           torch.nn.Linear(16, 4)))
    assert sequential["0.weight"] == ("matrices", "hidden 2-D matrix")
    assert sequential["2.weight"] == ("others", "the last layer of a sequential model "
                                               "(it produces the output)")
    positional = roles(Positional())
    assert positional["pos"] == ("others", "name part 'pos' marks an input/output layer")
    assert positional["out.weight"] == ("others", "name part 'out' marks an input/output layer")
    assert positional["hidden.weight"][0] == "matrices"


def rows_for(rows, tensor, model):
    name = next(n for n, p in model.named_parameters() if p is tensor)
    return rows[name]


def test_named_parameters_and_config_forms_agree(tmp_path):
    torch.manual_seed(1)
    model = TinyGpt()
    text = "optimizer:\n  name: muon\n  lr: 0.03\n  adamw_lr: 0.002\n"
    path = tmp_path / "optim.yaml"
    path.write_text(text)
    from_text = muon_cpp.build_optimizer(model, text, 10)
    from_path = muon_cpp.build_optimizer(model, str(path), 10)
    from_pathlib = muon_cpp.build_optimizer(model, path, 10)
    from_dict = muon_cpp.build_optimizer(
        model, {"optimizer": {"name": "muon", "lr": 0.03, "adamw_lr": 0.002}}, 10)
    lrs = [[g["lr"] for g in opt.param_groups]
           for opt in (from_text, from_path, from_pathlib, from_dict)]
    assert lrs[0] == lrs[1] == lrs[2] == lrs[3]
    assert sorted(set(lrs[0])) == [0.002, 0.03]
    # Bare (name, tensor) pairs have no module types: the embedding is found by its name part.
    pairs = muon_cpp.build_optimizer(list(model.named_parameters()), text, 10)
    assert {r["name"]: r["role"] for r in pairs.report()}["wte.weight"] == "others"


def test_others_run_the_partitions_algorithm_lion_as_muon_cpp_lion_does():
    torch.manual_seed(3)
    model = TinyGpt()
    config = {"optimizer": {"matrices": "muon", "others": "lion", "adamw_lr": 3e-3,
                            "weight_decay": 0.0, "lion": {"betas": [0.9, 0.95]}}}
    optimizer = muon_cpp.build_optimizer(model, config, 10)
    rows = optimizer.report()
    others = [p for p in model.parameters()
              if p.requires_grad and rows_for({r["name"]: r for r in rows}, p, model)["role"]
              == "others"]
    assert {r["algorithm"] for r in rows if r["role"] == "others"} == {"lion"}
    assert {g["algorithm"] for g in optimizer.param_groups} == {"muon", "lion"}
    assert "lion" in optimizer.report_text()
    copies = [p.detach().clone().requires_grad_(True) for p in others]
    reference = muon_cpp.Lion(copies, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        for p, c in zip(others, copies):
            c.grad = p.grad.clone()
        optimizer.step()
        reference.step()
    for p, c in zip(others, copies):
        assert torch.equal(p.detach(), c.detach())
    # Its state dict resumes: a fresh optimizer on a copy of the model continues the same steps.
    twin = TinyGpt()
    twin.load_state_dict(model.state_dict())
    resumed = muon_cpp.build_optimizer(twin, config, 10)
    resumed.load_state_dict(optimizer.state_dict())
    assert {name for state in resumed.state.values() for name in state} >= {"exp_avg"}
    for p, q in zip(model.parameters(), twin.parameters()):
        p.grad = torch.randn(p.shape, generator=generator)
        q.grad = p.grad.clone()
    optimizer.step()
    resumed.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_examples_build():
    model = TinyGpt()
    for name in ("muon.yaml", "speedtronic.yaml", "dew.yaml", "flaxchat.yaml", "muoneq.yaml",
                 "dion.yaml", "dion_full.yaml", "adamw.yaml", "muon_lion.yaml"):
        optimizer = muon_cpp.build_optimizer(model, EXAMPLES / name, 1000)
        optimizer.set_qk_clip_source(NoAttention())  # dew's QK-clip: TinyGpt has no heads
        train(model, optimizer, batches(2))
        assert optimizer.step_count == 2


def test_torch_scheduler_drives_every_group():
    torch.manual_seed(2)
    model = TinyGpt()
    optimizer = muon_cpp.build_optimizer(model, "optimizer: {name: muon, weight_decay: 0.1}", 10)
    peaks = [g["lr"] for g in optimizer.param_groups]
    factor = {"value": 0.0}
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor["value"])
    assert all(g["lr"] == 0.0 for g in optimizer.param_groups)
    before = weights(model)
    train(model, optimizer, batches(2))  # every rate 0: nothing moves, decay included
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model)))
    factor["value"] = 0.5
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.5 * p for p in peaks]
    train(model, optimizer, batches(1))
    trainable = [p.requires_grad for p in model.parameters()]
    changed = [not torch.equal(a, b) for a, b in zip(before, weights(model))]
    assert changed == trainable  # every trainable tensor moved, the frozen one did not


def test_configured_schedule_sets_lr_each_step():
    model = TinyGpt()
    config = ("optimizer: {name: muon, lr: 0.02, adamw_lr: 0.004,\n"
              "  schedule: {name: linear, warmup_steps: 4}}\n")
    optimizer = muon_cpp.build_optimizer(model, config, total_steps=8)
    muon_group = next(g for g in optimizer.param_groups if g["algorithm"] == "muon")
    rates = []
    for tokens in batches(4):
        train(model, optimizer, [tokens])
        rates.append(muon_group["lr"])  # the rate of the step just taken, written back
    assert rates == sorted(rates) and len(set(rates)) == 4 and rates[-1] <= 0.02


def test_a_torch_scheduler_beside_a_configured_schedule_is_refused_before_anything_moves():
    # A config schedule sets lr at every step; a torch scheduler writing lr too would be
    # overridden in silence (param_groups showing 0 while the weights still moved).
    model = TinyGpt()
    config = "optimizer: {name: muon, schedule: {name: linear, warmup_steps: 4}}\n"
    optimizer = muon_cpp.build_optimizer(model, config, total_steps=8)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0)
    before = weights(model)
    with pytest.raises(RuntimeError, match=r"lr was changed to 0 outside the optimizer \(a torch "
                                           r"lr scheduler, set_lr, param_groups\?\), but the "
                                           r"schedule of its configuration sets it at every step"):
        train(model, optimizer, batches(1))
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model)))


def test_a_cnn_that_gives_muon_nothing_is_told_and_qk_clip_without_logits_is_refused(capfd):
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
    muon_cpp.build_optimizer(cnn, "optimizer: muon", 10)
    assert ("muon: warning: no parameter is routed to Muon; every trainable one goes to adamw "
            "(0.weight [8, 3, 3, 3] and any other tensor of rank > 2 under routing higher_rank "
            "'adamw'; higher_rank 'flatten' trains each as an (out, rest) matrix)"
            in capfd.readouterr().err)
    flattened = muon_cpp.build_optimizer(
        cnn, "optimizer: {name: muon, routing: {higher_rank: flatten}}", 10)
    assert "warning" not in capfd.readouterr().err
    assert {g["algorithm"] for g in flattened.param_groups} == {"muon", "adamw"}

    model = TinyGpt()
    optimizer = muon_cpp.build_optimizer(model, "optimizer: muonclip", 10)
    before = weights(model)
    with pytest.raises(RuntimeError, match=r"QK-clip \(tau 100\) needs the model's attention "
                                           r"logits: call set_qk_clip_source\(model\)"):
        train(model, optimizer, batches(1))
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model)))


def test_qk_clip_from_a_python_source():
    torch.manual_seed(3)
    config = "optimizer: {name: muonclip, qk_clip: {tau: 10.0}}\n"
    plain_model, clipped_model = TinyGpt(layers=1), TinyGpt(layers=1)
    clipped_model.load_state_dict(plain_model.state_dict())
    plain = muon_cpp.build_optimizer(plain_model, "optimizer: muon\n", 10)
    clipped = muon_cpp.build_optimizer(clipped_model, config, 10)

    class Source:
        def qk_clip_targets(self):
            block = clipped_model.blocks[0]
            return [dict(layer="blocks.0", q_weight=block.q_proj.weight,
                         k_weight=block.k_proj.weight, n_heads=2, n_kv_heads=2, head_dim=6)]

        def qk_max_logits(self):
            return {"blocks.0": torch.tensor([40.0, 5.0])}  # head 0 over tau

    clipped.set_qk_clip_source(Source())
    data = batches(1)
    train(plain_model, plain, data)
    train(clipped_model, clipped, data)
    gamma = 10.0 / (40.0 + 1e-6)
    for name in ("q_proj", "k_proj"):
        ours = clipped_model.blocks[0].get_submodule(name).weight.detach()
        unclipped = plain_model.blocks[0].get_submodule(name).weight.detach()
        assert torch.allclose(ours[:6], unclipped[:6] * gamma ** 0.5, rtol=1e-6, atol=1e-7)
        assert torch.equal(ours[6:], unclipped[6:])
    assert clipped.last_step["qk_clip"] == [
        {"layer": "blocks.0", "head": 0, "factor": pytest.approx(gamma ** 0.5)}]
    with pytest.raises(TypeError, match="qk_clip_targets"):
        clipped.set_qk_clip_source(object())


def test_clipping_and_nonfinite_skip_reported():
    model = TinyGpt()
    optimizer = muon_cpp.build_optimizer(model, "optimizer: {name: muon, grad_clip: 0.01}", 10)
    train(model, optimizer, batches(1))
    stats = optimizer.last_step
    assert stats["grad_norm"] > 0.01
    assert stats["clip_factor"] == pytest.approx(0.01 / stats["grad_norm"], rel=1e-5)
    before = weights(model)
    state_before = {k: v.clone() for k, v in optimizer.state[model.wte.weight].items()}
    optimizer.zero_grad()
    model.loss(batches(1)[0]).backward()
    model.wte.weight.grad[0, 0] = float("nan")
    optimizer.step()
    assert optimizer.last_step["skipped"] and optimizer.last_step["skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model)))
    for key, value in optimizer.state[model.wte.weight].items():
        assert torch.equal(value, state_before[key])


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(6, 12)
        self.norm = torch.nn.LayerNorm(12)
        self.down = torch.nn.Linear(12, 4)


def hf_groups(model, weight_decay):
    """HF Trainer's two groups: decayed (weights), not decayed (biases and norm weights)."""
    decay = [model.up.weight, model.down.weight]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if all(p is not q for q in decay)],
             "weight_decay": 0.0}]


def test_plain_tensors_and_param_groups_are_routed_by_shape_keeping_each_groups_settings():
    """HybridOptimizer(groups, **keywords), as HF Trainer's optimizer_cls_and_kwargs calls it:
    within each group rank-2 matrices go to Muon, the rest to AdamW, with the group's weight
    decay — the same steps as muon_cpp.Muon and muon_cpp.AdamW over those tensors."""
    torch.manual_seed(0)
    model = Mlp()
    optimizer = muon_cpp.HybridOptimizer(hf_groups(model, 0.1), lr=0.03, adamw_lr=2e-3)
    rows = {row["name"]: row for row in optimizer.report()}
    assert rows["param_groups.0.0"]["role"] == rows["param_groups.0.1"]["role"] == "matrices"
    assert rows["param_groups.0.1"]["reason"] == "2-D matrix (routed by shape: given without a name)"
    assert rows["param_groups.0.0"]["weight_decay"] == 0.1 and rows["param_groups.0.0"]["lr"] == 0.03
    assert all(rows[f"param_groups.1.{i}"]["role"] == "others" for i in range(4))
    assert all(rows[f"param_groups.1.{i}"]["weight_decay"] == 0.0 for i in range(4))
    assert {row["group"] for row in rows.values()} == {"param_groups.0", "param_groups.1"}
    twin = Mlp()
    twin.load_state_dict(model.state_dict())
    muon = muon_cpp.Muon([twin.up.weight, twin.down.weight], lr=0.03, weight_decay=0.1)
    adamw = muon_cpp.AdamW([p for n, p in twin.named_parameters() if "weight" not in n
                            or n == "norm.weight"], lr=2e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p, q in zip(model.parameters(), twin.parameters()):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        optimizer.step()
        muon.step()
        adamw.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-7), name
    # Plain tensors: one group, the same split.
    plain = muon_cpp.build_optimizer(Mlp().parameters())
    assert [r["role"] for r in plain.report()] == ["matrices", "others", "others", "others", "matrices",
                                                   "others"]
    # Named tensors in groups keep their names, and routing reads them.
    named = muon_cpp.HybridOptimizer([{"params": list(Mlp().named_parameters()),
                                       "weight_decay": 0.05}])
    assert {r["name"]: r["role"] for r in named.report()}["down.weight"] == "matrices"


def test_keywords_are_the_configurations_optimizer_keys():
    """Every key the C++ reader takes in the optimizer section is a keyword of HybridOptimizer
    (so config-driven builders — HF, Lightning CLI, _component_ dicts — can name them), each
    merged into the configuration; one given both ways, an unknown one and a group's foreign key
    are errors naming it."""
    import inspect
    with pytest.raises(ValueError, match="valid keys: ") as error:
        muon_cpp.build_optimizer(Mlp(), {"optimizer": {"no_such_key": 1}})
    valid = set(str(error.value).split("valid keys: ")[1].split(", "))
    # The reader's list: what it names in that error, and the sections of the others' algorithms
    # (taken when `others` names one).
    others = {name for name, matrices in muon_cpp._core.algorithms() if not matrices}
    keywords = set(muon_cpp._core.optimizer_keys())
    assert keywords == valid | others and {"ns_steps", "qk_clip", "lion"} <= keywords
    signature = inspect.signature(muon_cpp.HybridOptimizer)
    assert keywords <= set(signature.parameters)
    optimizer = muon_cpp.HybridOptimizer(Mlp(), {"optimizer": {"adamw_lr": 1e-3}}, lr=0.05,
                                         others="lion", grad_clip=1.0)
    assert {(g["algorithm"], g["lr"]) for g in optimizer.param_groups} == {("muon", 0.05),
                                                                           ("lion", 1e-3)}
    with pytest.raises(ValueError, match="optimizer.adamw_lr: set both by the configuration and "
                                         "by a keyword argument; give it once"):
        muon_cpp.HybridOptimizer(Mlp(), {"optimizer": {"adamw_lr": 1e-3}}, adamw_lr=2e-3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lrr'; its keywords are the "
                                        "configuration's optimizer keys: adam, adamw, adamw_lr"):
        muon_cpp.HybridOptimizer(Mlp(), lrr=0.1)
    with pytest.raises(ValueError, match="param group 1 has 'momentum_buffer', which "
                                         "HybridOptimizer's groups do not take; they take "
                                         "lr_multiplier, lr, weight_decay"):
        muon_cpp.HybridOptimizer([{"params": [Mlp().up.weight]},
                                  {"params": [Mlp().up.bias], "momentum_buffer": 1}])
    with pytest.raises(ValueError, match="total_steps must be > 0 \\(the run's length, which the "
                                         "configuration's schedules need: pass the number of "
                                         "steps the run takes\\), got 0"):
        muon_cpp.HybridOptimizer(Mlp(), schedule={"name": "cosine"})
    with pytest.raises(ValueError, match="HybridOptimizer got an empty parameter list"):
        muon_cpp.HybridOptimizer([])
    shared = Mlp().up.weight
    with pytest.raises(ValueError, match="parameter 0 of param group 1 is also parameter 0 of "
                                         "param group 0; a parameter belongs to one group"):
        muon_cpp.HybridOptimizer([{"params": [shared]}, {"params": [shared]}])


def test_param_groups_changes_reach_the_hybrid_and_its_report():
    """A tensor swapped into a group takes the place (name, routing) of the one it replaces; one
    appended is trained by its group's algorithm; one removed is forgotten; the group count is
    the configuration's."""
    torch.manual_seed(0)
    model = Mlp()
    optimizer = muon_cpp.build_optimizer(model)
    number, muon_group = next((i, g) for i, g in enumerate(optimizer.param_groups)
                              if g["algorithm"] == "muon")
    appended_name = f"param_groups.{number}.{len(muon_group['params'])}"
    old = model.up.weight
    model.up.weight = torch.nn.Parameter(old.detach().clone())
    muon_group["params"] = [model.up.weight if p is old else p for p in muon_group["params"]]
    appended = torch.nn.Parameter(torch.randn(5, 7))
    muon_group["params"].append(appended)
    for p in list(model.parameters()) + [appended]:
        p.grad = torch.ones_like(p)
    optimizer.step()
    rows = {row["name"]: row for row in optimizer.report()}
    assert rows["up.weight"]["role"] == "matrices" and rows["up.weight"]["shape"] == (12, 6)
    assert rows[appended_name]["reason"] == "put into param_groups after construction"
    assert rows[appended_name]["algorithm"] == "muon" and rows[appended_name]["group"] == "default"
    assert float(optimizer.state[appended]["step"]) == 1
    muon_group["params"] = [p for p in muon_group["params"] if p is not appended]
    optimizer.step()
    assert appended_name not in {row["name"] for row in optimizer.report()}
    made = len(optimizer.param_groups)
    optimizer.param_groups.append({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(RuntimeError, match=f"param_groups has {made + 1} groups, "
                                           "the configuration made " f"{made}"):
        optimizer.step()
