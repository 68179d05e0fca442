// What every algorithm of the registry (muon/algorithms.h) owes, held over all of them by one
// suite, as python/tests/test_conformance.py holds torch.optim's contract over the Python classes:
// its standalone optimizer (OwnerOf<Options>) resumes bit for bit from torch::save, refuses every
// numeric option outside its range naming the option and changing nothing, gives the same bits
// on the fused CPU kernels and the ATen form (LAMB: the same values to rounding) and on one
// thread and two, and runs as a group of the hybrid optimizer as it runs alone — for each state
// dtype it keeps. An algorithm added to the registry joins the suite without an edit here; its
// own test file keeps only its own maths.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "demo/gpt.h"
#include "golden/scenarios.h"
#include "helpers.h"
#include "muon/algorithms.h"
#include "muon/hybrid.h"
#include "muon/param_state.h"
#include "muon/routing.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

// The registry's list as GoogleTest's.
template <class List>
struct TypesOf;
template <class... Options>
struct TypesOf<AlgorithmList<Options...>> {
  using type = ::testing::Types<Options...>;
};

// Whether the options have a state_dtype (Dion's do not: its momentum stays float32).
template <class Options, class = void>
struct HasStateDtype : std::false_type {};
template <class Options>
struct HasStateDtype<Options, std::void_t<decltype(std::declval<Options&>().state_dtype())>>
    : std::true_type {};

// The state dtypes an algorithm keeps: float32, bfloat16 and int8, but where it refuses the low
// precisions (LAMB's trust ratio) or has no choice (Dion), float32 alone.
template <class Options>
std::vector<at::ScalarType> state_dtypes() {
  if constexpr (!HasStateDtype<Options>::value) return {at::kFloat};
  std::vector<at::ScalarType> out;
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kChar}) {
    Options o;
    if constexpr (HasStateDtype<Options>::value) o.state_dtype(dtype);
    try {
      Algorithm<Options>::validate(o);
      out.push_back(dtype);
    } catch (const Error&) {
      EXPECT_NE(dtype, at::kFloat) << Algorithm<Options>::name << " refuses float32 state";
    }
  }
  return out;
}

// Settings away from the defaults (a rate the updates show, weight decay on); Dion at half rank.
template <class Options>
Options test_options(at::ScalarType state_dtype) {
  Options o;
  o.lr(0.02);
  o.weight_decay(0.1);
  if constexpr (HasStateDtype<Options>::value) o.state_dtype(state_dtype);
  if constexpr (std::is_same_v<Options, DionOptions>) o.rank_fraction(0.5);
  return o;
}

// Parameters the algorithm takes: matrices (one of 5120 elements, which int8 state quantizes in
// blocks, and a small one), and for an elementwise algorithm a vector too.
template <class Options>
std::vector<at::Tensor> make_params(uint64_t seed, at::ScalarType dtype = at::kFloat) {
  auto gen = seeded(seed);
  std::vector<at::Tensor> out{at::randn({80, 64}, gen), at::randn({8, 6}, gen)};
  if (Algorithm<Options>::kind == ParamKind::any) out.push_back(at::randn({6}, gen));
  for (auto& p : out) p = (p * 0.1).to(dtype).requires_grad_(true);
  return out;
}

// `steps` steps of `opt` over `params`, gradients drawn from `seed` and the step number.
void run(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, int first, int steps) {
  for (int step = first; step < first + steps; ++step) {
    auto gen = seeded(1000 + static_cast<uint64_t>(step));
    for (auto& p : params) p.mutable_grad() = at::randn(p.sizes(), gen).to(p.scalar_type());
    opt.step();
  }
}

// Each parameter, then its state tensors by name.
std::vector<at::Tensor> outcome(const torch::optim::Optimizer& opt,
                                const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.detach().clone());
    const auto state = read_param_state(opt, p);
    if (!state) continue;
    for (const auto& [name, t] : state->tensors) out.push_back(t.clone());
  }
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "tensor " << i;
}

template <class Options>
class Conformance : public ::testing::Test {};
struct AlgorithmNames {  // Conformance/muon.ResumesBitForBitFromTorchSave, ...
  template <class Options>
  static std::string GetName(int) {
    return Algorithm<Options>::name;
  }
};
TYPED_TEST_SUITE(Conformance, TypesOf<Algorithms>::type, AlgorithmNames);

TYPED_TEST(Conformance, ResumesBitForBitFromTorchSave) {
  using Options = TypeParam;
  using Owner = OwnerOf<Options>;
  for (const auto dtype : state_dtypes<Options>()) {
    SCOPED_TRACE(c10::toString(dtype));
    auto straight_params = make_params<Options>(1), params = make_params<Options>(1);
    Owner straight(straight_params, test_options<Options>(dtype));
    run(straight, straight_params, 0, 6);
    std::stringstream saved;
    {
      Owner first(params, test_options<Options>(dtype));
      run(first, params, 0, 3);
      torch::save(first, saved);
    }
    Owner resumed(params, test_options<Options>(dtype));
    torch::load(resumed, saved);
    run(resumed, params, 3, 3);
    expect_same(outcome(resumed, params), outcome(straight, straight_params));
  }
}

// The message names the option: "<Algorithm>: <option> must be <range>, got <value>".
template <class Options, class F>
void for_each_out_of_range(F&& f) {
  const auto outside = [](Range range) {
    switch (range) {
      case Range::nonnegative:
        return -1.0;
      case Range::unit_interval:
        return 1.0;
      default:  // positive, (0, 1), (0, 1], an iteration count
        return 0.0;
    }
  };
  const Options defaults;
  visit_options(defaults, [&](const OptionInfo& info, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if (info.range == Range::any) return;
    const double bad = outside(info.range);
    std::ostringstream got;
    got << bad;
    const auto expect = [&](const std::string& name, const auto& set) {
      Options o = defaults;
      visit_options(o, [&](const OptionInfo& other, auto& field) {
        if (std::string(other.name) == info.name) set(field);
      });
      f(o, name + " must be " + range_text(info.range) + ", got " + got.str());
    };
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>) {
      expect(info.name, [&](auto& field) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) field = bad;
      });
    } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::optional<int64_t>>) {
      expect(info.name, [&](auto& field) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) {
          field = static_cast<int64_t>(bad);
        }
      });
    } else if constexpr (std::is_same_v<T, std::tuple<double, double>>) {
      expect(std::string(info.name) + "[0]", [&](auto& field) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) std::get<0>(field) = bad;
      });
      expect(std::string(info.name) + "[1]", [&](auto& field) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, T>) std::get<1>(field) = bad;
      });
    }
  });
}

TYPED_TEST(Conformance, RefusesEveryOptionOutOfRangeNamingItAndChangingNothing) {
  using Options = TypeParam;
  using Owner = OwnerOf<Options>;
  int refused = 0;
  for_each_out_of_range<Options>([&](const Options& bad, const std::string& message) {
    SCOPED_TRACE(message);
    auto params = make_params<Options>(2);
    expect_error<Error>([&] { Owner opt(params, bad); }, {message});
    // Set between steps (as a schedule or a Python param group would): refused by step(),
    // before any parameter or state changes.
    Owner opt(params, test_options<Options>(at::kFloat));
    run(opt, params, 0, 1);
    const auto before = outcome(opt, params);
    opt.param_groups()[0].set_options(std::make_unique<Options>(bad));
    expect_error<Error>([&] { run(opt, params, 1, 1); }, {message});
    expect_same(outcome(opt, params), before);
    ++refused;
  });
  EXPECT_GE(refused, 3) << "lr, weight_decay and at least one of the algorithm's own";
}

// A run's parameters and its optimizer, from make_params(3, ...).
struct Run {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

// Whether the fused kernels' run and the ATen form's agree as they must: bit for bit, but for
// LAMB, whose trust ratio sums its norms in another order in each form (fp32 blocks, fp64):
// there each parameter's change to the precision of its dtype (within one rounding for bf16),
// and its state likewise.
template <class Options>
void expect_forms_agree(const Run& fused, const Run& aten, at::ScalarType param_dtype) {
  if constexpr (!std::is_same_v<Options, LambOptions>) {
    expect_same(outcome(*fused.opt, fused.params), outcome(*aten.opt, aten.params));
  } else {
    const double tol = param_dtype == at::kDouble ? 1e-12 : 1e-5;
    const auto initial = make_params<Options>(3, param_dtype);
    for (size_t i = 0; i < initial.size(); ++i) {
      const auto a = fused.params[i].detach().to(at::kDouble);
      const auto b = aten.params[i].detach().to(at::kDouble);
      if (param_dtype == at::kBFloat16) {
        EXPECT_LE((a - b).abs().max().item<double>(),
                  std::pow(2.0, -8) * a.abs().max().item<double>() + 1e-30) << "parameter " << i;
      } else {
        const auto start = initial[i].detach().to(at::kDouble);
        EXPECT_LE(testing::max_rel_diff(a - start, b - start), tol) << "parameter " << i;
      }
      const auto state_a = read_param_state(*fused.opt, fused.params[i]).value().tensors;
      const auto state_b = read_param_state(*aten.opt, aten.params[i]).value().tensors;
      for (const auto& [name, t] : state_a) {
        EXPECT_LE(testing::max_rel_diff(t.to(at::kDouble), state_b.at(name).to(at::kDouble)), tol)
            << "parameter " << i << " " << name;
      }
    }
  }
}

// The fused CPU kernels and the ATen form other devices run agree (above), for every parameter
// dtype and state dtype. Muon's orthogonalization takes the plain Newton–Schulz chain both forms
// have (the CPU's BLIS methods agree to their precision: test_generic.cpp).
TYPED_TEST(Conformance, FusedKernelsAndTheAtenFormAgree) {
  using Options = TypeParam;
  using Owner = OwnerOf<Options>;
  for (const auto param_dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
    for (const auto dtype : state_dtypes<Options>()) {
      if (param_dtype == at::kDouble && dtype == at::kChar) continue;  // refused: fp32 scales
      SCOPED_TRACE(std::string(c10::toString(param_dtype)) + " parameters, " +
                   c10::toString(dtype) + " state");
      std::vector<Run> runs;
      for (const auto& fused : testing::kernel_paths()) {
        Run r{make_params<Options>(3, param_dtype), nullptr};
        auto o = test_options<Options>(dtype);
        o.fused(fused);
        if constexpr (std::is_same_v<Options, MuonOptions>) o.ns_method(NsMethod::plain);
        r.opt = std::make_unique<Owner>(r.params, o);
        run(*r.opt, r.params, 0, 4);
        runs.push_back(std::move(r));
      }
      expect_forms_agree<Options>(runs[0], runs[1], param_dtype);
    }
  }
}

TYPED_TEST(Conformance, GivesTheSameBitsOnOneThreadAndOnTwo) {
  using Options = TypeParam;
  using Owner = OwnerOf<Options>;
  const int before = at::get_num_threads();
  for (const auto param_dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto dtype : state_dtypes<Options>()) {
      SCOPED_TRACE(std::string(c10::toString(param_dtype)) + " parameters, " +
                   c10::toString(dtype) + " state");
      std::vector<std::vector<at::Tensor>> outcomes;
      for (const int threads : {1, 2}) {
        at::set_num_threads(threads);
        auto params = make_params<Options>(4, param_dtype);
        params.push_back(
            (at::randn({300, 256}, seeded(5)) * 0.1).to(param_dtype).requires_grad_(true));
        Owner opt(params, test_options<Options>(dtype));
        run(opt, params, 0, 3);
        outcomes.push_back(outcome(opt, params));
      }
      at::set_num_threads(before);
      expect_same(outcomes[0], outcomes[1]);
    }
  }
}

// A group of the algorithm added to the hybrid over the demo GPT steps its tensors as the
// standalone optimizer does (float32 state: no rounding seeds, which count positions).
TYPED_TEST(Conformance, RunsAsAGroupOfTheHybridAsOnItsOwn) {
  using Options = TypeParam;
  using Owner = OwnerOf<Options>;
  cli::Gpt model(golden::tiny_gpt());
  HybridOptimizer hybrid(route(*model), HybridOptions{});
  auto extra = make_params<Options>(6), alone = make_params<Options>(6);
  const auto o = test_options<Options>(at::kFloat);
  hybrid.add_param_group({extra, std::make_unique<Options>(o)});
  Owner reference(alone, o);
  for (int step = 0; step < 4; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::zeros_like(p);
    auto gen = seeded(2000 + static_cast<uint64_t>(step));
    for (size_t i = 0; i < extra.size(); ++i) {
      const auto g = at::randn(extra[i].sizes(), gen);
      extra[i].mutable_grad() = g;
      alone[i].mutable_grad() = g.clone();
    }
    hybrid.step();
    reference.step();
  }
  for (size_t i = 0; i < extra.size(); ++i) EXPECT_TRUE(at::equal(extra[i], alone[i])) << i;
  EXPECT_STREQ(algorithm_name(hybrid.param_groups().back().options()), Algorithm<Options>::name);
}

}  // namespace
}  // namespace muon
