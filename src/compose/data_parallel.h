// Data parallelism inside the hybrid optimizer (docs/design.md, "Data parallelism"), ZeRO-1 style:
// every trainable tensor has one owner rank, which alone keeps its optimizer state and computes its
// update. Gradients arrive averaged by reduce-scatter, new values leave by all-gather, both over
// flat buckets laid out by owner (chunk r of a bucket holds what rank r owns, padded to equal
// chunks).
//
// Owners are chosen size-balanced and identically on every rank: Muon matrices by their
// orthogonalization cost (so same-shape matrices spread evenly, each orthogonalized whole on one
// rank), the other tensors by element count. Small tensors ride in the same buckets as large ones,
// so they cost no extra messages.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "muon/distributed.h"
#include "muon/routing.h"

namespace muon::detail {

// Gradients by the TensorImpl of their parameter.
using Gradients = std::map<const void*, at::Tensor>;

class DataParallel {
 public:
  struct Param {
    at::Tensor tensor;
    Role role;
    std::vector<int64_t> view;  // Muon's (batch..., rows, cols); the tensor's shape when empty
  };

  // `params` in the same order on every rank.
  DataParallel(std::shared_ptr<Communicator> communicator, const std::vector<Param>& params,
               int64_t bucket_numel);

  Communicator& communicator() { return *communicator_; }
  int owner(const at::Tensor& param) const;
  bool owns(const at::Tensor& param) const { return owner(param) == communicator_->rank(); }

  // Makes every rank's parameters equal rank 0's.
  void broadcast_parameters();

  // The mean over ranks of the gradient of each parameter this rank owns, by TensorImpl (a rank
  // without a gradient contributes zeros; a parameter no rank has a gradient for has none). The
  // parameters' .grad are only read.
  Gradients average_gradients();

  // Runs `update` once per bucket with the parameters of that bucket this rank owns, and
  // all-gathers the bucket's new values while the next bucket updates.
  void update_and_gather(const std::function<void(const std::vector<at::Tensor>& owned)>& update);

 private:
  struct Slot {
    at::Tensor param;
    int owner;
    int64_t offset;  // within the owner's chunk
  };
  struct Bucket {
    std::vector<Slot> slots;
    int64_t chunk = 0;  // elements per rank
  };

  void assign_owners(const std::vector<Param>& params);
  void build_buckets(const std::vector<Param>& params, int64_t bucket_numel);

  std::shared_ptr<Communicator> communicator_;
  std::map<const void*, int> owners_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> params_;  // every trainable tensor, in the given order
};

}  // namespace muon::detail
