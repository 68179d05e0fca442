// The table of Muon presets (muon/presets.h).
#include "muon/presets.h"

#include "muon/error.h"

namespace muon {

namespace {

std::vector<MuonPreset> make_presets() {
  return {
      // torch.optim.Muon's constructor defaults (PyTorch 2.9+): its eps guards max(‖X‖_F, eps).
      {"torch", "torch.optim.Muon", MuonOptions(1e-3).weight_decay(0.1).ns_eps(1e-7)},
      // microsoft/dion (Ahn et al., arXiv 2504.05295): its own algorithm, whose defaults are
      // dion's.
      {"dion", "microsoft/dion's Dion", DionOptions()},
      // nanochat's matrix group at d_model 768 (its NorMuon with Polar Express coefficients and
      // cautious weight decay); nanochat_preset() scales it and adds the other groups.
      {"nanochat", "nanochat's Muon",
       MuonOptions(0.02)
           .coefficients(CoefficientTable::polar_express())
           .normuon(NorMuonOptions{0.9})
           .cautious_weight_decay(true)
           .weight_decay(0.28)},
  };
}

}  // namespace

const std::vector<MuonPreset>& muon_presets() {
  static const auto presets = make_presets();
  return presets;
}

std::string muon_preset_names() {
  std::string out;
  for (const auto& p : muon_presets()) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

const MuonOptions& MuonPreset::muon() const {
  const auto* muon = options.as<MuonOptions>();
  check(muon != nullptr, "the preset ", name, " runs ", algorithm_name(*options), ", not Muon");
  return *muon;
}

const MuonPreset& muon_preset(const std::string& name) {
  for (const auto& p : muon_presets()) {
    if (name == p.name) return p;
  }
  throw Error("unknown Muon preset '" + name + "'; valid presets are " + muon_preset_names());
}

void apply_muon_preset(const MuonOptions& preset, MuonOptions& into) {
  const MuonOptions defaults;
#define MUON_SET_WHERE_CHANGED(T, name, def, range, doc) \
  if (!(preset.name() == defaults.name())) into.name(preset.name());
  MUON_MUON_OPTIONS(MUON_SET_WHERE_CHANGED)
#undef MUON_SET_WHERE_CHANGED
}

}  // namespace muon
