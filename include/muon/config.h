// The optimizer's YAML configuration and build_optimizer (docs/design.md §Configuration; keys in
// docs/config.md): the one source of truth from which the hybrid optimizer, its groups, routing
// overrides and schedules are built.
//
//   auto config = muon::OptimConfig::from_yaml_file("optim.yaml");
//   auto optimizer = muon::build_optimizer(*model, config, total_steps);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "muon/hybrid.h"
#include "muon/routing.h"

namespace torch::nn {
class Module;
}

namespace muon {

// The optimizer names (`optimizer: NAME`, `muon train --optimizer NAME`) in one table: each name
// and what it trains with, in the order docs and --help list them.
struct OptimizerName {
  const char* name;
  const char* doc;
};
const std::vector<OptimizerName>& optimizer_names();
std::string optimizer_name_list();  // "muon, muonclip, dion, adamw"

// Sets in `h` what optimizer name `name` implies, before a configuration's own keys: dion Muon's
// settings from the preset "dion" (muon/presets.h) unless Dion is on already, any other name Dion
// off; adamw every parameter in AdamW; muonclip QK-clip at tau 100 unless set. Throws muon::Error
// naming the valid names for another.
void apply_optimizer_name(const std::string& name, HybridOptions& h);

struct OptimConfig {
  std::string name = "muon";    // one of optimizer_names()
  HybridOptions hybrid;         // rates, groups, clipping, schedules, QK-clip tau
  RoutingRules routing;         // routing.muon / routing.adamw patterns, higher_rank policy
  bool cautious = false;        // the cautious mask, fused into both branches
  std::string preset = "none";  // none, mup or a Muon preset's name (already expanded into hybrid)
  std::vector<std::string> notes;  // what rules changed (the scaling block), for the run's log

  // Parses and validates; every error (muon::Error) names the key path and what is valid.
  static OptimConfig from_yaml(const std::string& text);
  static OptimConfig from_yaml_file(const std::string& path);

  // The resolved configuration, defaults filled, as YAML that from_yaml() reads back.
  std::string to_yaml() const;
  // Throws muon::Error naming the key (optimizer.schedule, optimizer.param_groups[i].schedule,
  // optimizer.momentum_schedule) when a schedule cannot run for `total_steps` updates; 0 stands
  // for a run of unknown length, which only a configuration without schedules takes.
  void check_steps(int64_t total_steps) const;
};

// One key of a config section as the schema declares it, its default written as YAML; `kinds`: the
// schedule kinds a schedule field belongs to ("" all).
struct ConfigKey {
  std::string key, alias, default_yaml, doc, range, kinds;
};
// The keys of `section`: optimizer (the hybrid's own), shorthand (root-level keys that set muon
// and/or adamw options; no defaults of their own), muon, adamw, schedule, schedule.tail,
// momentum_schedule or param_group. For generated docs and the schema tests.
std::vector<ConfigKey> config_schema(const std::string& section);

// Every key the optimizer section takes (docs/config.md), sorted: what the reader asks for, and a
// section per registered algorithm. Python's HybridOptimizer takes them as keyword arguments.
std::vector<std::string> optimizer_keys();

// The configuration `yaml` with the keys of the mapping `keys` (YAML or JSON text) set in its
// optimizer section, as keyword arguments set them in Python; mappings merge key by key, and a key
// both give is an error naming it (muon::Error).
std::string with_optimizer_keys(const std::string& yaml, const std::string& keys);

// The hybrid optimizer `config` describes over `parameters`, with its schedules running over
// `total_steps` updates (0: unknown, for a configuration without schedules).
// The parameters come first, as in torch.optim and the Python module's build_optimizer.
std::unique_ptr<HybridOptimizer> build_optimizer(const std::vector<NamedParameter>& parameters,
                                                 const OptimConfig& config, int64_t total_steps);
std::unique_ptr<HybridOptimizer> build_optimizer(const torch::nn::Module& model,
                                                 const OptimConfig& config, int64_t total_steps);
// The same over routes already made with config.routing (e.g. on stand-ins of the parameters'
// shapes, their tensors then replaced by those this process updates: the Python module's hybrid
// on FSDP2's shards).
std::unique_ptr<HybridOptimizer> build_optimizer(const std::vector<RoutedParameter>& routes,
                                                 const OptimConfig& config, int64_t total_steps);

}  // namespace muon
