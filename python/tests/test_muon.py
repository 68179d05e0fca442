"""muon_cpp.Muon and orthogonalize against docs/design.md §Newton–Schulz orthogonalization and
§Muon update, written out in Python."""
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch

import muon_cpp
import needs
from helpers import ReferenceMuon, max_rel_diff, reference_newton_schulz


def gradients(shape, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(steps)]


@pytest.mark.parametrize("shape", [(24, 10), (10, 24), (16, 16)])
@pytest.mark.parametrize("settings", [
    dict(),
    dict(momentum=0.9, nesterov=False, weight_decay=0.1),
    dict(momentum_form="sum", adjust_lr="match_rms_adamw", weight_decay=0.05),
    dict(adjust_lr="spectral"),
    dict(adjust_lr="none", nesterov=False, momentum_form="sum"),
])
def test_muon_equals_reference(shape, settings):
    torch.manual_seed(1)
    ours = torch.nn.Parameter(torch.randn(shape, dtype=torch.float64))
    theirs = torch.nn.Parameter(ours.detach().clone())
    optimizer = muon_cpp.Muon([ours], lr=0.03, **settings)
    reference = ReferenceMuon(0.03, **settings)
    for grad in gradients(shape, 6, seed=2):
        before = theirs.detach().clone()
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step([theirs])
        # float64 throughout: the two may differ only by summation order.
        assert max_rel_diff(ours.detach() - before, theirs.detach() - before) < 1e-10


def test_muon_state_and_groups_are_torch_shaped():
    w = torch.nn.Parameter(torch.randn(8, 4))
    optimizer = muon_cpp.Muon([w], lr=0.01, normuon=dict(beta2=0.9))
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups[0]["normuon"] == dict(beta2=0.9)
    assert optimizer.state == {}
    w.grad = torch.randn(8, 4)
    optimizer.step()
    assert w in optimizer.state and len(optimizer.state) == 1
    assert torch.zeros(8, 4) not in optimizer.state  # another tensor has no state here
    state = optimizer.state[w]
    assert set(state) == {"step", "momentum_buffer", "normuon_second_moment"}
    assert state["step"].item() == 1.0
    assert state["momentum_buffer"].shape == (8, 4)
    assert state["normuon_second_moment"].shape == (8, 1)  # per row: rows ≥ cols
    # The state tensors are the optimizer's own buffers.
    assert torch.equal(state["momentum_buffer"], 0.05 * w.grad)


def test_momentum_set_between_steps_is_used():
    shape = (6, 9)
    ours = torch.nn.Parameter(torch.randn(shape, dtype=torch.float64))
    theirs = torch.nn.Parameter(ours.detach().clone())
    optimizer = muon_cpp.Muon([ours], lr=0.02)
    reference = ReferenceMuon(0.02)
    for k, grad in enumerate(gradients(shape, 4, seed=5)):
        optimizer.param_groups[0]["momentum"] = reference.beta = 0.8 + 0.05 * k
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step([theirs])
    assert max_rel_diff(ours.detach(), theirs.detach()) < 1e-12


def test_expert_stack_is_orthogonalized_matrix_by_matrix():
    torch.manual_seed(3)
    stack = torch.nn.Parameter(torch.randn(3, 6, 4, dtype=torch.float64))
    singles = [torch.nn.Parameter(stack.detach()[e].clone()) for e in range(3)]
    stacked_opt = muon_cpp.Muon([stack], lr=0.02)
    single_opt = muon_cpp.Muon(singles, lr=0.02)
    grad = torch.randn(3, 6, 4, dtype=torch.float64)
    stack.grad = grad
    for e, p in enumerate(singles):
        p.grad = grad[e].clone()
    stacked_opt.step()
    single_opt.step()
    for e, p in enumerate(singles):
        assert max_rel_diff(stack.detach()[e], p.detach()) < 1e-12


@pytest.mark.parametrize("method", ["plain", "symmetric", "gram", "automatic"])
def test_orthogonalize_matches_reference_and_leaves_input(method):
    torch.manual_seed(4)
    x = torch.randn(20, 48, dtype=torch.float64)
    copy = x.clone()
    ours = muon_cpp.orthogonalize(x, "quintic", 5, method=method)
    assert torch.equal(x, copy)
    assert ours.dtype == torch.float64 and ours.shape == x.shape
    assert max_rel_diff(ours, reference_newton_schulz(x)) < 1e-9
    singular_values = torch.linalg.svdvals(ours)
    assert singular_values.min() > 0.6 and singular_values.max() < 1.25
    gram = ours @ ours.T  # 20 × 20: the smaller side
    expected = (gram - torch.eye(20, dtype=gram.dtype)).norm().item() / 20 ** 0.5
    assert muon_cpp.orthogonality_error(ours) == pytest.approx(expected, rel=1e-9)



def test_fp32_products_leave_blis_only_for_an_sgemm_safe_beside_this_torch():
    """fp32 products run on LibTorch's MKL sgemm where this torch's BLAS is MKL, on an Intel
    AVX-512 CPU, unless this torch runs on the oneDNN muon_cpp links (then on its sgemm): PyPI's
    x86-64 wheels link MKL into libtorch_cpu and export its sgemm (a torch whose MKL is a separate
    library would fail the first assertion: muon_cpp takes MKL only from LibTorch's own library),
    and their own oneDNN would break the linked one's. Their row blocks, on 1 to 3 threads, are
    as accurate as the plain fp32 chain."""
    backend = muon_cpp._core.blas_backend()
    cpuinfo = Path("/proc/cpuinfo").read_text() if sys.platform == "linux" else ""
    intel_avx512 = "GenuineIntel" in cpuinfo and all(
        re.search(r"\b%s\b" % flag, cpuinfo) for flag in ("avx512f", "avx512dq", "avx512bw", "avx512vl"))
    on_onednn = "sgemm (LibTorch's oneDNN too) instead" in backend
    on_mkl = "; fp32 products on LibTorch's MKL " in backend
    assert on_mkl == (torch.backends.mkl.is_available() and intel_avx512 and not on_onednn), backend
    torch.manual_seed(8)
    threads = torch.get_num_threads()
    try:
        for shape in [(610, 803), (803, 610)]:  # five 128-row blocks with ragged edges
            x = torch.randn(shape, dtype=torch.float64)
            truth = reference_newton_schulz(x)
            plain = max_rel_diff(muon_cpp.orthogonalize(x.float(), method="plain"), truth)
            for count in (1, 2, 3):
                torch.set_num_threads(count)
                for method in ("symmetric", "gram"):
                    ours = muon_cpp.orthogonalize(x.float(), method=method)
                    error = max_rel_diff(ours, truth)
                    assert error <= 3 * plain + 2e-5, (shape, count, method, error, plain, backend)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["plain", "symmetric", "gram", "automatic"])
def test_bf16_newton_schulz_on_the_cpu_runs_beside_this_torch(method):
    """CPU bf16 runs its products on the oneDNN muon_cpp links, beside whatever oneDNN this torch
    carries (PyPI's wheels hold their own), and Gram's whole products on this torch's GEMM where
    its oneDNN is the newer: within bf16's precision of the fp64 iteration on square, wide, tall
    and block-straddling shapes — or, on a CPU without bf16 dot products, their emulation."""
    on_torch = muon_cpp._core.bf16_products().startswith("whole bf16 products on LibTorch's")
    torch.manual_seed(6)
    for shape in [(192, 192), (96, 288), (288, 96), (136, 200), (200, 136)]:
        x = torch.randn(shape)
        ours = muon_cpp.orthogonalize(x, dtype=torch.bfloat16, method=method)
        reference = reference_newton_schulz(x.double())
        distance = ((ours.double() - reference).norm() / reference.norm()).item()
        # bf16 operands: 1.6e-2 to 3.0e-2 measured (gram on square inputs the most); fp32 gives
        # 1e-6, so the lower bound shows the products did run in bf16.
        assert ours.dtype == torch.float32 and ours.shape == x.shape
        assert 1e-3 < distance < 4e-2, (shape, distance)
        if method == "gram" and on_torch:  # its result is torch's bf16 product, widened
            assert torch.equal(ours, ours.bfloat16().float())

def release(pattern, text):
    match = re.search(pattern + r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(map(int, match.groups())) if match else (0, 0, 0)


def test_bf16_gram_runs_on_this_torchs_gemm_where_its_onednn_is_newer():
    """Gram's whole bf16 products run on this torch's GEMM exactly where its oneDNN (as
    torch.__config__ names it) is a newer release than the one muon_cpp links and the user left it
    on; a batch of long matrices, iterated in lanes on two threads, then comes back as bf16 values
    as close to the fp64 iteration as on the linked oneDNN."""
    needs.bf16_products()
    described = muon_cpp._core.bf16_products()
    linked = release(r"linked oneDNN ", described)
    assert linked > (0, 0, 0), described
    newer = release(r"MKL-DNN v", torch.__config__.show()) > linked
    assert described.startswith("whole bf16 products on LibTorch's") == newer, described
    enabled, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, False
    try:
        off = muon_cpp._core.bf16_products()
    finally:
        torch.backends.mkldnn.enabled = enabled
    assert off.startswith("every bf16 product on the linked"), off
    assert off.endswith("(LibTorch's oneDNN is turned off)") == newer, off
    torch.manual_seed(7)
    x = torch.randn(4, 96, 400)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ours = muon_cpp.orthogonalize(x, dtype=torch.bfloat16, method="gram")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(ours, ours.bfloat16().float()) == newer
    for i in range(4):
        reference = reference_newton_schulz(x[i].double())
        assert (ours[i].double() - reference).norm() / reference.norm() < 4e-2


def test_orthogonalize_tables_and_batches():
    torch.manual_seed(5)
    x = torch.randn(2, 3, 16, 8)
    for table in ["quintic", "polar_express", "dion", [[3.4445, -4.7750, 2.0315]]]:
        out = muon_cpp.orthogonalize(x, table, 5)
        assert out.shape == x.shape and torch.isfinite(out).all()
    # The quintic's rows as a custom table: the same polynomial; 'gram' (16×8 matrices) restarts
    # every 2 iterations for custom tables and after 3 for the quintic, so equal once told so.
    custom = muon_cpp.orthogonalize(x, [[3.4445, -4.7750, 2.0315]], 5, gram_restarts=[3])
    assert torch.equal(custom, muon_cpp.orthogonalize(x, "quintic", 5))
    assert not torch.equal(muon_cpp.orthogonalize(x, [[3.4445, -4.7750, 2.0315]], 5), custom)
    # Each matrix of the batch alone gives the same result.
    alone = muon_cpp.orthogonalize(x[1, 2], "quintic", 5)
    assert torch.allclose(custom[1, 2], alone, atol=1e-6)


def test_orthogonalize_errors():
    with pytest.raises(ValueError, match="polar_express"):
        muon_cpp.orthogonalize(torch.randn(4, 4), "nonsense", 5)
    with pytest.raises(ValueError, match="at least 2 dims"):
        muon_cpp.orthogonalize(torch.randn(4), "quintic", 5)
    with pytest.raises(ValueError, match="steps"):
        muon_cpp.orthogonalize(torch.randn(4, 4), "quintic", 0)
    with pytest.raises(TypeError, match="steps must be an int"):
        muon_cpp.orthogonalize(torch.randn(4, 4), "quintic", 2.5)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        muon_cpp.orthogonalize([[1.0, 2.0]])
    with pytest.raises(ValueError, match="valid methods are automatic, plain, symmetric, gram"):
        muon_cpp.orthogonalize(torch.randn(4, 4), method="fast")
    with pytest.raises(TypeError, match="gram_restarts must be a list or tuple of ints, got int"):
        muon_cpp.orthogonalize(torch.randn(4, 8), gram_restarts=2)
    with pytest.raises(TypeError, match="gram_restarts entry must be an int, got float"):
        muon_cpp.orthogonalize(torch.randn(4, 8), gram_restarts=[2.0])
    with pytest.raises(ValueError, match=r"strictly increasing iteration counts >= 1, got \[3, 2\]"):
        muon_cpp.orthogonalize(torch.randn(4, 8), gram_restarts=(3, 2))


def test_split_sizes_and_num_heads_orthogonalize_blocks_alone():
    """A fused QKV weight with split_sizes (and heads with num_heads) steps as its blocks would
    as parameters of their own, from the Muon class and from a configuration's group."""
    generator = torch.Generator().manual_seed(4)
    start = torch.randn(16, 8, generator=generator, dtype=torch.float64)
    grads = [torch.randn(16, 8, generator=generator, dtype=torch.float64) for _ in range(3)]
    for settings, blocks in [(dict(split_sizes=[8, 4, 4]), [8, 4, 4]),
                             (dict(num_heads=4), [4, 4, 4, 4])]:
        fused = torch.nn.Parameter(start.clone())
        parts = [torch.nn.Parameter(p.clone()) for p in start.split(blocks)]
        ours = muon_cpp.Muon([fused], lr=0.02, **settings)
        separate = muon_cpp.Muon(parts, lr=0.02)
        for grad in grads:
            fused.grad = grad.clone()
            for part, g in zip(parts, grad.split(blocks)):
                part.grad = g.clone()
            ours.step()
            separate.step()
        assert max_rel_diff(fused.detach() - start, torch.cat([p.detach() for p in parts])
                            - start) < 1e-12
        assert ours.param_groups[0][next(iter(settings))] == next(iter(settings.values()))

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(8, 16, bias=False)
            self.proj = torch.nn.Linear(8, 8, bias=False)

    model = Attention().double()
    with torch.no_grad():
        model.qkv.weight.copy_(start)
    config = {"optimizer": {"name": "muon", "lr": 0.02, "weight_decay": 0.0, "param_groups": [
        {"name": "qkv", "patterns": ["qkv.weight"], "split_sizes": [8, 4, 4]},
        {"name": "rest", "patterns": ["*"]}]}}
    hybrid = muon_cpp.build_optimizer(model, config, total_steps=10)
    reference = torch.nn.Parameter(start.clone())
    alone = muon_cpp.Muon([reference], lr=hybrid.param_groups[0]["lr"], split_sizes=[8, 4, 4])
    for grad in grads:
        model.qkv.weight.grad, reference.grad = grad.clone(), grad.clone()
        model.proj.weight.grad = torch.zeros(8, 8, dtype=torch.float64)
        hybrid.step()
        alone.step()
    assert max_rel_diff(model.qkv.weight.detach() - start, reference.detach() - start) < 1e-12
    with pytest.raises(RuntimeError,
                       match=r"split_sizes \[8, 8\] add up to 16 rows, but .* has 12"):
        w = torch.nn.Parameter(torch.randn(12, 4))
        w.grad = torch.randn(12, 4)
        muon_cpp.Muon([w], split_sizes=[8, 8]).step()


@pytest.mark.parametrize("coefficients", ["quintic", "polar_express", "dion", "cans", "aol",
                                          "cubic5", "deepseekv4"])
def test_the_update_does_not_depend_on_the_gradients_scale(coefficients):
    """A 64×32 gradient scaled by 1e-8 (‖G‖ ≈ 4.5e-7, as late in training or under loss scaling;
    with the quintic's eps 1e-7 added to ‖X‖_F its update was 28% off), by 1e-10 or by 1e10 moves
    the weights as the unscaled one does; zero stays zero. An explicit ns_eps keeps its meaning,
    X / (‖X‖_F + ns_eps): there the small gradient's update differs."""
    generator = torch.Generator().manual_seed(12)
    start = torch.randn(64, 32, generator=generator)
    grad = torch.randn(64, 32, generator=generator)

    def update(scale, **settings):
        w = torch.nn.Parameter(start.clone())
        optimizer = muon_cpp.Muon([w], lr=0.02, coefficients=coefficients,
                                  ns_steps=10 if coefficients == "deepseekv4" else 5, **settings)
        w.grad = grad * scale
        optimizer.step()
        return (w.detach() - start).double()

    unscaled = update(1.0)
    for scale in (1e-8, 1e-10, 1e10):
        assert max_rel_diff(update(scale), unscaled) < 1e-3, scale
    zero = update(0.0)
    assert torch.equal(zero, torch.zeros_like(zero))
    # The first Nesterov direction is 0.0975·G: ‖X‖_F ≈ 4.4e-8 against ns_eps 1e-7, which shrinks
    # it to 0.3 of unit norm before the iterations; how much of that they undo depends on the
    # table (10 DeepSeek-V4 iterations: all but 3e-4). The formula itself: Muon.NsEpsReplacesTheTablesEps.
    assert max_rel_diff(update(1e-8, ns_eps=1e-7), unscaled) > 1e-4


def test_presets_are_the_tables_and_each_sets_what_it_names():
    """Muon(preset=...), Dion's defaults and a configuration's preset read one C++ table
    (muon/presets.h), whose dion entry is Dion's own defaults; nanochat's entry is flaxchat/nanochat's matrix group: NorMuon (beta2 0.9),
    Polar Express coefficients, cautious weight decay 0.28 at lr 0.02."""
    table = muon_cpp._core.muon_presets()
    assert [(name, algorithm) for name, _origin, algorithm, _ in table] == [
        ("torch", "muon"), ("dion", "dion"), ("nanochat", "muon")]
    presets = {name: settings for name, _origin, _algorithm, settings in table}
    torch.manual_seed(3)
    ours = torch.nn.Parameter(torch.randn(12, 8, dtype=torch.float64))
    spelled_out = torch.nn.Parameter(ours.detach().clone())
    by_preset = muon_cpp.Muon([ours], preset="nanochat")
    by_hand = muon_cpp.Muon([spelled_out], lr=0.02, weight_decay=0.28,
                            coefficients="polar_express", normuon={"beta2": 0.9},
                            cautious_weight_decay=True)
    assert by_preset.param_groups[0]["normuon"]["beta2"] == 0.9
    initial = ours.detach().clone()
    for grad in gradients((12, 8), 4, seed=4):
        for p, optimizer in ((ours, by_preset), (spelled_out, by_hand)):
            p.grad = grad.clone()
            optimizer.step()
        assert torch.equal(ours, spelled_out)
    assert not torch.equal(ours, initial)
    # microsoft/dion's defaults, read from the table.
    defaults = inspect.signature(muon_cpp.Dion.__init__).parameters
    assert (defaults["lr"].default, defaults["mu"].default, defaults["weight_decay"].default) == (
        presets["dion"]["lr"], presets["dion"]["momentum"], presets["dion"]["weight_decay"])
    assert presets["dion"]["lr"] == 0.01 and presets["dion"]["momentum"] == 0.95
    # In a configuration: torch.optim.Muon's rates for the matrices, AdamW as configured.
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    hybrid = muon_cpp.build_optimizer(model, {"optimizer": {"preset": {"name": "torch"}}}, 10)
    muon_groups = [g for g in hybrid.param_groups if g["algorithm"] == "muon"]
    assert muon_groups and all((g["lr"], g["ns_eps"]) == (1e-3, 1e-7) for g in muon_groups)
