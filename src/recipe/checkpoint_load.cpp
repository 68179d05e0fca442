// Reading checkpoints (muon/checkpoint.h): everything is checked on the file's data — format,
// every parameter's role, algorithm and state, the model's tensors — before the first change.
#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "archive_check.h"
#include "checkpoint_format.h"
#include "muon/checkpoint.h"
#include "muon/error.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using detail::kFormat;
using detail::kVersion;
using detail::model_tensors;
using Dict = c10::Dict<std::string, c10::IValue>;  // a typed view of a generic dict

// The file's bytes for LibTorch's zip reader, which asks for ranges the (possibly corrupt) central
// directory names: a range past the end yields what exists, never memory beyond the buffer.
// (LibTorch 1.13's own vector reader copies past the end of a truncated file — found by the
// sanitizer build on our truncated-checkpoint test.)
class BoundedReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(std::vector<char> bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    const size_t available = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, available);
    return available;
  }

 private:
  std::vector<char> bytes_;
};

// torch::jit::pickle_load over a BoundedReader, after checking that every size in the archive is
// bounded by the file (archive_check.h).
c10::IValue read_archive(std::vector<char> bytes) {
  detail::check_zip_structure(bytes);
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedReader>(std::move(bytes)));
  const auto [pickle, pickle_size] = reader.getRecord("data.pkl");
  detail::check_pickle_structure(std::string(static_cast<const char*>(pickle.get()), pickle_size));
  return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                           /*type_resolver=*/c10::nullopt,
                                           /*obj_loader=*/c10::nullopt, /*device=*/c10::nullopt,
                                           reader);
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

// A tensor read from the file, refused unless its storage holds every element its sizes and
// strides reach (LibTorch 1.13 rebuilds tensors from a corrupt file without that check, with a
// null or short storage — found by fuzzing).
at::Tensor file_tensor(const c10::IValue& v, const std::string& where) {
  check(v.isTensor(), "checkpoint: ", where, " is not a tensor");
  const auto t = v.toTensor();
  check(t.layout() == at::kStrided && t.device().is_cpu(), "checkpoint: ", where,
        " is not a dense CPU tensor");
  if (t.numel() == 0) return t;
  int64_t last = t.storage_offset();
  bool valid = t.has_storage() && t.storage().data() != nullptr && last >= 0;
  for (int64_t d = 0; valid && d < t.dim(); ++d) {
    valid = t.stride(d) >= 0;
    last += (t.size(d) - 1) * t.stride(d);
  }
  valid = valid && static_cast<uint64_t>(last + 1) * t.element_size() <= t.storage().nbytes();
  check(valid, "checkpoint: ", where, " has sizes ", t.sizes(),
        " that its stored data does not cover; the file is corrupt");
  return t;
}

at::Tensor tensor_field(const Dict& d, const std::string& key, const std::string& where,
                        at::IntArrayRef shape, at::ScalarType dtype) {
  const auto t = file_tensor(field(d, key, where), where + "." + key);
  check(t.sizes() == shape, "checkpoint: ", where, ".", key, " has shape ", t.sizes(),
        ", this optimizer needs ", shape);
  check(t.scalar_type() == dtype, "checkpoint: ", where, ".", key, " has dtype ", t.scalar_type(),
        ", this optimizer stores ", dtype);
  check(!at::isFloatingType(t.scalar_type()) || at::isfinite(t).all().item<bool>(),
        "checkpoint: ", where, ".", key, " holds NaN or Inf");
  return t;
}

}  // namespace

namespace {

// Everything load_checkpoint() will change, decided (and checked) before the first change.
struct LoadPlan {
  std::vector<std::pair<at::Tensor, ParamStateEntry>> restores;
  std::vector<std::string> converted;  // state brought to this run's precision, one line each
  std::vector<double> lrs;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // model tensor ← file tensor
  int64_t step_count = 0, skipped_steps = 0;
  std::string config;
};

// The state saved for `p` (named `name`) in `entry`, checked against what this optimizer runs
// on it; none when the entry holds no state yet.
std::optional<ParamStateEntry> saved_state(const Dict& entry, const std::string& name,
                                           const at::Tensor& p, const HybridOptimizer& optimizer,
                                           std::vector<std::string>& converted) {
  const auto entry_name = "state['" + name + "']";
  const auto where = "checkpoint: " + entry_name;
  // (Version 1 named the roles muon and adamw.)
  const auto role = role_from_string(current_role_name(field(entry, "role", where).toStringRef()));
  check(role == optimizer.role_of(p), where, " was routed to the ", to_string(role),
        ", this optimizer routes it to the ", to_string(optimizer.role_of(p)));
  // AdamW, Adam and Lamb keep the same tensors: the name tells them apart (checkpoints written
  // before the partition have none, and then ran Muon or AdamW, which the role says).
  if (entry.contains("algorithm")) {
    std::string saved_by = field(entry, "algorithm", where).toStringRef();
    // Dion was a Muon setting before it was an algorithm: such entries say muon and hold dion_q
    // (or, without state yet, nothing that tells them apart: no state to misread either).
    const bool stateless = !field(entry, "has_state", where).toBool();
    const bool ran_dion =
        entry.contains("dion_q") || (stateless && optimizer.algorithm_of(p) == std::string("dion"));
    if (saved_by == "muon" && ran_dion) saved_by = "dion";
    check(saved_by == optimizer.algorithm_of(p), where, " was optimized by ", saved_by,
          ", this optimizer runs ", optimizer.algorithm_of(p), " on it");
  }
  if (!field(entry, "has_state", where).toBool()) return std::nullopt;
  ParamStateEntry saved;
  for (const auto& item : entry) {
    const auto& key = item.key();
    if (key == "role" || key == "algorithm" || key == "has_state") continue;
    if (key == "step") {
      check(item.value().isInt(), where, ".step is not an integer");
      saved.step = item.value().toInt();
    } else {
      saved.tensors[key] = file_tensor(item.value(), entry_name + "." + key);
    }
  }
  for (const auto& line : convert_state_precision(optimizer, p, saved, where)) {
    converted.push_back(name + ": " + line);
  }
  check_param_state(optimizer, p, saved, where);
  return saved;
}

// The model's tensors paired with the file's, every name, shape and dtype checked.
std::vector<std::pair<at::Tensor, at::Tensor>> model_copies(const Dict& root,
                                                            const std::string& path,
                                                            torch::nn::Module& model) {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  const auto weights = dict_field(root, "model", path);
  const auto tensors = model_tensors(model);
  for (const auto& item : weights) {
    check(tensors.count(item.key()) != 0, "checkpoint '", path, "' has model tensor '",
          item.key(), "', which this model does not have");
  }
  for (const auto& [name, t] : tensors) {
    check(weights.contains(name), "checkpoint '", path, "' lacks model tensor '", name, "'");
    copies.emplace_back(t, tensor_field(weights, name, "model", t.sizes(), t.scalar_type()));
  }
  return copies;
}

LoadPlan plan_load(const c10::IValue& loaded, const std::string& path, HybridOptimizer& optimizer,
                   torch::nn::Module* model) {
  LoadPlan plan;
  check(loaded.isGenericDict(), "checkpoint '", path, "' is not a muon-cpp checkpoint");
  const auto root = c10::impl::toTypedDict<std::string, c10::IValue>(loaded.toGenericDict());
  const auto format = field(root, "format", path);
  check(format.isString() && format.toStringRef() == kFormat, "checkpoint '", path,
        "' is not a muon-cpp checkpoint");
  const auto version = field(root, "version", path);
  check(
      version.isInt() && version.toInt() >= detail::kEarliestVersion && version.toInt() <= kVersion,
      "checkpoint '", path, "' has version ", version, "; this build reads versions ",
      detail::kEarliestVersion, " to ", kVersion);
  // The optimizer state against this optimizer's parameters, both ways.
  const auto state = dict_field(root, "state", path);
  const auto named = optimizer.named_trainable();
  std::set<std::string> ours;
  for (const auto& [name, p] : named) ours.insert(name);
  for (const auto& item : state) {
    check(ours.count(item.key()) != 0, "checkpoint '", path, "' has state for '", item.key(),
          "', which this model does not train; it belongs to a different model");
  }
  for (const auto& [name, p] : named) {
    check(state.contains(name), "checkpoint '", path, "' has no state for parameter '", name,
          "'; it belongs to a different model");
    auto saved = saved_state(dict_field(state, name, "checkpoint: state"), name, p, optimizer,
                             plan.converted);
    if (saved) plan.restores.emplace_back(p, std::move(*saved));
  }
  const auto lrs = field(root, "group_lrs", path).toDoubleList();
  check(lrs.size() == optimizer.param_groups().size(), "checkpoint '", path, "' has ", lrs.size(),
        " parameter groups, this optimizer ", optimizer.param_groups().size());
  plan.lrs.assign(lrs.begin(), lrs.end());
  plan.step_count = field(root, "step_count", path).toInt();
  plan.skipped_steps = field(root, "skipped_steps", path).toInt();
  check(plan.step_count >= 0 && plan.skipped_steps >= 0, "checkpoint '", path,
        "' has negative step counters");
  plan.config = field(root, "config", path).toStringRef();
  if (model != nullptr) plan.copies = model_copies(root, path, *model);
  return plan;
}

}  // namespace

namespace {

// The archive at `path`, read within its declared sizes; errors name the file.
c10::IValue read_checkpoint_file(const std::string& path) {
  std::error_code error;
  check(std::filesystem::is_regular_file(path, error), "checkpoint: cannot read '", path, "': ",
        std::filesystem::exists(path, error) ? "it is not a regular file" : "it does not exist");
  std::ifstream file(path, std::ios::binary);
  check(file.good(), "checkpoint: cannot read '", path, "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  try {
    return read_archive(bytes);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason = reason.substr(0, reason.find('\n'));
    throw Error("checkpoint '" + path + "' is truncated or corrupt (" + reason +
                "); nothing was loaded");
  }
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const auto loaded = read_checkpoint_file(path);
  try {
    check(loaded.isGenericDict(), "checkpoint '", path, "' is not a muon-cpp checkpoint");
    const auto root = c10::impl::toTypedDict<std::string, c10::IValue>(loaded.toGenericDict());
    const auto format = field(root, "format", path);
    check(format.isString() && format.toStringRef() == kFormat, "checkpoint '", path,
          "' is not a muon-cpp checkpoint");
    const auto step = field(root, "step_count", path);
    check(step.isInt() && step.toInt() >= 0, "checkpoint '", path, "' has no valid step_count");
    return {step.toInt(), field(root, "config", path).toStringRef(), {}};
  } catch (const c10::Error& e) {
    std::string reason = e.what_without_backtrace();
    throw Error("checkpoint '" + path + "' is malformed (" + reason.substr(0, reason.find('\n')) +
                ")");
  }
}

CheckpointInfo load_checkpoint(const std::string& path, HybridOptimizer& optimizer,
                               torch::nn::Module* model) {
  const auto loaded = read_checkpoint_file(path);
  LoadPlan plan;
  try {
    plan = plan_load(loaded, path, optimizer, model);
  } catch (const c10::Error& e) {  // a value of the wrong type where the format has another
    std::string reason = e.what_without_backtrace();
    reason = reason.substr(0, reason.find('\n'));
    throw Error("checkpoint '" + path + "' is malformed (" + reason + "); nothing was loaded");
  }

  // Everything checked: apply.
  at::NoGradGuard no_grad;
  for (const auto& [p, saved] : plan.restores) {
    // With ranks, each keeps the state of the parameters it owns: N ranks' file resumes on M.
    if (optimizer.owns(p)) write_param_state(optimizer, p, saved);
  }
  for (size_t g = 0; g < plan.lrs.size(); ++g) {
    optimizer.param_groups()[g].options().set_lr(plan.lrs[g]);
  }
  for (auto& [target, source] : plan.copies) target.copy_(source);
  optimizer.restore_counters(plan.step_count, plan.skipped_steps);
  return {plan.step_count, plan.config, plan.converted};
}

}  // namespace muon
