// muon::HybridOptimizer — one torch::optim::Optimizer over a whole model (SPEC §10): Muon for the
// matrices routing picks, AdamW for every other trainable parameter, with parameter groups,
// global-norm clipping and a policy for non-finite gradients.
//
// Its param_groups() hold one group per (parameter group, role), whose options are MuonOptions or
// AdamWOptions — the options' type is the algorithm tag — so libtorch's LRScheduler and set_lr
// reach every group. The state lives in the two branch optimizers (muon(), adamw()).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "muon/adam.h"
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
  skip,   // leave parameters and state untouched, count the step, log a warning (default)
  error,  // throw muon::Error naming the first parameter with a non-finite gradient
};

struct HybridOptions {
  MuonOptions muon;    // base settings of Muon-routed parameters; lr is the base rate
  AdamWOptions adamw;  // base settings of AdamW-routed parameters
  std::vector<ParamGroupSpec> groups;   // empty: one catch-all group "default"
  std::optional<double> max_grad_norm;  // clip the global gradient norm to this (> 0)
  NonfinitePolicy nonfinite = NonfinitePolicy::skip;
  bool all_adamw = false;             // optimizer `adamw`: every trainable parameter in AdamW
  std::optional<double> qk_clip_tau;  // MuonClip after each step (needs set_qk_clip_source)
  // Schedules, applied by step() before each update from its own step count (a skipped step does
  // not advance it). Each group's rate = its peak × the schedule's multiplier.
  std::optional<LrSchedule> schedule;
  std::optional<MomentumSchedule> momentum_schedule;  // Muon groups' momentum
  std::optional<WeightDecaySchedule> weight_decay_schedule;
  int64_t total_steps = 0;  // the run's length; needed by the schedules
};

// What the last step() did.
struct StepStats {
  double grad_norm = 0;                // √Σ‖g‖² over every gradient, before clipping
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
  std::string group;  // empty for frozen parameters
  double lr = 0;
  double weight_decay = 0;
};

class HybridOptimizer : public torch::optim::Optimizer {
 public:
  HybridOptimizer(const std::vector<RoutedParameter>& routes, const HybridOptions& options);
  // Muon and AdamW settings only: one group, no clipping.
  HybridOptimizer(const std::vector<RoutedParameter>& routes, MuonOptions muon_options,
                  AdamWOptions adamw_options);
  ~HybridOptimizer() override;

  // Data-parallel training (SPEC §13) over `communicator`'s ranks: step() averages gradients
  // across ranks, each parameter is updated by one owner rank (which alone keeps its state), and
  // the new values are shared. Call on every rank, with the same model and options, before the
  // first step; rank 0's parameter values are copied to all. A one-process communicator changes
  // nothing. After a distributed step, .grad holds this rank's own gradient again.
  void set_communicator(std::shared_ptr<Communicator> communicator,
                        int64_t bucket_numel = int64_t{1} << 23);
  Communicator* communicator() const { return communicator_.get(); }  // null when not set
  // The rank that keeps `param`'s state and computes its update (0 without ranks).
  int owner_of(const at::Tensor& param) const;
  bool owns(const at::Tensor& param) const;

  // Calls `closure` (if any) exactly once; checks both branches (and QK-clip's inputs); measures
  // the global gradient norm (skipping or failing on a non-finite one) and clips; steps Muon and
  // AdamW; then applies QK-clip.
  at::Tensor step(LossClosure closure = nullptr) override;

  // The model whose attention statistics QK-clip reads (options.qk_clip_tau); not owned.
  void set_qk_clip_source(QkClipSource* source) { qk_source_ = source; }

  // Clears both branches' state (e.g. after an outer synchronization, DiLoCo style).
  void reset_state();

  // Sets every group's lr to its construction-time lr × multiplier (for a caller's own schedule).
  void set_lr_multiplier(double multiplier);

  // Updates done so far (the schedules' position).
  int64_t step_count() const { return step_count_; }

  // For checkpoints: the trainable parameters by name (routing order), the branch that holds a
  // parameter's state, and restoring the step counters.
  std::vector<std::pair<std::string, at::Tensor>> named_trainable() const;
  Role role_of(const at::Tensor& param) const;
  void restore_counters(int64_t step_count, int64_t skipped_steps);

  const StepStats& last_step() const { return stats_; }
  const std::vector<ParameterReport>& report() const { return report_; }
  std::string report_text() const;  // an aligned table of report()

  // Copies this optimizer's group options into the branches; step() does it first, call it
  // after changing param_groups() options when reading the branches' options before a step.
  void sync_branch_options();

  Muon* muon() { return muon_.get(); }     // null without Muon parameters
  AdamW* adamw() { return adamw_.get(); }  // null without AdamW parameters

 private:
  struct Plan;
  static Plan make_plan(const std::vector<RoutedParameter>& routes, const HybridOptions& options);
  HybridOptimizer(Plan plan, const HybridOptions& options);
  void apply_schedules();
  bool clip_gradients();  // false: skip this step
  std::string first_nonfinite_gradient() const;

  HybridOptions options_;
  std::unique_ptr<Muon> muon_;
  std::unique_ptr<AdamW> adamw_;
  std::vector<std::pair<torch::optim::Optimizer*, size_t>> branch_group_;  // per hybrid group
  struct GroupBase {
    double lr, weight_decay, momentum;
    std::optional<LrSchedule> schedule;
  };
  std::vector<GroupBase> base_;  // per hybrid group, as constructed
  int64_t step_count_ = 0;
  std::vector<ParameterReport> report_;
  std::map<const void*, std::string> names_;
  std::map<const void*, Role> roles_;
  StepStats stats_;
  QkClipSource* qk_source_ = nullptr;
  std::shared_ptr<Communicator> communicator_;
  std::unique_ptr<detail::DataParallel> parallel_;  // with a communicator of > 1 rank
};

}  // namespace muon
