#include "muon/param_state.h"

#include <set>
#include <vector>

#include "muon/adam.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/muon.h"

namespace muon {
namespace {

const torch::optim::OptimizerOptions& group_options(const torch::optim::Optimizer& optimizer,
                                                    const at::Tensor& param) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.is_same(param)) return group.options();
    }
  }
  throw Error("the parameter is not one of this optimizer's");
}

// Full precision state is fp32, fp64 for fp64 parameters; bf16 when configured.
at::ScalarType stored_dtype(const at::Tensor& p, at::ScalarType configured) {
  if (configured == at::kBFloat16) return at::kBFloat16;
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

template <class Options>
const Options* options_as(const torch::optim::OptimizerOptions& o) {
  return dynamic_cast<const Options*>(&o);
}

const torch::optim::OptimizerParamState* find_state(const torch::optim::Optimizer& optimizer,
                                                    const at::Tensor& param) {
  const auto it = optimizer.state().find(compat::param_state_key(param));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

}  // namespace

std::vector<StateSlot> expected_state_slots(const torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param) {
  const auto& options = group_options(optimizer, param);
  const auto shape = param.sizes().vec();
  if (const auto* m = options_as<MuonOptions>(options)) {
    std::vector<StateSlot> slots{{"momentum_buffer", shape, stored_dtype(param, m->state_dtype())}};
    if (m->normuon()) {
      const auto view = static_cast<const Muon&>(optimizer).matrix_view(param);
      slots.push_back({"normuon_second_moment", normuon_state_shape(view, m->normuon()->axis),
                       stored_dtype(param, at::kFloat)});
    }
    return slots;
  }
  at::ScalarType dtype = at::kFloat;
  if (const auto* o = options_as<AdamWOptions>(options)) {
    dtype = o->state_dtype();
  } else if (const auto* o = options_as<AdamOptions>(options)) {
    dtype = o->state_dtype();
  } else {
    check(options_as<LambOptions>(options) != nullptr,
          "optimizer state: only Muon, AdamW, Adam and Lamb state can be read or written");
  }
  dtype = stored_dtype(param, dtype);
  return {{"exp_avg", shape, dtype}, {"exp_avg_sq", shape, dtype}};
}

std::optional<ParamStateEntry> read_param_state(const torch::optim::Optimizer& optimizer,
                                                const at::Tensor& param) {
  const auto* state = find_state(optimizer, param);
  if (state == nullptr) return std::nullopt;
  ParamStateEntry entry;
  if (const auto* m = dynamic_cast<const MuonParamState*>(state)) {
    entry.step = m->step();
    entry.tensors["momentum_buffer"] = m->momentum_buffer();
    const auto& options = static_cast<const MuonOptions&>(group_options(optimizer, param));
    if (options.normuon() && m->normuon_second_moment().defined()) {
      entry.tensors["normuon_second_moment"] = m->normuon_second_moment();
    }
  } else if (const auto* a = dynamic_cast<const AdamParamState*>(state)) {
    entry.step = a->step();
    entry.tensors["exp_avg"] = a->exp_avg();
    entry.tensors["exp_avg_sq"] = a->exp_avg_sq();
  } else {
    throw Error("optimizer state: only Muon, AdamW, Adam and Lamb state can be read or written");
  }
  return entry;
}

void check_param_state(const torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamStateEntry& entry, const std::string& where) {
  check(entry.step >= 0, where, ".step is ", entry.step, "; a step count is ≥ 0");
  std::set<std::string> expected;
  for (const auto& slot : expected_state_slots(optimizer, param)) {
    expected.insert(slot.name);
    const auto it = entry.tensors.find(slot.name);
    check(it != entry.tensors.end(), where, " lacks '", slot.name, "'");
    const auto& t = it->second;
    check(t.defined(), where, ".", slot.name, " is not a tensor");
    check(t.sizes() == at::IntArrayRef(slot.shape), where, ".", slot.name, " has shape ",
          t.sizes(), ", this optimizer needs ", at::IntArrayRef(slot.shape));
    check(t.scalar_type() == slot.dtype, where, ".", slot.name, " has dtype ", t.scalar_type(),
          ", this optimizer stores ", slot.dtype);
    check(t.layout() == at::kStrided, where, ".", slot.name, " is sparse; state is dense");
    check(at::isfinite(t).all().item<bool>(), where, ".", slot.name, " holds NaN or Inf");
  }
  std::string valid;
  for (const auto& e : expected) valid += (valid.empty() ? "" : ", ") + e;
  for (const auto& [name, t] : entry.tensors) {
    check(expected.count(name) != 0, where, " has '", name,
          "', which this optimizer does not keep (it keeps ", valid, ")");
  }
}

void write_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamStateEntry& entry) {
  const auto copy = [&](const std::string& name) {
    const auto it = entry.tensors.find(name);
    if (it == entry.tensors.end()) return at::Tensor();
    return it->second.to(param.device(), /*non_blocking=*/false, /*copy=*/true)
        .contiguous();
  };
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  if (options_as<MuonOptions>(group_options(optimizer, param)) != nullptr) {
    auto m = std::make_unique<MuonParamState>();
    m->step(entry.step);
    m->momentum_buffer(copy("momentum_buffer"));
    m->normuon_second_moment(copy("normuon_second_moment"));
    state = std::move(m);
  } else {
    auto a = std::make_unique<AdamParamState>();
    a->step(entry.step);
    a->exp_avg(copy("exp_avg"));
    a->exp_avg_sq(copy("exp_avg_sq"));
    state = std::move(a);
  }
  optimizer.state()[compat::param_state_key(param)] = std::move(state);
}

}  // namespace muon
