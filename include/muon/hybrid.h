// muon::HybridOptimizer — one torch::optim::Optimizer over a whole model (docs/design.md, "Hybrid
// optimizer"): Muon (or Dion) for the matrices routing picks, AdamW — or another elementwise
// algorithm of the registry — for every other trainable parameter, with parameter groups,
// global-norm clipping and a policy for non-finite gradients.
//
// Its param_groups() hold one group per (parameter group, role), whose options are the matrices'
// (MuonOptions by default, or DionOptions) or the others' (AdamWOptions by default; a group added
// later may run any registered algorithm) — the options' type is the algorithm tag, as in optax's
// `partition` — so libtorch's LRScheduler and set_lr reach every group. It owns every group and all
// state itself (state(), save/load, checkpoints read the one copy) and calls the update rules
// (each algorithm's registry entry, muon/algorithm.h) on them.
//
// step() reads .grad and never writes it: clipping scales internal copies, and on N ranks the
// averaged gradients are internal too, so .grad after a step is the caller's own gradient
// whatever the world size.
#pragma once

#include <torch/serialize/archive.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "muon/adam.h"
#include "muon/algorithms.h"
#include "muon/muon.h"
#include "muon/param_groups.h"
#include "muon/qk_clip.h"
#include "muon/routing.h"

namespace muon {

class Communicator;
namespace detail {
class DataParallel;
}

enum class NonfinitePolicy {
  skip,    // leave parameters and state untouched, count the step, log a warning (default)
  error,   // throw muon::Error naming the first parameter with a non-finite gradient
  ignore,  // step anyway, as torch.optim does: no norm is measured unless clipping needs it
};
template <>
struct EnumNames<NonfinitePolicy> {
  static constexpr const char* noun = "nonfinite policy";
  static constexpr const char* plural = "policies";
  static constexpr std::array<std::pair<NonfinitePolicy, const char*>, 3> table{
      {{NonfinitePolicy::skip, "skip"},
       {NonfinitePolicy::error, "error"},
       {NonfinitePolicy::ignore, "ignore"}}};
};

// The hybrid's own settings (beside muon, adamw and the groups, which have their own schemas).
// Schedules are applied by step() before each update from its own step count (a skipped step does
// not advance it); each group's rate = its peak × the schedule's multiplier.
// clang-format off
#define MUON_HYBRID_FIELDS(X)                                                                      \
  X(std::optional<double>, max_grad_norm, grad_clip, "max_grad_norm", std::nullopt, positive, "",  \
    "clip the global gradient norm to this; unset: no clipping")                                   \
  X(NonfinitePolicy, nonfinite, nonfinite, "", NonfinitePolicy::skip, any, "",                     \
    "a non-finite gradient norm: skip the step (counted, logged), error, or ignore it (step " \
    "anyway, as torch.optim does; no norm measured without clipping)")                        \
  X(std::optional<LrSchedule>, schedule, schedule, "", std::nullopt, any, "",                      \
    "the learning-rate schedule of every group without its own")                                   \
  X(std::optional<MomentumSchedule>, momentum_schedule, momentum_schedule, "", std::nullopt, any,  \
    "", "the Muon groups' momentum")                                                               \
  X(std::optional<WeightDecaySchedule>, weight_decay_schedule, weight_decay_schedule, "",          \
    std::nullopt, any, "", "constant or cosine (to 0 at the run's end)")
// clang-format on
//
// The partition: two slots, each the options of any registered algorithm of its kind. The matrices
// routing picks run `matrices` (Muon by default; `h.matrices = muon::DionOptions(0.01)`); every
// other trainable parameter runs `others` (AdamW by default; `h.others = muon::LionOptions(3e-5)`).
// An empty `matrices` slot (the configuration's `optimizer: adamw`) sends every trainable parameter
// to `others`.
struct HybridOptions {
  AlgorithmOptions matrices = MuonOptions();  // lr is the base rate of the routed matrices
  AlgorithmOptions others = AdamWOptions();
  std::vector<ParamGroupSpec> groups;  // empty: one catch-all group "default"
  MUON_HYBRID_FIELDS(MUON_FIELD_MEMBER)
  std::optional<double> qk_clip_tau;  // MuonClip after each step (needs set_qk_clip_source)
  int64_t total_steps = 0;            // the run's length; needed by the schedules
};
MUON_DEFINE_VISIT(HybridOptions, MUON_HYBRID_FIELDS)

// What the last step() did.
struct StepStats {
  double grad_norm = 0;                // √Σ‖g‖² over every gradient, before clipping; NaN
                                       // when not measured (nonfinite ignore, no clipping)
  double clip_factor = 1;              // what gradients were multiplied by
  bool skipped = false;                // a non-finite norm skipped this step
  int64_t skipped_steps = 0;           // over the optimizer's life
  std::vector<QkClipScaling> qk_clip;  // heads QK-clip shrank this step
};

// One row of the routing report: routing's decision plus the group's resolved settings.
struct ParameterReport {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  Role role;
  std::string reason;
  std::string algorithm;  // the registry's name of what updates it ("muon", "lion"); "" if frozen
  std::string group;      // empty for frozen parameters
  double lr = 0;
  double weight_decay = 0;
};

class HybridOptimizer : public torch::optim::Optimizer, public MatrixViews, public ParameterSteps {
 public:
  HybridOptimizer(const std::vector<RoutedParameter>& routes, const HybridOptions& options);
  // Muon and AdamW settings only: one group, no clipping.
  HybridOptimizer(const std::vector<RoutedParameter>& routes, MuonOptions muon_options,
                  AdamWOptions adamw_options);
  ~HybridOptimizer() override;

  // Data-parallel training (docs/design.md, "Data parallelism") over `communicator`'s ranks: step()
  // averages gradients across ranks, each parameter is updated by one owner rank (which alone keeps
  // its state), and the new values are shared. Call on every rank, with the same model and options,
  // before the first step; rank 0's parameter values are copied to all. A one-process communicator
  // changes nothing. .grad stays this rank's own gradient.
  void set_communicator(std::shared_ptr<Communicator> communicator,
                        int64_t bucket_numel = int64_t{1} << 23);
  Communicator* communicator() const { return communicator_.get(); }  // null when not set
  // Training on parameters another layer shards and moves (the Python module under FSDP2): every
  // rank passes the same parameters (names, shapes, order) and `owners`, each trainable
  // parameter's owner rank; a rank holds the whole value and gradient of what it owns and
  // placeholders without a gradient for the rest. step() updates what has a gradient and reduces
  // over `communicator` only what needs every rank: the squared gradient norm (clipping,
  // non-finite steps) and QK-clip's largest logits; QK-clip rescales the owned weights only. The
  // caller moves values between ranks. Instead of set_communicator, before the first step and
  // after the last add_param_group (later ones are refused).
  void set_partition(std::shared_ptr<Communicator> communicator,
                     const std::vector<std::pair<at::Tensor, int>>& owners);
  // The rank that keeps `param`'s state and computes its update (0 without ranks; under
  // set_partition −1 for a tensor that is not one of the trainable parameters).
  int owner_of(const at::Tensor& param) const;
  bool owns(const at::Tensor& param) const;

  // Calls `closure` (if any) exactly once; checks every group and gradient (and QK-clip's inputs);
  // measures the global gradient norm (skipping or failing on a non-finite one) and clips; updates
  // the Muon and AdamW groups; then applies QK-clip.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Adds a group after construction. Its options' type picks the algorithm, any of the registry's
  // (muon/algorithms.h): MuonOptions for Muon, DionOptions for Dion (matrices only), AdamWOptions —
  // or none: the hybrid's AdamW settings — for AdamW, the options of another elementwise algorithm
  // (AdamOptions, LambOptions, ...) for it. Its parameters are named "param_groups.<group>.<index>"
  // in reports and checkpoints; schedules scale its lr and weight decay like the others'. Throws
  // muon::Error, adding nothing, for another options type, invalid options, a parameter already in
  // a group or a Muon parameter that is not a matrix. A group added through the base class
  // (torch::optim::Optimizer's add_param_group) is checked the same way by the next step() — but
  // newer LibTorch (2.14, 2.15) gives such a group the hybrid's AdamW defaults in place of options
  // of a type it does not know (muon/compat.h), so add groups here.
  void add_param_group(const torch::optim::OptimizerParamGroup& group);

  // Gives each param group the parameters `params[g]` (one list per group, in order), as Python
  // code does by assigning or editing param_groups[g]['params'] (accelerate, a user's swap).
  // Tensors that stay keep their state, name and view. A new tensor at the index of one that
  // left takes its place — its name, routing's reason and, for the same shape, its view; other
  // new tensors are named "param_groups.<group>.<index>". Tensors that leave lose their state.
  // Every new tensor is checked as the group's algorithm checks a parameter, and no tensor may
  // be in two groups: on an error (muon::Error naming the group and index) nothing changes.
  // Refused on several ranks (set_communicator, set_partition), whose owners were planned over
  // the parameters as they were.
  void replace_params(const std::vector<std::vector<at::Tensor>>& params);

  // Throws muon::Error for whatever would stop step() (settings, parameters, gradients, QK-clip's
  // source), changing nothing: step() calls it before its first write.
  void check_step() const;

  // The step inside backward (muon/step_in_backward.h), one parameter at a time with the bits of
  // step(): begin refuses what needs every gradient before the first update — global-norm
  // clipping (grad_clip), the nonfinite policies skip and error (nonfinite: ignore steps each
  // parameter as torch.optim does), several ranks — naming the setting, then applies the
  // schedules; end applies QK-clip and counts the step.
  void begin_parameter_steps() override;
  void step_parameter(const at::Tensor& param) override;
  void end_parameter_steps() override;

  // Orthogonalizes the matrices parameter `param` (of a matrices group) in the (batch..., rows,
  // cols) `view` of its elements instead of its shape (a conv kernel as (out, in·kh·kw)); before
  // its first update.
  void set_matrix_view(const at::Tensor& param, std::vector<int64_t> view);

  // Writes / reads the state of every parameter, the step counters and each group's lr, weight
  // decay and momentum or betas and eps (what schedules and schedulers change), by group and
  // position: torch::save(optimizer, path) and torch::load(optimizer, path) round-trip. load
  // checks everything (same groups and sizes, the state this optimizer keeps) before it changes
  // anything.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // The model whose attention statistics QK-clip reads (options.qk_clip_tau); not owned.
  void set_qk_clip_source(QkClipSource* source) { qk_source_ = source; }

  // Clears all optimizer state (e.g. after an outer synchronization, DiLoCo style).
  void reset_state();
  // Creates the state of every trainable parameter this rank owns as its first update would
  // (zeros, step 0; Dion's Q is still drawn by that update), for what reads state before the first
  // step: torch.distributed.checkpoint, which otherwise takes a step at lr 0 to make it.
  void init_state();

  // Sets every group's lr to its construction-time lr × multiplier (for a caller's own schedule;
  // refused where options.schedule or a group's schedule sets lr).
  void set_lr_multiplier(double multiplier);

  // Updates done so far (the schedules' position).
  int64_t step_count() const { return step_count_; }

  // For checkpoints: the trainable parameters by name (sorted), the algorithm that updates a
  // parameter (frozen: none), and restoring the step counters (which also takes each group's lr,
  // weight decay and momentum, as restored, for what the schedules set last).
  std::vector<std::pair<std::string, at::Tensor>> named_trainable() const;
  Role role_of(const at::Tensor& param) const;
  const char* algorithm_of(const at::Tensor& param) const;  // the registry's name; "" if frozen
  void restore_counters(int64_t step_count, int64_t skipped_steps);

  // The view a Muon parameter is orthogonalized in (routing's view, or its shape).
  std::vector<int64_t> matrix_view(const at::Tensor& param) const override;

  const StepStats& last_step() const { return stats_; }
  const HybridOptions& options() const { return options_; }  // as constructed
  const std::vector<ParameterReport>& report() const { return report_; }
  // An aligned table of report(); then, where a Muon group runs bf16 Newton–Schulz on CPU
  // tensors, a line naming where its products run (bf16_products(): on bf16 dot products, or
  // emulated where the CPU has none).
  std::string report_text() const;
  // How the state of the parameter named `name` (as report() names it) is stored:
  // muon/param_state.h's state_storage_text; "" for a frozen or unknown name.
  std::string state_storage(const std::string& name) const;

  // Gradients by the TensorImpl of their parameter.
  using Gradients = std::map<const void*, at::Tensor>;

 private:
  std::string cpu_bf16_note() const;
  struct Plan;
  static Plan make_plan(const std::vector<RoutedParameter>& routes, const HybridOptions& options);
  HybridOptimizer(Plan plan, const HybridOptions& options);
  Role role_of_group(size_t g) const;
  void check_group(size_t g, const std::string& who) const;
  void adopt_group(size_t g, std::optional<LrSchedule> schedule);
  void adopt_added_groups(const char* who);  // `who` names the caller in errors
  void warn_when_muon_gets_nothing() const;
  void check_new_param(size_t g, size_t i, const at::Tensor& p,
                       const std::vector<int64_t>& view) const;
  void forget(const at::Tensor& param);
  // replace_params' steps.
  struct Arrival {
    size_t g, i;                 // its group and index
    const at::Tensor* replaces;  // the tensor that left from index i, or null
  };
  struct Leaver {
    std::string name;
    std::optional<std::vector<int64_t>> view;
  };
  std::set<const void*> tensors_staying(const std::vector<std::vector<at::Tensor>>& params,
                                        const char* who) const;
  std::vector<Arrival> check_arrivals(const std::vector<std::vector<at::Tensor>>& params,
                                      const std::set<const void*>& staying) const;
  std::map<const void*, Leaver> forget_leavers(const std::set<const void*>& staying);
  void welcome(const Arrival& a, const at::Tensor& p, const std::map<const void*, Leaver>& left,
               std::set<std::string>& names);
  std::optional<std::string> configured_group(size_t g) const;
  struct Settings {
    double lr, weight_decay, momentum;  // momentum: Muon groups only (0 for AdamW)
    bool operator==(const Settings& o) const {
      return lr == o.lr && weight_decay == o.weight_decay && momentum == o.momentum;
    }
  };
  // The settings the schedules drive, from an algorithm's settings by name.
  static Settings scheduled(const SettingValues& values);
  Settings settings_now(size_t g) const;  // group g's, as its options hold them now
  void apply_schedules();
  Gradients gradients() const;
  bool clip_gradients(Gradients& grads);  // false: skip this step
  // What reduces the norm and QK-clip's logits across ranks: null in one process.
  Communicator* reducer() const;
  std::vector<QkClipTarget> held_qk_targets(std::vector<QkClipTarget> targets) const;
  void drop_state_of_others();
  // Each parameter's group, index and position among the parameters of its algorithm (in group
  // order: part of its seeds).
  std::map<const void*, ParamPlace> seed_places() const;
  void update(const Gradients& grads, const std::vector<at::Tensor>* only);
  // The QK-clip targets and checked logits of this step (none without QK-clip).
  std::pair<std::vector<QkClipTarget>, std::map<std::string, at::Tensor>> qk_clip_inputs();
  void apply_qk_clip(const std::vector<QkClipTarget>& targets,
                     const std::map<std::string, at::Tensor>& logits);
  std::string first_nonfinite_gradient() const;

  HybridOptions options_;
  struct GroupBase {
    double lr, weight_decay, momentum;
    std::optional<LrSchedule> schedule;
    Settings last;  // as the schedules last set them (or as constructed, added or restored)
  };
  std::vector<GroupBase> base_;  // per group, as constructed or added
  int64_t step_count_ = 0;
  std::vector<ParameterReport> report_;
  std::map<const void*, std::string> names_;
  std::map<const void*, Role> roles_;
  std::map<const void*, size_t> groups_;               // each trainable parameter's group
  std::map<const void*, std::vector<int64_t>> views_;  // Muon views other than the shape
  MatrixScratch scratch_;  // each matrices algorithm's buffers, kept across steps
  std::map<const void*, ParamPlace> places_;  // seed_places() as begin_parameter_steps found them
  StepStats stats_;
  QkClipSource* qk_source_ = nullptr;
  std::shared_ptr<Communicator> communicator_;
  std::unique_ptr<detail::DataParallel> parallel_;       // with a communicator of > 1 rank
  std::optional<std::map<const void*, int>> partition_;  // set_partition's owners
};

}  // namespace muon
