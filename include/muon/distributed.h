// Data-parallel communication (docs/design.md §Data parallelism) on PyTorch's c10d: the collectives
// the hybrid optimizer needs, over a c10d::ProcessGroup the caller made or one built from
// torchrun's variables (Gloo on CPU). A one-process Communicator makes every collective the
// identity, so one code path serves 1..N ranks. Every collective waits at most the timeout; a rank
// that exits or hangs becomes a muon::DistributedError on the others, never a hang.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "muon/compat.h"

namespace muon {

// A collective failed or timed out: another rank exited, hung or disagreed. reason(): the
// backend's own words ("no answer" for a timeout), for callers that tell the story their own way.
class DistributedError : public std::runtime_error {
 public:
  explicit DistributedError(const std::string& message, std::string reason = {})
      : std::runtime_error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

enum class ReduceOp { sum, max };

// Which rank owns each tensor when `world` ranks share the updates (ZeRO-1; docs/design.md §Data
// parallelism); the hybrid's data parallelism and the Python optimizers' process groups both plan
// by it. Matrices and the other tensors are balanced separately, largest first, each to the
// least-loaded rank (the lowest on ties), the same on every rank: a matrix costs its
// orthogonalization, elements × min(rows, cols) of its (batch..., rows, cols) shape; any other
// tensor its element count.
struct OwnedTensor {
  std::vector<int64_t> shape;  // a matrix's (batch..., rows, cols) view
  bool matrix = false;
};
std::vector<int> owner_plan(const std::vector<OwnedTensor>& tensors, int world);

class Communicator {
 public:
  using Duration = std::chrono::milliseconds;

  // One process: rank 0 of 1.
  Communicator();
  // Over `group` (any c10d backend, world size ≥ 1; in LibTorch 2.x its default backend). Each
  // collective waits at most `timeout`; 0 leaves it to the group's own timeout, as
  // torch.distributed's calls do.
  Communicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group, Duration timeout);
  ~Communicator();

  // From torchrun's variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a TCPStore served by
  // rank 0 and a Gloo group (the socket interface from GLOO_SOCKET_IFNAME, else loopback when
  // MASTER_ADDR is local, else the host's default) — or, in a CUDA build of LibTorch with a GPU,
  // an NCCL group on device LOCAL_RANK (MUON_DIST_BACKEND=gloo keeps Gloo). WORLD_SIZE unset
  // means one process. Invalid or missing variables are a muon::Error naming them.
  static std::shared_ptr<Communicator> from_environment(Duration timeout);
  // The same with the values given: rank `rank` of `world` meets the others at address:port.
  static std::shared_ptr<Communicator> connect(int rank, int world, const std::string& address,
                                               int port, Duration timeout);

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Duration timeout() const { return timeout_; }
  // Where the backend's tensors live: the CPU, or an NCCL group's CUDA device.
  at::Device device() const { return device_; }

  // Σ over ranks of chunk rank() of `flat` (flat.numel() divisible by world_size(); 1-D,
  // contiguous). Gloo has no reduce-scatter: a ring of sends and receives, (N−1)/N of flat's bytes
  // sent per rank, the minimum.
  at::Tensor reduce_scatter(const at::Tensor& flat);

  // Started all-gather of each rank's `shard` into `flat` (chunk r = rank r's shard); wait() it
  // before reading flat.
  class Pending {
   public:
    Pending() = default;
    Pending(Communicator* owner, c10::intrusive_ptr<c10d::Work> work, std::string what);
    Pending(Pending&&) noexcept;
    Pending& operator=(Pending&&) noexcept;
    ~Pending();
    void wait();

   private:
    Communicator* owner_ = nullptr;
    c10::intrusive_ptr<c10d::Work> work_;
    std::string what_;
  };
  Pending all_gather(const at::Tensor& shard, at::Tensor& flat);

  void all_reduce(at::Tensor& tensor, ReduceOp op);  // in place
  void broadcast(at::Tensor& tensor, int root);      // in place
  // Rank `root` receives each rank's `sent` into `parts` (world_size() tensors shaped like sent;
  // empty on the other ranks).
  void gather(const at::Tensor& sent, std::vector<at::Tensor>& parts, int root);
  // Each rank r receives `root`'s parts[r] into `received` (parts: empty on the other ranks).
  void scatter(at::Tensor& received, const std::vector<at::Tensor>& parts, int root);
  void barrier();

  // Payload bytes this rank has sent, counted as ring algorithms send them (reduce-scatter and
  // all-gather (N−1)/N of the whole, all-reduce twice that, broadcast the tensor from its root,
  // gather a part from each other rank, scatter a part to each other rank).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  // Starts a collective: `issue` asks the backend for its work. A backend may do part of the work
  // at once (Gloo's send and receive do) and throw there when a peer is gone, which is reported
  // as a failed wait is.
  template <class Issue>
  c10::intrusive_ptr<c10d::Work> start(const std::string& what, Issue&& issue);
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  template <class Issue>
  void run(const std::string& what, Issue&& issue) {  // starts, then waits
    wait(start(what, std::forward<Issue>(issue)), what);
  }
  template <class Collective>
  void on_device(at::Tensor& tensor, Collective&& collective);
  [[noreturn]] void fail(const std::string& what, const std::string& reason) const;
  // Refuses a `root` outside the group, and on the root a count of `parts` other than one a rank.
  void check_root(const char* what, int root, size_t parts) const;
  struct Own {};  // tags the constructor over a group this class made (the same type in 1.x)
  Communicator(c10::intrusive_ptr<compat::CollectiveGroup> group, Duration timeout, Own);

  c10::intrusive_ptr<compat::CollectiveGroup> group_;
  int rank_ = 0;
  int world_ = 1;
  Duration timeout_{0};
  at::Device device_{at::kCPU};       // where the backend's tensors must live
  bool ring_reduce_scatter_ = false;  // the backend lacks reduce_scatter (Gloo)
  int64_t bytes_sent_ = 0;
  int64_t tag_ = 0;  // point-to-point message tags, advanced in step on every rank
};

}  // namespace muon
