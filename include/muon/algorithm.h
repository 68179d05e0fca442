// What an algorithm is to muon-cpp (docs/design.md, "Adding an algorithm"): a specialization of
// Algorithm<Options> — the options type is the algorithm's tag, as in torch::optim, where a
// group's options say what updates it — declared once, beside its options, and listed in
// muon/algorithms.h. The owners (the standalone optimizers and the hybrid), checkpoints, the
// Python module and the docs' tables read these entries instead of switching on types.
//
// An entry declares:
//   name                 "adamw": Python's engine and option_schema(), messages, reports
//   kind                 ParamKind: which parameters it can update
//   State                its per-parameter state (a torch::optim::OptimizerParamState)
//   Owner                its standalone torch::optim::Optimizer
//   validate(options)    throws muon::Error for settings it cannot run, naming the one at fault
//   state_slots(options, param, view)   the state tensors it keeps for `param`
//   visit_state(state, f)               f(name, at::Tensor&) for each of them
//   settings(options), set_settings(options, values)
//                        the settings schedules and LR schedulers change (lr, weight_decay, ...),
//                        saved with checkpoints by name
// and, for ParamKind::any (elementwise rules, which ElementwiseOptimizer owns):
//   make_state(slot, param, options)    the state, created on first use
//   check_item(param, grad, options, where)
//   update(options, items)              one step of every item (one parameter group)
// or, for ParamKind::matrices (rules over (batch..., rows, cols) views, which MatrixOptimizer
// owns), the same with the parameter's view, and items that carry their own options:
//   make_state(slot, param, options, view)
//   check_item(param, grad, options, view, where)
//   update(items, workspaces)           one step of every item, across groups
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace muon {

// Which parameters an algorithm can update.
enum class ParamKind {
  matrices,  // tensors of rank ≥ 2 in a (batch..., rows, cols) view: Muon, Dion
  any,       // every tensor, elementwise: the Adam family and its like
};

// Specialized by each algorithm (see above).
template <class Options>
struct Algorithm;

// One tensor of a state as a checkpoint stores it: name, shape, dtype.
struct StateSlot {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

// Settings by name, as checkpoints store them.
using SettingValues = std::map<std::string, double>;

// One parameter of an elementwise update.
template <class State>
struct RuleItem {
  at::Tensor param;  // updated in place
  at::Tensor grad;   // the parameter's shape
  State* state;      // from the entry's make_state()
  int64_t index;     // its position among the owner's parameters of the rule: seeds bf16 rounding
};

// One parameter of a matrices update (Muon, Dion).
template <class Options, class State>
struct MatrixItem {
  at::Tensor param;           // updated in place
  at::Tensor grad;            // the parameter's shape
  State* state;               // from the entry's make_state()
  const Options* options;     // its group's
  std::vector<int64_t> view;  // the (batch..., rows, cols) view it is updated in
  int64_t index;  // its position among the owner's parameters of the rule: seeds rounding, Dion's Q
};

// (β1, β2) of the Adam family and its like.
using Betas = std::tuple<double, double>;

// The settings of options with lr, weight_decay and betas (beta1, beta2), plus eps when WithEps:
// the Adam family's.
template <bool WithEps, class Options>
SettingValues beta_settings(const Options& o) {
  SettingValues v{{"lr", o.lr()},
                  {"weight_decay", o.weight_decay()},
                  {"beta1", std::get<0>(o.betas())},
                  {"beta2", std::get<1>(o.betas())}};
  if constexpr (WithEps) v["eps"] = o.eps();
  return v;
}
template <bool WithEps, class Options>
void set_beta_settings(Options& o, const SettingValues& v) {
  o.lr(v.at("lr")).weight_decay(v.at("weight_decay")).betas({v.at("beta1"), v.at("beta2")});
  if constexpr (WithEps) o.eps(v.at("eps"));
}

// The standalone optimizer of an elementwise algorithm (ParamKind::any): owns groups and state and
// calls Algorithm<Options>::update on them (muon::AdamW, muon::Lamb, ...).
template <class OptionsType>
class ElementwiseOptimizer : public torch::optim::Optimizer {
 public:
  using Options = OptionsType;
  explicit ElementwiseOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                Options defaults = {});
  explicit ElementwiseOptimizer(std::vector<at::Tensor> params, Options defaults = {});
  // torch::optim::Optimizer::add_param_group, keeping the group's own options on every LibTorch
  // (as Muon::add_param_group). Checked by the next step().
  void add_param_group(const torch::optim::OptimizerParamGroup& group);
  at::Tensor step(LossClosure closure = nullptr) override;
  // Throws muon::Error for whatever would stop step(), changing nothing.
  void check_step() const;
  // torch::save / torch::load: state and each group's settings (save_optimizer_state in
  // muon/param_state.h).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace muon
