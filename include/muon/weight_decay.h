// How an optimizer applies weight decay λ at learning rate lr. The four methods are those of
// NVIDIA's Emerging-Optimizers (emerging_optimizers/mixin.py); the Adam family and Muon share them.
#pragma once

#include <array>
#include <string>
#include <utility>

#include "muon/enum_names.h"

namespace muon {

enum class WeightDecayMethod {
  decoupled,    // W ← W·(1 − lr·λ) (Loshchilov & Hutter; AdamW, Muon's default)
  independent,  // W ← W·(1 − λ): not scaled by the learning rate
  l2,           // g ← g + λ·W before the moments or momentum (coupled; Adam's default)
  palm,         // W ← W·(1 − lr²·λ) (PaLM, arXiv 2204.02311, decays by lr²)
};

template <>
struct EnumNames<WeightDecayMethod> {
  static constexpr const char* noun = "weight decay method";
  static constexpr const char* plural = "methods";
  static constexpr std::array<std::pair<WeightDecayMethod, const char*>, 4> table{
      {{WeightDecayMethod::decoupled, "decoupled"},
       {WeightDecayMethod::independent, "independent"},
       {WeightDecayMethod::l2, "l2"},
       {WeightDecayMethod::palm, "palm"}}};
};
inline std::string to_string(WeightDecayMethod method) {
  return enum_name(method);
}

// The fraction of W a step removes before the update: lr·λ, λ or lr²·λ; 0 for l2, which adds
// l2_coefficient()·W to the gradient instead.
inline double decay_fraction(WeightDecayMethod method, double lr, double weight_decay) {
  switch (method) {
    case WeightDecayMethod::decoupled:
      return lr * weight_decay;
    case WeightDecayMethod::independent:
      return weight_decay;
    case WeightDecayMethod::palm:
      return lr * lr * weight_decay;
    case WeightDecayMethod::l2:
      return 0.0;
  }
  return 0.0;
}

// The multiple of W added to the gradient: λ for l2, 0 otherwise.
inline double l2_coefficient(WeightDecayMethod method, double weight_decay) {
  return method == WeightDecayMethod::l2 ? weight_decay : 0.0;
}

}  // namespace muon
