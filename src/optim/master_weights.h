// Internal to the algorithms layer: bfloat16 parameters updated at fp32 precision without an fp32
// master copy — modded-nanogpt's mantissa tracking (train_gpt.py, NorMuonAndAdam). A bf16 value is
// the high half of an fp32 value; a 16-bit state tensor `mantissa` keeps the low half, so the
// pair is the exact fp32 weight: 6 bytes per parameter where bf16 weights plus an fp32 master
// take 10. Each step joins the halves, runs the update on the fp32 value as for an fp32 parameter,
// and splits the result again — the bf16 weight is the fp32 weight truncated towards zero.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "muon/algorithm.h"

namespace muon::detail {

// The mantissa of `param` in `state` (a state whose list has `mantissa`, made as zeros — the bf16
// value exactly — with the state); undefined when `param` is not tracked (tracks_mantissa in
// muon/algorithm.h).
template <class State>
at::Tensor mantissa_of(bool option, const at::Tensor& param, State& state) {
  if (!tracks_mantissa(option, param)) return {};
  return state.mantissa();
}

// The fp32 tensor whose values have `param` (bf16) as their high and `mantissa` (int16) as their
// low 16 bits.
at::Tensor join_halves(const at::Tensor& param, const at::Tensor& mantissa);

// Writes the high halves of fp32 `master` into `param` (bf16) and the low halves into `mantissa`.
void split_halves(const at::Tensor& master, at::Tensor& param, at::Tensor& mantissa);

// Runs `update(items)` with each item whose `mantissa(item)` returns a defined tensor standing
// for its fp32 value (its bf16 gradient widened, exactly), then splits the results back into
// parameter and mantissa. Items without a mantissa pass through unchanged.
template <class Item, class Mantissa, class Update>
void with_master_weights(const std::vector<Item>& items, Mantissa&& mantissa, Update&& update) {
  std::vector<Item> work = items;
  std::vector<size_t> tracked;
  for (size_t i = 0; i < work.size(); ++i) {
    const at::Tensor m = mantissa(items[i]);
    if (!m.defined()) continue;
    work[i].param = join_halves(items[i].param, m);
    work[i].grad = items[i].grad.to(at::kFloat);
    tracked.push_back(i);
  }
  update(work);
  for (const auto i : tracked) {
    auto param = items[i].param;
    auto m = mantissa(items[i]);
    split_halves(work[i].param, param, m);
    param.unsafeGetTensorImpl()->bump_version();
  }
}

// with_master_weights for the items of an elementwise rule whose options have mantissa_tracking:
// the mantissa of each tracked item lives in its state.
template <class Options, class Item, class Update>
void with_tracked_mantissas(const Options& options, const std::vector<Item>& items,
                            Update&& update) {
  with_master_weights(
      items,
      [&](const Item& item) {
        return mantissa_of(options.mantissa_tracking(), item.param, *item.state);
      },
      std::forward<Update>(update));
}

}  // namespace muon::detail
