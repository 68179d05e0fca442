#include "data_parallel.h"

#include <algorithm>
#include <numeric>

#include "muon/dtypes.h"
#include "muon/error.h"

namespace muon {

namespace {

// A tensor's share of the updates: a matrix's orthogonalization, batch × rows × cols ×
// min(rows, cols); another tensor's element count.
double update_cost(const OwnedTensor& t) {
  double elements = 1;
  for (const auto n : t.shape) elements *= static_cast<double>(n);
  if (!t.matrix) return elements;
  check(t.shape.size() >= 2, "distributed: a matrix needs >= 2 dims, got ", t.shape.size());
  return elements * static_cast<double>(std::min(t.shape[t.shape.size() - 2], t.shape.back()));
}

}  // namespace

std::vector<int> owner_plan(const std::vector<OwnedTensor>& tensors, int world) {
  check(world >= 1, "distributed: the world size must be >= 1, got ", world);
  std::vector<int> owners(tensors.size(), 0);
  for (const bool matrices : {true, false}) {
    std::vector<std::pair<double, size_t>> costs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].matrix == matrices) costs.emplace_back(update_cost(tensors[i]), i);
    }
    std::stable_sort(costs.begin(), costs.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<double> load(world, 0.0);
    for (const auto& [cost, i] : costs) {
      const auto rank = std::min_element(load.begin(), load.end()) - load.begin();
      load[rank] += cost;
      owners[i] = static_cast<int>(rank);
    }
  }
  return owners;
}

}  // namespace muon

namespace muon::detail {
namespace {

// Parameter values travel as raw bytes: any dtype, copied bit for bit.
at::Tensor as_bytes(const at::Tensor& t) {
  return t.view(at::kByte);
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Communicator> communicator,
                           const std::vector<Param>& params, int64_t bucket_numel)
    : communicator_(std::move(communicator)) {
  check(communicator_ != nullptr, "distributed: the communicator is null");
  check(bucket_numel > 0, "distributed: bucket size must be > 0 elements, got ", bucket_numel);
  for (const auto& p : params) {
    check(p.tensor.layout() == at::kStrided, "distributed: sparse parameters are not supported");
    params_.push_back(p.tensor);
  }
  assign_owners(params);
  build_buckets(params, bucket_numel);
}

void DataParallel::assign_owners(const std::vector<Param>& params) {
  std::vector<OwnedTensor> tensors;
  for (const auto& p : params) {
    tensors.push_back({p.view.empty() ? p.tensor.sizes().vec() : p.view, p.role == Role::matrices});
  }
  const auto owners = owner_plan(tensors, communicator_->world_size());
  for (size_t i = 0; i < params.size(); ++i) {
    owners_[params[i].tensor.unsafeGetTensorImpl()] = owners[i];
  }
}

// Consecutive parameters of one dtype, up to bucket_numel elements per bucket.
void DataParallel::build_buckets(const std::vector<Param>& params, int64_t bucket_numel) {
  const int world = communicator_->world_size();
  std::vector<int64_t> fill;
  int64_t total = 0;
  for (const auto& p : params) {
    const auto& t = p.tensor;
    const bool fresh = buckets_.empty() || total + t.numel() > bucket_numel ||
                       buckets_.back().slots.front().param.scalar_type() != t.scalar_type();
    if (fresh) {
      buckets_.emplace_back();
      fill.assign(world, 0);
      total = 0;
    }
    const int rank = owner(t);
    buckets_.back().slots.push_back({t, rank, fill[rank]});
    fill[rank] += t.numel();
    total += t.numel();
    buckets_.back().chunk = *std::max_element(fill.begin(), fill.end());
  }
}

int DataParallel::owner(const at::Tensor& param) const {
  const auto it = owners_.find(param.unsafeGetTensorImpl());
  check(it != owners_.end(), "distributed: the tensor is not one of the optimizer's parameters");
  return it->second;
}

void DataParallel::broadcast_parameters() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    auto bytes = as_bytes(p.detach().contiguous()).clone();
    communicator_->broadcast(bytes, 0);
    p.detach().copy_(bytes.view(p.scalar_type()).view(p.sizes()));
  }
}

Gradients DataParallel::average_gradients() {
  const int world = communicator_->world_size();
  // Which parameters have a gradient anywhere.
  auto present = at::zeros({static_cast<int64_t>(params_.size())}, at::kFloat);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) present[static_cast<int64_t>(i)] = 1.0f;
  }
  communicator_->all_reduce(present, ReduceOp::max);
  const auto anywhere = present.accessor<float, 1>();

  Gradients averaged;
  size_t index = 0;
  for (const auto& bucket : buckets_) {
    const auto& first = bucket.slots.front().param;
    // Averaged in full precision, whatever the parameter dtype.
    const auto dtype = full_precision(first.scalar_type());
    auto flat = at::zeros({bucket.chunk * world}, first.options().dtype(dtype));
    for (const auto& slot : bucket.slots) {
      const auto& g = slot.param.grad();
      if (!g.defined()) continue;
      flat.narrow(0, slot.owner * bucket.chunk + slot.offset, slot.param.numel())
          .copy_(g.reshape(-1));
    }
    const auto mine = communicator_->reduce_scatter(flat).div_(world);
    for (const auto& slot : bucket.slots) {
      const bool keep = anywhere[static_cast<int64_t>(index++)] > 0;
      if (slot.owner != communicator_->rank() || !keep) continue;
      averaged[slot.param.unsafeGetTensorImpl()] = mine.narrow(0, slot.offset, slot.param.numel())
                                                       .view(slot.param.sizes())
                                                       .to(slot.param.scalar_type());
    }
  }
  return averaged;
}

void DataParallel::update_and_gather(
    const std::function<void(const std::vector<at::Tensor>& owned)>& update) {
  const int world = communicator_->world_size();
  const int rank = communicator_->rank();
  std::vector<std::pair<at::Tensor, Communicator::Pending>> gathers;
  for (const auto& bucket : buckets_) {
    std::vector<at::Tensor> owned;
    for (const auto& slot : bucket.slots) {
      if (slot.owner == rank) owned.push_back(slot.param);
    }
    update(owned);
    const auto& first = bucket.slots.front().param;
    auto shard = at::zeros({bucket.chunk}, first.options());
    for (const auto& slot : bucket.slots) {
      if (slot.owner == rank) {
        shard.narrow(0, slot.offset, slot.param.numel()).copy_(slot.param.detach().reshape(-1));
      }
    }
    auto flat = at::empty({bucket.chunk * world}, first.options());
    auto flat_bytes = as_bytes(flat);
    auto pending = communicator_->all_gather(as_bytes(shard), flat_bytes);
    gathers.emplace_back(flat, std::move(pending));
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& [flat, pending] = gathers[b];
    pending.wait();
    for (const auto& slot : buckets_[b].slots) {
      if (slot.owner == rank) continue;
      slot.param.detach().copy_(
          flat.narrow(0, slot.owner * buckets_[b].chunk + slot.offset, slot.param.numel())
              .view(slot.param.sizes()));
    }
  }
}

}  // namespace muon::detail
