// Writing checkpoints (muon/checkpoint.h): the optimizer's state by parameter name, gathered from
// its owner ranks, and the model's tensors, written atomically. Reading them is
// checkpoint_load.cpp.
#include "muon/checkpoint.h"

#include <ATen/core/Dict.h>
#include <fcntl.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "checkpoint_format.h"
#include "muon/compat.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using detail::kFormat;
using detail::kVersion;
using detail::model_tensors;

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


}  // namespace

namespace detail {

std::map<std::string, at::Tensor> model_tensors(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters(true)) out[item.key()] = item.value();
  for (const auto& item : model.named_buffers(true)) out[item.key()] = item.value();
  return out;
}

}  // namespace detail

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

}  // namespace muon
