#include "muon/checkpoint.h"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fcntl.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "archive_check.h"
#include "muon/compat.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/param_state.h"

namespace muon {
namespace {

constexpr const char* kFormat = "muon-cpp checkpoint";
constexpr int64_t kVersion = 1;

using Dict = c10::Dict<std::string, c10::IValue>;  // read side (typed view of a generic dict)

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// `p`'s state as its owner rank keeps it, on every rank (a collective: all ranks call it for the
// same parameters in the same order).
std::optional<ParamStateEntry> from_owner(Communicator& communicator, HybridOptimizer& opt,
                                          const at::Tensor& p,
                                          std::optional<ParamStateEntry> local) {
  const int owner = opt.owner_of(p);
  const bool mine = communicator.rank() == owner;
  auto header = at::zeros({2}, at::kLong);  // has state, step
  if (mine && local) {
    header[0] = 1;
    header[1] = local->step;
  }
  communicator.broadcast(header, owner);
  if (header[0].item<int64_t>() == 0) return std::nullopt;
  ParamStateEntry entry;
  entry.step = header[1].item<int64_t>();
  for (const auto& slot : expected_state_slots(opt, p)) {
    auto t = mine ? local->tensors.at(slot.name).contiguous()
                  : at::empty(slot.shape, at::TensorOptions().dtype(slot.dtype));
    auto bytes = t.reshape(-1).view(at::kByte);  // any dtype, bit for bit
    communicator.broadcast(bytes, owner);
    entry.tensors[slot.name] = t;
  }
  return entry;
}

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

void save_checkpoint(const std::string& path, HybridOptimizer& optimizer,
                     const torch::nn::Module* model, const std::string& config_yaml) {
  at::NoGradGuard no_grad;
  // With ranks, every owner's state is gathered to rank 0, which alone writes the file.
  auto* communicator = optimizer.communicator();
  const bool distributed = communicator != nullptr && communicator->world_size() > 1;
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
    entry.insert("algorithm", std::string(optimizer.algorithm_of(p)));
    auto saved = read_param_state(optimizer, p);
    if (distributed) saved = from_owner(*communicator, optimizer, p, std::move(saved));
    entry.insert("has_state", saved.has_value());
    if (saved) {
      entry.insert("step", saved->step);
      // Stored on CPU whatever the device: a file resumes on any device, and torch.load reads it.
      for (const auto& [key, t] : saved->tensors) entry.insert(key, t.to(at::kCPU));
    }
    state.insert(name, entry);
  }
  root.insert("state", state);
  if (model != nullptr) {
    auto weights = new_dict();
    for (const auto& [name, t] : model_tensors(*model))
      weights.insert(name, t.detach().to(at::kCPU));
    root.insert("model", weights);
  }
  if (!distributed) return write_atomically(path, torch::jit::pickle_save(c10::IValue(root)));
  // Rank 0 tells the others whether the file was written, so that all fail or none does.
  auto written = at::zeros({1}, at::kLong);
  std::string failure;
  if (communicator->rank() == 0) {
    try {
      write_atomically(path, torch::jit::pickle_save(c10::IValue(root)));
      written[0] = 1;
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  communicator->broadcast(written, 0);
  if (!failure.empty()) throw Error(failure);
  if (written[0].item<int64_t>() == 0) {
    throw DistributedError("checkpoint: rank 0 could not write '" + path + "' (see its error)");
  }
}

namespace {

// Everything load_checkpoint() will change, decided (and checked) before the first change.
struct LoadPlan {
  std::vector<std::pair<at::Tensor, ParamStateEntry>> restores;
  std::vector<double> lrs;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // model tensor ← file tensor
  int64_t step_count = 0, skipped_steps = 0;
  std::string config;
};

LoadPlan plan_load(const c10::IValue& loaded, const std::string& path, HybridOptimizer& optimizer,
                   torch::nn::Module* model) {
  LoadPlan plan;
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
  std::set<std::string> ours;
  for (const auto& [name, p] : named) ours.insert(name);
  for (const auto& item : state) {
    check(ours.count(item.key()) != 0, "checkpoint '", path, "' has state for '", item.key(),
          "', which this model does not train; it belongs to a different model");
  }
  auto& restores = plan.restores;
  for (const auto& [name, p] : named) {
    const auto entry_name = "state['" + name + "']";
    const auto where = "checkpoint: " + entry_name;
    check(state.contains(name), "checkpoint '", path, "' has no state for parameter '", name,
          "'; it belongs to a different model");
    const auto entry = dict_field(state, name, "checkpoint: state");
    const auto role = role_from_string(field(entry, "role", where).toStringRef());
    check(role == optimizer.role_of(p), where, " was optimized by ", to_string(role),
          ", this optimizer routes it to ", to_string(optimizer.role_of(p)));
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
    if (!field(entry, "has_state", where).toBool()) continue;
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
    check_param_state(optimizer, p, saved, where);
    restores.emplace_back(p, std::move(saved));
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

  // Validate the model's tensors.
  auto& copies = plan.copies;
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
    return {step.toInt(), field(root, "config", path).toStringRef()};
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
  return {plan.step_count, plan.config};
}

}  // namespace muon
