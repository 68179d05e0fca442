// Other projects' settings for the matrices by name, in one table: muon::muon_preset, the
// configuration's `preset:` and optimizer name `dion`, `muon train --optimizer dion`, and the
// Python `Muon(preset=...)` / `Dion` defaults all read it (docs/algorithms.md §Presets).
//
//   muon::Muon opt(params, muon::MuonOptions(muon::muon_preset("torch").muon()).lr(3e-3));
#pragma once

#include <string>
#include <vector>

#include "muon/algorithms.h"

namespace muon {

struct MuonPreset {
  const char* name;
  const char* origin;        // whose defaults they are (docs, --help)
  AlgorithmOptions options;  // MuonOptions, or DionOptions (dion); what it does not set is the
                             // algorithm's default
  // The options of a preset that runs Muon; throws muon::Error naming the preset otherwise.
  const MuonOptions& muon() const;
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
