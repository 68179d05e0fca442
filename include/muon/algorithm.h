// What an algorithm is to muon-cpp (docs/design.md, "Adding an algorithm"): a specialization of
// Algorithm<Options> — the options type is the algorithm's tag, as in torch::optim, where a
// group's options say what updates it — declared once, beside its options, and listed in
// muon/algorithms.h. The owners (the standalone optimizers and the hybrid), checkpoints, the
// Python module and the docs' tables read these entries instead of switching on types.
//
// An entry declares only what differs between algorithms:
//   name                 "adamw": Python's engine and option_schema(), messages, reports
//   kind                 ParamKind: which parameters it can update
//   State                its per-parameter state, declared once as a list (MUON_PARAM_STATE below):
//                        the fields, their visitor, the slots checkpoints check and the state
//                        made on first use all come from that list
//   settings             the options schedules, LR schedulers and checkpoints change, by name
//                        ({"lr", "weight_decay", "momentum"}; a Betas option is beta1 and beta2)
//   validate(options)    throws muon::Error for settings it cannot run, naming the one at fault
//   check_item(...)      throws muon::Error, naming `where`, unless a parameter and its gradient
//                        can take this update: (param, grad, options, where), and for matrices
//                        (param, grad, options, view, where)
//   update(...)          one step: (options, items) of one group for elementwise rules, owned by
//                        ElementwiseOptimizer; (items[, scratch]) across groups for matrices,
//                        owned by MatrixOptimizer, where `Scratch` (optional) is the type of the
//                        buffers it keeps across steps (Muon's orthogonalization workspaces)
// Everything else is derived from these: OwnerOf<Options>, ItemOf<Options>, state_slots(),
// make_state(), settings_of() and set_settings_of().
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
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

// When a state tensor is made: as zeros with the state (or on the first step it is present, when
// an option switching it on changed between steps), or by the algorithm's update (Dion's Q, drawn
// at random).
enum class StateStart { zeros, by_update };

// Whether `param`'s updates go through a mantissa (docs/algorithms.md, "bf16 parameters at fp32
// precision"): the option is on and the parameter is bf16.
inline bool tracks_mantissa(bool option, const at::Tensor& param) {
  return option && param.scalar_type() == at::kBFloat16;
}

// Brings `tensors` (a state by name) to the precision `slots` say: X quantized where X_codes and
// X_absmax are expected, those dequantized where X is (muon/param_state.h's
// convert_state_precision, which checks them first, naming `where`). Returns what it converted.
std::vector<std::string> fit_state_precision(std::map<std::string, at::Tensor>& tensors,
                                             const std::vector<StateSlot>& slots,
                                             const std::string& where);

// An algorithm's per-parameter state, declared once as a list of its tensors,
//   X(name, present, shape, dtype, start)
// where `present`, `shape` and `dtype` are expressions of the group's options `o`, the parameter
// `p` and its (batch..., rows, cols) view `view` (an at::IntArrayRef; the shape for elementwise
// rules), and `start` is a StateStart. MUON_PARAM_STATE(Name, LIST) defines `Name`, a
// torch::optim::OptimizerParamState with `step` and one at::Tensor per entry, and from the same
// list its visitor, its slots and the state made on first use (state_slots(), make_state()).
#define MUON_STATE_FIELD(name_, present_, shape_, dtype_, start_) TORCH_ARG(at::Tensor, name_);
#define MUON_STATE_VISIT(name_, present_, shape_, dtype_, start_) f(#name_, s.name_());
#define MUON_STATE_SLOT(name_, present_, shape_, dtype_, start_) \
  if (present_) slots.push_back({#name_, at::IntArrayRef(shape_).vec(), dtype_});
#define MUON_STATE_MAKE(name_, present_, shape_, dtype_, start_)                        \
  if (StateStart::start_ == StateStart::zeros && !s.name_().defined() && (present_)) { \
    s.name_(at::zeros(shape_, p.options().dtype(dtype_)));                             \
  }
#define MUON_STATE_STALE(name_, present_, shape_, dtype_, start_) \
  if (s.name_().defined() && !(present_)) stale = true;
#define MUON_STATE_TO_MAP(name_, present_, shape_, dtype_, start_) \
  if (s.name_().defined()) tensors[#name_] = s.name_();
#define MUON_STATE_FROM_MAP(name_, present_, shape_, dtype_, start_) \
  s.name_(tensors.count(#name_) != 0 ? tensors[#name_] : at::Tensor());
#define MUON_PARAM_STATE(Name, LIST)                                                              \
  struct Name : public torch::optim::OptimizerCloneableParamState<Name> {                         \
    TORCH_ARG(int64_t, step) = 0;                                                                 \
    LIST(MUON_STATE_FIELD)                                                                        \
                                                                                                  \
   public: /* TORCH_ARG leaves the members after it private */                                    \
    /* f(name, at::Tensor&) for each tensor, defined or not. */                                   \
    template <class F>                                                                            \
    static void visit(Name& s, F&& f) {                                                           \
      LIST(MUON_STATE_VISIT)                                                                      \
    }                                                                                             \
    /* The tensors `p` keeps under `o`, in the list's order. */                                   \
    template <class Options>                                                                      \
    static std::vector<StateSlot> slots([[maybe_unused]] const Options& o, const at::Tensor& p,   \
                                        [[maybe_unused]] at::IntArrayRef view) {                  \
      std::vector<StateSlot> slots;                                                               \
      LIST(MUON_STATE_SLOT)                                                                       \
      return slots;                                                                               \
    }                                                                                             \
    /* Makes each tensor that starts as zeros, is present and is not there yet, after          \
       bringing tensors kept in another precision to this one (state_dtype changed). */           \
    template <class Options>                                                                      \
    static void make(Name& s, [[maybe_unused]] const Options& o, const at::Tensor& p,             \
                     [[maybe_unused]] at::IntArrayRef view) {                                     \
      bool stale = false;                                                                         \
      LIST(MUON_STATE_STALE)                                                                      \
      if (stale) {                                                                                \
        std::map<std::string, at::Tensor> tensors;                                                \
        LIST(MUON_STATE_TO_MAP)                                                                   \
        fit_state_precision(tensors, slots(o, p, view), "optimizer state");                      \
        LIST(MUON_STATE_FROM_MAP)                                                                 \
      }                                                                                           \
      LIST(MUON_STATE_MAKE)                                                                       \
    }                                                                                             \
  }

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
  // The gradient is spent after this step (the step inside backward releases it): the update may
  // overwrite it, e.g. iterate in it instead of a buffer of its size.
  bool grad_spent = false;
};

// (β1, β2) of the Adam family and its like.
using Betas = std::tuple<double, double>;

namespace detail {

template <class Options>
bool is_setting(const char* option) {
  for (const char* name : Algorithm<Options>::settings) {
    if (std::strcmp(name, option) == 0) return true;
  }
  return false;
}

}  // namespace detail

// The settings of `o` (those its entry lists), by name: a double option as itself, a Betas option
// as beta1 and beta2 (a test holds every entry's list to these two types).
template <class Options>
SettingValues settings_of(const Options& o) {
  SettingValues values;
  visit_options(o, [&](const auto& info, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if (!detail::is_setting<Options>(info.name)) return;
    if constexpr (std::is_same_v<T, double>) {
      values[info.name] = value;
    } else if constexpr (std::is_same_v<T, Betas>) {
      values["beta1"] = std::get<0>(value);
      values["beta2"] = std::get<1>(value);
    }
  });
  return values;
}

// Sets the settings of `o` from `values`, which hold exactly the names settings_of(o) gives.
template <class Options>
void set_settings_of(Options& o, const SettingValues& values) {
  visit_options(o, [&](const auto& info, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if (!detail::is_setting<Options>(info.name)) return;
    if constexpr (std::is_same_v<T, double>) {
      field = values.at(info.name);
    } else if constexpr (std::is_same_v<T, Betas>) {
      field = Betas(values.at("beta1"), values.at("beta2"));
    }
  });
}

// Runs a step's closure (if any) once with gradients enabled, as torch.optim does, and returns
// its loss (undefined without a closure): every owner's step() begins with it.
inline at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

// An optimizer that can update its parameters one at a time, each as soon as its gradient is
// complete — the step inside backward (muon/step_in_backward.h) — with the bits step() gives it.
// One step of that form: begin_parameter_steps(), step_parameter(p) for each parameter with a
// gradient, in any order, then end_parameter_steps().
class ParameterSteps {
 public:
  virtual ~ParameterSteps() = default;
  // Checks the settings and refuses, naming the setting and its alternative, what needs every
  // gradient before the first update; then does what step() does first (schedules).
  virtual void begin_parameter_steps() = 0;
  // Updates `param` (one of this optimizer's, with a gradient) alone, as step() would update it,
  // and spends its gradient: the update may overwrite it (the caller releases it next).
  virtual void step_parameter(const at::Tensor& param) = 0;
  // What step() does after the updates (QK-clip, the step count).
  virtual void end_parameter_steps() {}
};

// Each parameter's param group, index in it and position among the optimizer's parameters (in
// group order: the position is part of a parameter's seeds), by its TensorImpl.
struct ParamPlace {
  size_t group, index;
  int64_t position;
  std::string label() const {  // as step()'s messages name a parameter
    return "parameter " + std::to_string(index) + " of param group " + std::to_string(group);
  }
};
// Each parameter's place, after every group's options are validated as step() validates them: a
// standalone owner's begin_parameter_steps().
std::map<const void*, ParamPlace> checked_places(
    const std::vector<torch::optim::OptimizerParamGroup>& groups);

// The place of `param` in `places`; throws muon::Error naming `who` when it is not there.
const ParamPlace& place_of(const std::map<const void*, ParamPlace>& places,
                           const at::Tensor& param, const char* who);

// The standalone optimizer of an elementwise algorithm (ParamKind::any): owns groups and state and
// calls Algorithm<Options>::update on them (muon::AdamW, muon::Lamb, ...).
template <class OptionsType>
class ElementwiseOptimizer : public torch::optim::Optimizer, public ParameterSteps {
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
  void begin_parameter_steps() override;
  void step_parameter(const at::Tensor& param) override;
  // torch::save / torch::load: state and each group's settings (save_optimizer_state in
  // muon/param_state.h).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::map<const void*, ParamPlace> places_;  // as begin_parameter_steps found them
};

// An optimizer that updates some parameters in a (batch..., rows, cols) view of their own.
class MatrixViews {
 public:
  virtual ~MatrixViews() = default;
  // The view `param` is updated in (its own shape unless set).
  virtual std::vector<int64_t> matrix_view(const at::Tensor& param) const = 0;
};

// The buffers a matrices algorithm keeps across steps: its entry's Scratch, or nothing.
struct NoScratch {};
namespace detail {
template <class Entry, class = void>
struct ScratchTypeOf {
  using type = NoScratch;
};
template <class Entry>
struct ScratchTypeOf<Entry, std::void_t<typename Entry::Scratch>> {
  using type = typename Entry::Scratch;
};
}  // namespace detail
template <class Options>
using ScratchOf = typename detail::ScratchTypeOf<Algorithm<Options>>::type;

// The standalone optimizer of a matrices algorithm (ParamKind::matrices): owns groups, state,
// each parameter's view and the algorithm's scratch, and calls Algorithm<Options>::update on them
// (muon::Muon, muon::Dion). A parameter of rank ≥ 2 is a batch of matrices over its last two dims
// (an expert stack (E, rows, cols) is updated expert by expert); set_matrix_view() gives it
// another view first, e.g. a conv kernel (out, in, kh, kw) → (out, in·kh·kw).
template <class OptionsType>
class MatrixOptimizer : public torch::optim::Optimizer, public MatrixViews, public ParameterSteps {
 public:
  using Options = OptionsType;
  explicit MatrixOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                           Options defaults = {});
  explicit MatrixOptimizer(std::vector<at::Tensor> params, Options defaults = {});

  // torch::optim::Optimizer::add_param_group, keeping the group's own options on every LibTorch
  // (newer ones replace options of types they do not know with the defaults; through a
  // torch::optim::Optimizer& that happens). Checked by the next step().
  void add_param_group(const torch::optim::OptimizerParamGroup& group);

  // Calls `closure` (if any) once with gradients enabled, then updates every parameter that has a
  // gradient. Everything is validated before the first parameter changes.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Throws muon::Error for whatever would stop step() (options, sparse/complex/mis-shaped
  // gradients), changing nothing: step() calls it before its first write.
  void check_step() const;

  // Update `param` (one of this optimizer's) as the (batch..., rows, cols) tensor `view` (same
  // element count, at least 2 dims).
  void set_matrix_view(const at::Tensor& param, std::vector<int64_t> view);
  // The view `param` is updated in (its own shape unless set).
  std::vector<int64_t> matrix_view(const at::Tensor& param) const override;

  void begin_parameter_steps() override;
  void step_parameter(const at::Tensor& param) override;

  // torch::save / torch::load: state and each group's settings (save_optimizer_state in
  // muon/param_state.h).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::map<const void*, std::vector<int64_t>> views_;
  ScratchOf<Options> scratch_;
  std::map<const void*, ParamPlace> places_;  // as begin_parameter_steps found them
};

// What the entry implies. The standalone optimizer of the algorithm:
template <class Options>
using OwnerOf = std::conditional_t<Algorithm<Options>::kind == ParamKind::matrices,
                                   MatrixOptimizer<Options>, ElementwiseOptimizer<Options>>;
// One parameter of its update:
template <class Options>
using ItemOf = std::conditional_t<Algorithm<Options>::kind == ParamKind::matrices,
                                  MatrixItem<Options, typename Algorithm<Options>::State>,
                                  RuleItem<typename Algorithm<Options>::State>>;

// The state tensors `param` keeps under `options` in `view` (its shape for elementwise rules).
template <class Options>
std::vector<StateSlot> state_slots(const Options& options, const at::Tensor& param,
                                   at::IntArrayRef view) {
  return Algorithm<Options>::State::slots(options, param, view);
}

// The state of `param` in `slot` (an optimizer's state entry), made on first use, with each
// tensor that starts as zeros and is missing made now (NorMuon switched on between steps).
template <class Options>
typename Algorithm<Options>::State& make_state(
    std::unique_ptr<torch::optim::OptimizerParamState>& slot, const at::Tensor& param,
    const Options& options, at::IntArrayRef view) {
  using State = typename Algorithm<Options>::State;
  if (!slot) slot = std::make_unique<State>();
  auto& state = static_cast<State&>(*slot);
  State::make(state, options, param, view);
  return state;
}

// Throws muon::Error, naming `where`, unless `param` with gradient `grad` can take the update of
// `options`' algorithm: its entry's check_item, given the (batch..., rows, cols) `view` when the
// algorithm updates matrices.
template <class Options>
void check_item(const at::Tensor& param, const at::Tensor& grad, const Options& options,
                const std::vector<int64_t>& view, const std::string& where) {
  if constexpr (Algorithm<Options>::kind == ParamKind::matrices) {
    Algorithm<Options>::check_item(param, grad, options, view, where);
  } else {
    Algorithm<Options>::check_item(param, grad, options, where);
  }
}

// One matrices update of `items` with the algorithm's scratch.
template <class Options>
void update_matrices(const std::vector<ItemOf<Options>>& items, ScratchOf<Options>& scratch) {
  if constexpr (std::is_same_v<ScratchOf<Options>, NoScratch>) {
    Algorithm<Options>::update(items);
  } else {
    Algorithm<Options>::update(items, scratch);
  }
}

}  // namespace muon
