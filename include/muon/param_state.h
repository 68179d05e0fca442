// A parameter's optimizer state as named tensors plus a step count — the one form in which
// checkpoints and the Python module's state_dict() read and write the state of Muon, AdamW, Adam
// and Lamb, with one set of checks.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "muon/algorithm.h"

namespace muon {

struct ParamStateEntry {
  int64_t step = 0;
  // Muon: momentum_buffer (+ normuon_second_moment with NorMuon); Adam family: exp_avg, exp_avg_sq.
  std::map<std::string, at::Tensor> tensors;
};

// The tensors of a parameter's state as `optimizer` keeps it under the group's current options.
std::vector<StateSlot> expected_state_slots(const torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param);

// The state `optimizer` (Muon, AdamW, Adam or Lamb) keeps for `param` — its own tensors, not
// copies — or nullopt before the parameter's first update.
std::optional<ParamStateEntry> read_param_state(const torch::optim::Optimizer& optimizer,
                                                const at::Tensor& param);

// The dtypes a state tensor may come in: exactly the stored one (archives and checkpoints, which
// this project writes), or also the parameter's — what torch's optimizers keep, and what torch's
// load_state_dict casts every state tensor to (state dicts that passed through torch code).
enum class StateDtypes { stored, stored_or_param };

// Throws muon::Error, naming `where` (e.g. "state['blocks.0.attn.wq']"), unless `entry` is state
// `optimizer` could hold for `param` under its group's current options: exactly the expected
// tensor names, each with the expected shape and an accepted dtype, finite, and a step count ≥ 0.
void check_param_state(const torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamStateEntry& entry, const std::string& where,
                       StateDtypes accepted = StateDtypes::stored);

// Brings `entry` to the precision `optimizer` keeps `param`'s state in (muon/quantize.h): a
// tensor X given where X_codes and X_absmax are kept (state_dtype int8) is quantized; X_codes and
// X_absmax given where X is kept are dequantized. Each source is checked first (shape, finite,
// scales ≥ 0, one per block), naming `where`. Returns what it converted, one line per tensor
// ("exp_avg → exp_avg_codes, exp_avg_absmax"), for the caller's log; empty when nothing was.
std::vector<std::string> convert_state_precision(const torch::optim::Optimizer& optimizer,
                                                 const at::Tensor& param, ParamStateEntry& entry,
                                                 const std::string& where);

// How `optimizer` stores `param`'s state under its group's current options: "int8",
// "bfloat16", "float32" or "float64" — for a tensor whose group asks for int8 but that keeps full
// precision (under 4096 elements, or rank 1), with why.
std::string state_storage_text(const torch::optim::Optimizer& optimizer, const at::Tensor& param);

// Installs copies of `entry`'s tensors (on the parameter's device, in the stored dtype: another
// accepted one is rounded to nearest) as `param`'s state. Call check_param_state first: this only
// writes.
void write_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamStateEntry& entry);

// What torch::save(optimizer, ...) writes for Muon, the Adam family and the hybrid: every
// parameter's state and each group's lr, weight_decay and momentum (Muon) or betas and eps (the
// Adam family) — the settings schedules and schedulers change — by group and position.
void save_optimizer_state(const torch::optim::Optimizer& optimizer,
                          torch::serialize::OutputArchive& archive);
// Reads what save_optimizer_state wrote into an optimizer with the same groups: throws muon::Error
// (changing nothing) unless the group count, group sizes, options and every state entry fit.
void load_optimizer_state(torch::optim::Optimizer& optimizer,
                          torch::serialize::InputArchive& archive);

}  // namespace muon
