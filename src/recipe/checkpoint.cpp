#include "muon/checkpoint.h"

#include <ATen/core/Dict.h>
#include <fcntl.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "muon/compat.h"
#include "muon/error.h"

namespace muon {
namespace {

constexpr const char* kFormat = "muon-cpp checkpoint";
constexpr int64_t kVersion = 1;

using Dict = c10::Dict<std::string, c10::IValue>;  // read side (typed view of a generic dict)

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// The options of the hybrid group holding each parameter.
std::map<const void*, const torch::optim::OptimizerOptions*> options_by_param(
    const HybridOptimizer& opt) {
  std::map<const void*, const torch::optim::OptimizerOptions*> out;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) out[p.unsafeGetTensorImpl()] = &group.options();
  }
  return out;
}

torch::optim::OptimizerParamState* state_slot(HybridOptimizer& opt, const at::Tensor& p) {
  torch::optim::Optimizer* branch = opt.role_of(p) == Role::muon
                                        ? static_cast<torch::optim::Optimizer*>(opt.muon())
                                        : static_cast<torch::optim::Optimizer*>(opt.adamw());
  if (branch == nullptr) return nullptr;
  const auto it = branch->state().find(compat::param_state_key(p));
  return it == branch->state().end() ? nullptr : it->second.get();
}

void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  const auto temporary = path + ".tmp." + std::to_string(getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  check(fd >= 0, "checkpoint: cannot write '", temporary, "': ", std::strerror(errno));
  size_t written = 0;
  while (written < bytes.size()) {
    const auto n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      ::unlink(temporary.c_str());
      throw Error("checkpoint: writing '" + temporary + "' failed: " + reason);
    }
    written += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  check(synced, "checkpoint: fsync of '", temporary, "' failed");
  check(std::rename(temporary.c_str(), path.c_str()) == 0, "checkpoint: cannot rename '", temporary,
        "' to '", path, "': ", std::strerror(errno));
}

std::map<std::string, at::Tensor> model_tensors(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters(true)) out[item.key()] = item.value();
  for (const auto& item : model.named_buffers(true)) out[item.key()] = item.value();
  return out;
}

// ---- loading: everything is checked on the file's data first ----

const c10::IValue& field(const Dict& d, const std::string& key, const std::string& where) {
  const auto it = d.find(key);
  check(it != d.end(), "checkpoint: ", where, " lacks '", key, "'");
  return it->value();
}

Dict dict_field(const Dict& d, const std::string& key, const std::string& where) {
  const auto& v = field(d, key, where);
  check(v.isGenericDict(), "checkpoint: ", where, ".", key, " is not a mapping");
  return c10::impl::toTypedDict<std::string, c10::IValue>(v.toGenericDict());
}

at::Tensor tensor_field(const Dict& d, const std::string& key, const std::string& where,
                        at::IntArrayRef shape, at::ScalarType dtype) {
  const auto& v = field(d, key, where);
  check(v.isTensor(), "checkpoint: ", where, ".", key, " is not a tensor");
  const auto t = v.toTensor();
  check(t.sizes() == shape, "checkpoint: ", where, ".", key, " has shape ", t.sizes(),
        ", this optimizer needs ", shape);
  check(t.scalar_type() == dtype, "checkpoint: ", where, ".", key, " has dtype ", t.scalar_type(),
        ", this optimizer stores ", dtype);
  check(!at::isFloatingType(t.scalar_type()) || at::isfinite(t).all().item<bool>(),
        "checkpoint: ", where, ".", key, " holds NaN or Inf");
  return t;
}

at::ScalarType state_dtype_for(const at::Tensor& p, at::ScalarType configured) {
  if (configured == at::kBFloat16) return at::kBFloat16;
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

void save_checkpoint(const std::string& path, HybridOptimizer& optimizer,
                     const torch::nn::Module* model, const std::string& config_yaml) {
  at::NoGradGuard no_grad;
  auto root = new_dict();
  root.insert("format", std::string(kFormat));
  root.insert("version", kVersion);
  root.insert("step_count", optimizer.step_count());
  root.insert("skipped_steps", optimizer.last_step().skipped_steps);
  root.insert("config", config_yaml);
  c10::List<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  root.insert("group_lrs", lrs);
  auto state = new_dict();
  for (const auto& [name, p] : optimizer.named_trainable()) {
    auto entry = new_dict();
    const auto role = optimizer.role_of(p);
    entry.insert("role", to_string(role));
    auto* slot = state_slot(optimizer, p);
    entry.insert("has_state", slot != nullptr);
    if (const auto* m = dynamic_cast<const MuonParamState*>(slot)) {
      entry.insert("step", m->step());
      entry.insert("momentum_buffer", m->momentum_buffer());
      if (m->normuon_second_moment().defined()) {
        entry.insert("normuon_second_moment", m->normuon_second_moment());
      }
    } else if (const auto* a = dynamic_cast<const AdamParamState*>(slot)) {
      entry.insert("step", a->step());
      entry.insert("exp_avg", a->exp_avg());
      entry.insert("exp_avg_sq", a->exp_avg_sq());
    }
    state.insert(name, entry);
  }
  root.insert("state", state);
  if (model != nullptr) {
    auto weights = new_dict();
    for (const auto& [name, t] : model_tensors(*model)) weights.insert(name, t.detach());
    root.insert("model", weights);
  }
  write_atomically(path, torch::jit::pickle_save(c10::IValue(root)));
}

CheckpointInfo load_checkpoint(const std::string& path, HybridOptimizer& optimizer,
                               torch::nn::Module* model) {
  std::ifstream file(path, std::ios::binary);
  check(file.good(), "checkpoint: cannot read '", path, "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  c10::IValue loaded;
  try {
    loaded = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason = reason.substr(0, reason.find('\n'));
    throw Error("checkpoint '" + path + "' is truncated or corrupt (" + reason +
                "); nothing was loaded");
  }
  check(loaded.isGenericDict(), "checkpoint '", path, "' is not a muon-cpp checkpoint");
  const auto root = c10::impl::toTypedDict<std::string, c10::IValue>(loaded.toGenericDict());
  const auto format = field(root, "format", path);
  check(format.isString() && format.toStringRef() == kFormat, "checkpoint '", path,
        "' is not a muon-cpp checkpoint");
  check(field(root, "version", path).toInt() == kVersion, "checkpoint '", path, "' has version ",
        field(root, "version", path).toInt(), "; this build reads version ", kVersion);

  // Validate the optimizer state against this optimizer's parameters.
  const auto state = dict_field(root, "state", path);
  const auto named = optimizer.named_trainable();
  const auto options = options_by_param(optimizer);
  std::set<std::string> ours;
  for (const auto& [name, p] : named) ours.insert(name);
  for (const auto& item : state) {
    check(ours.count(item.key()) != 0, "checkpoint '", path, "' has state for '", item.key(),
          "', which this model does not train; it belongs to a different model");
  }
  struct Restore {
    at::Tensor param;
    Role role;
    int64_t step;
    at::Tensor a, b, c;  // momentum, normuon | exp_avg, exp_avg_sq
  };
  std::vector<Restore> restores;
  for (const auto& [name, p] : named) {
    const auto where = "state['" + name + "']";
    check(state.contains(name), "checkpoint '", path, "' has no state for parameter '", name,
          "'; it belongs to a different model");
    const auto entry =
        c10::impl::toTypedDict<std::string, c10::IValue>(state.at(name).toGenericDict());
    const auto role = role_from_string(field(entry, "role", where).toStringRef());
    check(role == optimizer.role_of(p), "checkpoint: ", where, " was optimized by ",
          to_string(role), ", this optimizer routes it to ", to_string(optimizer.role_of(p)));
    if (!field(entry, "has_state", where).toBool()) continue;
    Restore r{p, role, field(entry, "step", where).toInt(), {}, {}, {}};
    const auto* group = options.at(p.unsafeGetTensorImpl());
    if (role == Role::muon) {
      const auto& o = static_cast<const MuonOptions&>(*group);
      r.a = tensor_field(entry, "momentum_buffer", where, p.sizes(),
                         state_dtype_for(p, o.state_dtype()));
      if (o.normuon()) {
        const auto shape = normuon_state_shape(optimizer.muon()->matrix_view(p), o.normuon()->axis);
        r.b = tensor_field(entry, "normuon_second_moment", where, shape,
                           state_dtype_for(p, at::kFloat));
      }
    } else {
      const auto& o = static_cast<const AdamWOptions&>(*group);
      const auto dtype = state_dtype_for(p, o.state_dtype());
      r.a = tensor_field(entry, "exp_avg", where, p.sizes(), dtype);
      r.b = tensor_field(entry, "exp_avg_sq", where, p.sizes(), dtype);
    }
    restores.push_back(std::move(r));
  }
  const auto lrs = field(root, "group_lrs", path).toDoubleList();
  check(lrs.size() == optimizer.param_groups().size(), "checkpoint '", path, "' has ", lrs.size(),
        " parameter groups, this optimizer ", optimizer.param_groups().size());

  // Validate the model's tensors.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  if (model != nullptr) {
    const auto weights = dict_field(root, "model", path);
    const auto tensors = model_tensors(*model);
    for (const auto& item : weights) {
      check(tensors.count(item.key()) != 0, "checkpoint '", path, "' has model tensor '",
            item.key(), "', which this model does not have");
    }
    for (const auto& [name, t] : tensors) {
      check(weights.contains(name), "checkpoint '", path, "' lacks model tensor '", name, "'");
      copies.emplace_back(t, tensor_field(weights, name, "model", t.sizes(), t.scalar_type()));
    }
  }

  // Everything checked: apply.
  at::NoGradGuard no_grad;
  for (auto& r : restores) {
    torch::optim::Optimizer& branch =
        r.role == Role::muon ? static_cast<torch::optim::Optimizer&>(*optimizer.muon())
                             : static_cast<torch::optim::Optimizer&>(*optimizer.adamw());
    if (r.role == Role::muon) {
      auto s = std::make_unique<MuonParamState>();
      s->step(r.step);
      s->momentum_buffer(r.a.clone().to(r.param.device()));
      if (r.b.defined()) s->normuon_second_moment(r.b.clone().to(r.param.device()));
      branch.state()[compat::param_state_key(r.param)] = std::move(s);
    } else {
      auto s = std::make_unique<AdamParamState>();
      s->step(r.step);
      s->exp_avg(r.a.clone().to(r.param.device()));
      s->exp_avg_sq(r.b.clone().to(r.param.device()));
      branch.state()[compat::param_state_key(r.param)] = std::move(s);
    }
  }
  for (size_t g = 0; g < lrs.size(); ++g) optimizer.param_groups()[g].options().set_lr(lrs[g]);
  for (auto& [target, source] : copies) target.copy_(source);
  const auto step_count = field(root, "step_count", path).toInt();
  optimizer.restore_counters(step_count, field(root, "skipped_steps", path).toInt());
  return {step_count, field(root, "config", path).toStringRef()};
}

}  // namespace muon
