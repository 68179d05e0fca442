#include "muon/param_state.h"

#include <set>
#include <string>
#include <vector>

#include "muon/adam.h"
#include "muon/compat.h"
#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/muon.h"
#include "muon/rules.h"
#include "master_weights.h"

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

at::ScalarType stored_dtype(const at::Tensor& p, at::ScalarType configured) {
  return state_storage_dtype(p.scalar_type(), configured);
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
    const auto* views = dynamic_cast<const MatrixViews*>(&optimizer);
    const auto view = views != nullptr ? views->matrix_view(param) : shape;
    if (m->normuon()) {
      slots.push_back({"normuon_second_moment", normuon_state_shape(view, m->normuon()->axis),
                       stored_dtype(param, at::kFloat)});
    }
    if (m->dion()) {
      slots.push_back({"dion_q", dion_q_shape(*m->dion(), view), stored_dtype(param, at::kFloat)});
    }
    if (detail::tracks_mantissa(m->mantissa_tracking(), param)) {
      slots.push_back({"mantissa", shape, at::kShort});
    }
    return slots;
  }
  at::ScalarType dtype = at::kFloat;
  bool mantissa = false;
  if (const auto* o = options_as<AdamWOptions>(options)) {
    dtype = o->state_dtype();
    mantissa = o->mantissa_tracking();
  } else if (const auto* o = options_as<AdamOptions>(options)) {
    dtype = o->state_dtype();
    mantissa = o->mantissa_tracking();
  } else {
    const auto* lamb = options_as<LambOptions>(options);
    check(lamb != nullptr,
          "optimizer state: only Muon, AdamW, Adam and Lamb state can be read or written");
    mantissa = lamb->mantissa_tracking();
  }
  dtype = stored_dtype(param, dtype);
  std::vector<StateSlot> slots{{"exp_avg", shape, dtype}, {"exp_avg_sq", shape, dtype}};
  if (detail::tracks_mantissa(mantissa, param)) slots.push_back({"mantissa", shape, at::kShort});
  return slots;
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
    if (m->mantissa().defined()) entry.tensors["mantissa"] = m->mantissa();
    if (options.dion() && m->dion_q().defined()) entry.tensors["dion_q"] = m->dion_q();
  } else if (const auto* a = dynamic_cast<const AdamParamState*>(state)) {
    entry.step = a->step();
    entry.tensors["exp_avg"] = a->exp_avg();
    entry.tensors["exp_avg_sq"] = a->exp_avg_sq();
    if (a->mantissa().defined()) entry.tensors["mantissa"] = a->mantissa();
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
    check(t.sizes() == at::IntArrayRef(slot.shape), where, ".", slot.name, " has shape ", t.sizes(),
          ", this optimizer needs ", at::IntArrayRef(slot.shape));
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
    return it->second.to(param.device(), /*non_blocking=*/false, /*copy=*/true).contiguous();
  };
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  if (options_as<MuonOptions>(group_options(optimizer, param)) != nullptr) {
    auto m = std::make_unique<MuonParamState>();
    m->step(entry.step);
    m->momentum_buffer(copy("momentum_buffer"));
    m->normuon_second_moment(copy("normuon_second_moment"));
    m->mantissa(copy("mantissa"));
    m->dion_q(copy("dion_q"));
    state = std::move(m);
  } else {
    auto a = std::make_unique<AdamParamState>();
    a->step(entry.step);
    a->exp_avg(copy("exp_avg"));
    a->exp_avg_sq(copy("exp_avg_sq"));
    a->mantissa(copy("mantissa"));
    state = std::move(a);
  }
  optimizer.state()[compat::param_state_key(param)] = std::move(state);
}

namespace {

constexpr int64_t kArchiveVersion = 1;

// The settings of a group that change during training, by name.
template <class O>
std::map<std::string, double> adam_settings(const O& o) {
  return {{"lr", o.lr()},
          {"weight_decay", o.weight_decay()},
          {"beta1", std::get<0>(o.betas())},
          {"beta2", std::get<1>(o.betas())},
          {"eps", o.eps()}};
}

template <class O>
void set_adam_settings(O& o, std::map<std::string, double> v) {
  o.lr(v["lr"]).weight_decay(v["weight_decay"]).betas({v["beta1"], v["beta2"]}).eps(v["eps"]);
}

std::map<std::string, double> settings_of(const torch::optim::OptimizerOptions& options) {
  if (const auto* m = options_as<MuonOptions>(options)) {
    return {{"lr", m->lr()}, {"weight_decay", m->weight_decay()}, {"momentum", m->momentum()}};
  }
  if (const auto* o = options_as<AdamWOptions>(options)) return adam_settings(*o);
  if (const auto* o = options_as<AdamOptions>(options)) return adam_settings(*o);
  if (const auto* o = options_as<LambOptions>(options)) return adam_settings(*o);
  throw Error("optimizer state: only Muon, AdamW, Adam and Lamb groups can be saved or loaded");
}

void set_settings(torch::optim::OptimizerOptions& options, const std::map<std::string, double>& v) {
  if (auto* m = dynamic_cast<MuonOptions*>(&options)) {
    m->lr(v.at("lr")).weight_decay(v.at("weight_decay")).momentum(v.at("momentum"));
  } else if (auto* o = dynamic_cast<AdamWOptions*>(&options)) {
    set_adam_settings(*o, v);
  } else if (auto* o = dynamic_cast<AdamOptions*>(&options)) {
    set_adam_settings(*o, v);
  } else if (auto* o = dynamic_cast<LambOptions*>(&options)) {
    set_adam_settings(*o, v);
  }
}

void check_settings(const torch::optim::OptimizerOptions& options, size_t g) {
  with_context(detail::concat("optimizer archive: param group ", g),
               [&] { check_group_options(options); });
}

std::string group_key(size_t g) {
  return detail::concat("param_groups/", g, "/");
}

std::string state_key(size_t g, size_t i) {
  return detail::concat("state/", g, "/", i, "/");
}

c10::IValue read_value(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  check(archive.try_read(key, value), "optimizer archive: '", key,
        "' is missing; it was not written by this optimizer's save()");
  return value;
}

}  // namespace

void save_optimizer_state(const torch::optim::Optimizer& optimizer,
                          torch::serialize::OutputArchive& archive) {
  archive.write("muon_optimizer_archive", c10::IValue(kArchiveVersion));
  const auto& groups = optimizer.param_groups();
  archive.write("param_groups/count", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    archive.write(group_key(g) + "size", c10::IValue(static_cast<int64_t>(params.size())));
    for (const auto& [name, value] : settings_of(groups[g].options())) {
      archive.write(group_key(g) + name, c10::IValue(value));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const auto entry = read_param_state(optimizer, params[i]);
      if (!entry) continue;
      archive.write(state_key(g, i) + "step", c10::IValue(entry->step));
      for (const auto& [name, t] : entry->tensors) archive.write(state_key(g, i) + name, t);
    }
  }
}

void load_optimizer_state(torch::optim::Optimizer& optimizer,
                          torch::serialize::InputArchive& archive) {
  c10::IValue version;
  check(archive.try_read("muon_optimizer_archive", version) && version.isInt() &&
            version.toInt() == kArchiveVersion,
        "optimizer archive: not written by a muon-cpp optimizer's save() (format ", kArchiveVersion,
        ")");
  auto& groups = optimizer.param_groups();
  const auto count = read_value(archive, "param_groups/count").toInt();
  check(count == static_cast<int64_t>(groups.size()), "optimizer archive: it has ", count,
        " param groups, this optimizer ", groups.size());
  // Everything is read and checked before anything is written.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<std::pair<at::Tensor, ParamStateEntry>> states;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    const auto size = read_value(archive, group_key(g) + "size").toInt();
    check(size == static_cast<int64_t>(params.size()), "optimizer archive: param group ", g,
          " has ", size, " parameters, this optimizer's ", params.size());
    auto values = settings_of(groups[g].options());
    for (auto& [name, value] : values) value = read_value(archive, group_key(g) + name).toDouble();
    options.push_back(groups[g].options().clone());
    set_settings(*options.back(), values);
    check_settings(*options.back(), g);
    for (size_t i = 0; i < params.size(); ++i) {
      c10::IValue step;
      if (!archive.try_read(state_key(g, i) + "step", step)) continue;
      ParamStateEntry entry;
      entry.step = step.toInt();
      for (const auto& slot : expected_state_slots(optimizer, params[i])) {
        at::Tensor t;
        if (archive.try_read(state_key(g, i) + slot.name, t)) entry.tensors[slot.name] = t;
      }
      check_param_state(optimizer, params[i], entry,
                        detail::concat("parameter ", i, " of param group ", g));
      states.emplace_back(params[i], std::move(entry));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(options[g]));
  optimizer.state().clear();
  for (const auto& [param, entry] : states) write_param_state(optimizer, param, entry);
}

}  // namespace muon
