// Internal to the algorithms layer: the steps of the Muon update that Dion shares with it.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "muon/rules.h"

namespace muon::detail {

// The gradient the momentum accumulates: g, or g + λ·W under weight_decay_method l2.
at::Tensor momentum_gradient(const at::Tensor& grad, const at::Tensor& p, const MuonOptions& o);

// The end of every Muon-family step, whatever made the direction U (Newton–Schulz or Dion):
// W ← W·(1 − decay_fraction) − lr·factor·U (decay masked to U·W ≥ 0 with cautious weight decay),
// computed in U's dtype and rounded once into W — with `cautious`, entries where
// (W_old − W_new)·g ≤ 0 keep W_old — then the item's step is counted.
void finish_step(const MuonItem& item, const at::Tensor& U, double factor);

// One Dion step of every item (its options' dion set; docs/design.md, "Dion").
void dion_update(const std::vector<MuonItem>& items);

}  // namespace muon::detail
