// Checkpoints (docs/design.md §Checkpoints): optimizer state keyed by parameter name, the step
// counters (schedule position, stochastic-rounding seeds follow from them), the resolved config
// and, optionally, the model's weights — one file, written atomically, validated completely before
// anything changes.
//
// The file is a torch pickle archive: Python reads it with `torch.load(path)` as a dict.
#pragma once

#include <string>

#include "muon/hybrid.h"

namespace torch::nn {
class Module;
}

namespace muon {

struct CheckpointInfo {
  int64_t step_count = 0;
  std::string config_yaml;  // as saved ("" when none was given)
  // State saved in another precision than this optimizer keeps (state_dtype changed: int8 ↔
  // float32/bfloat16), converted once on load: "name: exp_avg → exp_avg_codes, exp_avg_absmax".
  std::vector<std::string> converted_state;
};

// Writes `path` through a temporary file, fsync and rename: a crash mid-save leaves the previous
// checkpoint intact. `model` (optional) saves its parameters and buffers alongside.
void save_checkpoint(const std::string& path, HybridOptimizer& optimizer,
                     const torch::nn::Module* model = nullptr, const std::string& config_yaml = "");

// Restores what save_checkpoint wrote. Everything — the file's integrity, parameter names
// (missing and extra), shapes, dtypes and finiteness of every tensor — is checked before the
// optimizer or the model changes; any problem is a muon::Error naming it.
CheckpointInfo load_checkpoint(const std::string& path, HybridOptimizer& optimizer,
                               torch::nn::Module* model = nullptr);

// The step count and saved config of the checkpoint at `path`, changing nothing (what a resumed
// run needs to know before it can build its optimizer).
CheckpointInfo read_checkpoint_info(const std::string& path);

}  // namespace muon
