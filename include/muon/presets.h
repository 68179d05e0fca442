// Other projects' Muon settings by name, in one table: muon::muon_preset (and dion_options),
// the configuration's `preset:` and optimizer name `dion`, `muon train --optimizer dion`, and the
// Python `Muon(preset=...)` / `Dion` defaults all read it (docs/algorithms.md §Presets).
//
//   muon::Muon opt(params, muon::muon_preset("torch").muon.lr(3e-3));
#pragma once

#include <string>
#include <vector>

#include "muon/muon.h"

namespace muon {

struct MuonPreset {
  const char* name;
  const char* origin;  // whose defaults they are (docs, --help)
  MuonOptions muon;    // the options it does not set are MuonOptions' defaults
};

// torch (torch.optim.Muon), dion (microsoft/dion's Dion), nanochat (nanochat's matrices), in
// that order.
const std::vector<MuonPreset>& muon_presets();

// The preset named `name`; throws muon::Error naming the valid ones for another.
const MuonPreset& muon_preset(const std::string& name);

// "torch, dion, nanochat".
std::string muon_preset_names();

// Writes into `into` every option whose value in `preset` differs from MuonOptions' default —
// what a preset sets, leaving the rest (storage dtype, kernels, ...) as they were.
void apply_muon_preset(const MuonOptions& preset, MuonOptions& into);

}  // namespace muon
