"""muon_cpp inside the stacks Python users train with, from PyPI (docs/python.md §Using it with …):
HF transformers' Trainer (optimizers= and optimizer_cls_and_kwargs=), Lightning, accelerate, a
torchtune-style _component_ config, torch.compile'd models and GradScaler. Each run trains a tiny
model built from a config (nothing downloaded), asserts that its loss falls, and where the stack
resumes from its own checkpoint, that the resumed run ends bit for bit where the uninterrupted one
does. CTest registers this file only where the three packages are installed (scripts/pypi_test.sh
installs them; python/CMakeLists.txt asks torch_features.py)."""
import importlib
import os
import warnings

import pytest
import torch

import muon_cpp
from torch_features import has_stacks

pytestmark = pytest.mark.skipif(not has_stacks(),
                                reason="needs software: transformers, lightning and accelerate "
                                       "(not installed; CTest does not run this file then)")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VOCAB = 64


class Tokens(torch.utils.data.Dataset):
    """Counting sequences from random starts (a fixed seed), a causal language model's examples:
    each next token is learnable."""

    def __init__(self, count=16, length=16):
        starts = torch.randint(0, VOCAB, (count, 1), generator=torch.Generator().manual_seed(123))
        self.tokens = (starts + torch.arange(length)) % VOCAB

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def gpt2():
    import transformers
    transformers.set_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                     n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def parameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, different


def falls(losses):
    """The mean of the last quarter of the losses is below that of the first quarter."""
    quarter = max(1, len(losses) // 4)
    return sum(losses[-quarter:]) / quarter < sum(losses[:quarter]) / quarter


# ---- HF transformers: Trainer ----

def hf_run(out_dir, make_trainer_kwargs, resume=None, **arguments):
    from transformers import Trainer, TrainingArguments
    model = gpt2()
    args = TrainingArguments(output_dir=str(out_dir), use_cpu=True, report_to=[],
                             save_strategy="steps", save_steps=4, max_steps=8,
                             per_device_train_batch_size=4, logging_steps=1, seed=42,
                             data_seed=42, disable_tqdm=True, weight_decay=0.05, **arguments)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(32),
                      **make_trainer_kwargs(model))
    trainer.train(resume_from_checkpoint=resume)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, parameters(model), losses


HF_FORMS = {
    # The optimizer built by us, name-aware routing over the model.
    "optimizers": lambda model: {"optimizers": (
        muon_cpp.build_optimizer(model, lr=0.02, adamw_lr=3e-3), None)},
    # The same with 8-bit state: codes and scales through the Trainer's checkpoints.
    "optimizers, int8 state": lambda model: {"optimizers": (
        muon_cpp.build_optimizer(model, lr=0.02, adamw_lr=3e-3, state_dtype="int8"), None)},
    # Built by the Trainer: cls(its decay / no-decay groups, **kwargs).
    "optimizer_cls_and_kwargs": lambda model: {"optimizer_cls_and_kwargs": (
        muon_cpp.HybridOptimizer, {"lr": 0.02, "adamw_lr": 3e-3})},
    # The same, handed the model (the Trainer pops 'model' and passes it instead of its groups).
    "optimizer_cls_and_kwargs(model)": lambda model: {"optimizer_cls_and_kwargs": (
        muon_cpp.HybridOptimizer, {"model": model, "lr": 0.02, "adamw_lr": 3e-3})},
}


@pytest.mark.parametrize("form", HF_FORMS)
def test_hf_trainer_trains_and_resumes_from_its_checkpoint_exactly(tmp_path, form):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, whole, losses = hf_run(tmp_path / "whole", HF_FORMS[form])
    # Only the unnamed groups are routed by shape, and that is said once.
    by_shape = [w for w in caught if "by shape alone" in str(w.message)]
    assert len(by_shape) == (1 if form == "optimizer_cls_and_kwargs" else 0), by_shape
    optimizer = trainer.optimizer.optimizer  # accelerate's wrapper around ours
    assert isinstance(optimizer, muon_cpp.HybridOptimizer)
    assert {g["algorithm"] for g in optimizer.param_groups} == {"muon", "adamw"}
    assert all("initial_lr" in g for g in optimizer.param_groups)  # HF's LambdaLR drove them
    assert len(losses) == 8 and falls(losses), losses
    roles = {r["name"]: r["role"] for r in optimizer.report()}
    states = {r["name"]: r["state"] for r in optimizer.report()}
    if form == "optimizers, int8 state":  # the MLP's 32 × 128 is large enough, 32 × 96 is not
        assert states["transformer.h.0.mlp.c_fc.weight"] == "int8", states
        assert states["transformer.h.0.attn.c_attn.weight"].startswith("float32 (int8 needs")
    if form == "optimizer_cls_and_kwargs":  # HF's two groups, their weight decay kept
        decays = {(r["role"], r["group"], r["weight_decay"]) for r in optimizer.report()}
        assert ("matrices", "param_groups.0", 0.05) in decays and ("others", "param_groups.1", 0.0) in decays
        assert roles["param_groups.0.0"] == "matrices"  # the embedding: shape alone cannot tell
    else:  # routed by names and module types: the embeddings to AdamW
        assert roles["transformer.wte.weight"] == roles["transformer.wpe.weight"] == "others"
        assert roles["transformer.h.0.attn.c_attn.weight"] == "matrices"
    _, resumed, _ = hf_run(tmp_path / "resumed", HF_FORMS[form],
                           resume=str(tmp_path / "whole" / "checkpoint-4"))
    assert_same(resumed, whole)


def test_hf_trainer_steps_inside_backward_as_it_steps_after(tmp_path):
    """muon_cpp.step_in_backward under the Trainer's loop, with its gradient accumulation (every=2)
    and its LR schedule, clipping off (it needs every gradient): the parameters of the ordinary
    run, bit for bit."""
    def form(in_backward):
        def make(model):
            optimizer = muon_cpp.build_optimizer(model, lr=0.02, adamw_lr=3e-3, nonfinite="ignore")
            if in_backward:
                muon_cpp.step_in_backward(optimizer, every=2)
            return {"optimizers": (optimizer, None)}
        return make
    accumulate = dict(gradient_accumulation_steps=2, max_grad_norm=0.0)
    _, ordinary, _ = hf_run(tmp_path / "ordinary", form(False), **accumulate)
    trainer, inside, losses = hf_run(tmp_path / "inside", form(True), **accumulate)
    assert trainer.optimizer.optimizer._in_backward.steps == 8
    assert len(losses) == 8 and falls(losses), losses
    assert_same(inside, ordinary)


# ---- Lightning ----

def lightning_run(out_dir, resume=None):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = gpt2()

        def training_step(self, batch, _):
            loss = self.model(**batch).loss
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            optimizer = muon_cpp.build_optimizer(self.model, lr=0.02, adamw_lr=3e-3)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    module = Module()
    module.losses = []
    # 16 examples of 4: the step-4 checkpoint ends an epoch, where Lightning resumes exactly
    # (mid-epoch it replays the epoch: its DataLoader keeps no position).
    loader = torch.utils.data.DataLoader(Tokens(16), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=8, gradient_clip_val=1.0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(out_dir),
                        callbacks=[ModelCheckpoint(dirpath=str(out_dir), every_n_train_steps=4,
                                                   save_top_k=-1)])
    trainer.fit(module, loader, ckpt_path=resume)
    return trainer, parameters(module), module.losses


def test_lightning_trains_with_scheduler_and_clipping_and_resumes_exactly(tmp_path):
    trainer, whole, losses = lightning_run(tmp_path / "whole")
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, muon_cpp.HybridOptimizer)
    assert trainer.global_step == 8 and falls(losses), losses
    assert {g["lr"] for g in optimizer.param_groups} == {0.02 * 0.25, 3e-3 * 0.25}  # StepLR, twice
    checkpoint = next((tmp_path / "whole").glob("*step=4.ckpt"))
    _, resumed, _ = lightning_run(tmp_path / "resumed", resume=str(checkpoint))
    assert_same(resumed, whole)


def test_lightning_cli_names_the_hybrid_and_its_keywords(tmp_path):
    """LightningCLI reads an optimizer's keywords from its signature: --optimizer.lr and the
    configuration's other keys reach HybridOptimizer(model.parameters(), ...)."""
    import lightning as L
    from lightning.pytorch.cli import LightningCLI

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def training_step(self, batch, _):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def train_dataloader(self):
            generator = torch.Generator().manual_seed(0)
            data = torch.utils.data.TensorDataset(torch.randn(32, 16, generator=generator),
                                                  torch.randn(32, 4, generator=generator))
            return torch.utils.data.DataLoader(data, batch_size=8)

    cli = LightningCLI(Regression, run=False, args=[
        "--optimizer=muon_cpp.HybridOptimizer", "--optimizer.lr=0.03",
        "--optimizer.adamw_lr=0.001", "--optimizer.others=lion", "--trainer.max_steps=4",
        "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp_path}"])
    cli.trainer.fit(cli.model)
    optimizer = cli.trainer.optimizers[0]
    assert isinstance(optimizer, muon_cpp.HybridOptimizer) and cli.trainer.global_step == 4
    assert {(g["algorithm"], g["lr"]) for g in optimizer.param_groups} == {("muon", 0.03),
                                                                           ("lion", 0.001)}
    assert all(float(s["step"]) == 4 for s in optimizer.state.values())


# ---- accelerate ----

def accelerate_run(out_dir, steps, load=None, save_at=None):
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    model = gpt2()
    optimizer = muon_cpp.build_optimizer(model, lr=0.02, adamw_lr=3e-3)
    loader = torch.utils.data.DataLoader(Tokens(32), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if load is not None:
        accelerator.load_state(load)
    batches, losses = list(loader), []
    first = 0 if load is None else save_at
    for step in range(first, steps):
        loss = model(**batches[step]).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step + 1 == save_at and load is None:
            accelerator.save_state(str(out_dir))
    return optimizer, parameters(model), losses


def test_accelerate_prepares_trains_and_resumes_from_save_state_exactly(tmp_path):
    optimizer, whole, losses = accelerate_run(tmp_path / "state", 8, save_at=4)
    assert isinstance(optimizer.optimizer, muon_cpp.HybridOptimizer)
    assert falls(losses), losses
    _, resumed, _ = accelerate_run(None, 8, load=str(tmp_path / "state"), save_at=4)
    assert_same(resumed, whole)


# ---- a torchtune-style config: _component_ and keyword arguments ----

def instantiate(config, *args):
    """torchtune's config.instantiate, in short: the dotted path under _component_, called with
    the positional arguments and the other keys as keywords."""
    config = dict(config)
    module, name = config.pop("_component_").rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(*args, **config)


def test_a_component_config_names_the_hybrid_and_its_keywords():
    model = gpt2()
    optimizer = instantiate({"_component_": "muon_cpp.HybridOptimizer", "lr": 0.02,
                             "adamw_lr": 3e-3, "others": "lion", "grad_clip": 1.0,
                             "routing": "shape"},  # plain tensors, routed by shape knowingly
                            model.parameters())
    assert {(g["algorithm"], g["lr"]) for g in optimizer.param_groups} == {("muon", 0.02),
                                                                           ("lion", 3e-3)}
    data = Tokens(16)
    losses = []
    for step in range(12):
        batch = data[step % 4]
        loss = model(input_ids=batch["input_ids"][None], labels=batch["labels"][None]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert falls(losses), losses
    assert optimizer.last_step["clip_factor"] <= 1.0


# ---- torch.compile and GradScaler ----

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def regression(steps, model, optimizer, step_with=None, autocast=False):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=generator)
    y = torch.randn(64, 4, generator=generator)
    losses = []
    for _ in range(steps):
        # The forward alone under autocast, each step: inside one region autocast keeps its
        # bf16 copies of the weights, which a step does not reach.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = (model(x) - y).float().square().mean()
        (step_with or (lambda loss: (loss.backward(), optimizer.step())))(loss)
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_compiled_model_trains_as_the_eager_one():
    eager = mlp()
    compiled_module = mlp()
    compiled = torch.compile(compiled_module)  # inductor, the default
    eager_losses = regression(10, eager, muon_cpp.build_optimizer(eager, lr=0.02))
    compiled_losses = regression(10, compiled, muon_cpp.build_optimizer(compiled_module, lr=0.02))
    assert falls(compiled_losses), compiled_losses
    for a, b in zip(compiled_module.parameters(), eager.parameters()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


def test_a_compiled_model_steps_inside_backward_as_after():
    compiled_modules = [mlp(), mlp()]
    optimizers = [muon_cpp.build_optimizer(m, lr=0.02, nonfinite="ignore") for m in compiled_modules]
    muon_cpp.step_in_backward(optimizers[1])
    losses = [regression(10, torch.compile(m), o) for m, o in zip(compiled_modules, optimizers)]
    assert falls(losses[1]) and losses[0] == losses[1]
    assert all(torch.equal(a, b) for a, b in zip(*(m.parameters() for m in compiled_modules)))


def test_grad_scaler_steps_finite_gradients_and_skips_the_rest():
    model = mlp()
    optimizer = muon_cpp.build_optimizer(model, lr=0.02, adamw_lr=3e-3)
    scaler = torch.amp.GradScaler("cpu")

    def scaled(loss):
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    losses = regression(12, model, optimizer, scaled, autocast=True)
    assert falls(losses), losses
    before = parameters(model)
    scale = scaler.get_scale()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(2, 16)).float().sum()
    scaler.scale(loss).backward()
    next(model.parameters()).grad[0, 0] = float("inf")
    scaler.step(optimizer)  # skipped: the optimizer's step is not called
    scaler.update()
    assert scaler.get_scale() == scale / 2
    assert_same(parameters(model), before)


# ---- Routing of HF models by their structure ----

def test_hf_models_route_by_structure_without_a_warning():
    """GPT-2 (tied head; Conv1D matrices inside transformer.h.N), and a classifier whose `score`
    head example_inputs= finds: every hidden matrix to Muon, nothing left to a name or a guess."""
    import transformers
    model = gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = muon_cpp.build_optimizer(model).report()
    roles = {row["name"]: row["role"] for row in report}
    assert "lm_head.weight" not in roles  # tied to transformer.wte.weight: routed once, as it
    assert roles["transformer.wte.weight"] == roles["transformer.wpe.weight"] == "others"
    assert {name for name, role in roles.items() if role == "matrices"} == {
        name for name, p in model.named_parameters() if p.dim() == 2 and ".h." in name}
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB,
                                     n_positions=32, num_labels=3, pad_token_id=0)
    classifier = transformers.GPT2ForSequenceClassification(config)
    with pytest.warns(UserWarning, match="'score.weight' → others \\(name part 'score'"):
        muon_cpp.build_optimizer(classifier)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced = muon_cpp.build_optimizer(
            classifier, example_inputs={"input_ids": torch.arange(8).reshape(2, 4) + 1})
    reasons = {row["name"]: row["reason"] for row in traced.report()}
    assert reasons["score.weight"] == "produces the model's output (routing.outputs)"
