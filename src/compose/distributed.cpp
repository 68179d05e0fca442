#include "muon/distributed.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if MUON_WITH_NCCL  // CUDA builds of LibTorch with NCCL (CMakeLists.txt decides)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <optional>

#include "muon/error.h"

namespace muon {
namespace {

// The value of environment variable `name`, or nullopt.
std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t env_integer(const char* name, int64_t lowest, int64_t highest) {
  const auto text = env(name);
  check(text.has_value(), "distributed: environment variable ", name,
        " is not set (torchrun-style launch needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  char* end = nullptr;
  const long long v = std::strtoll(text->c_str(), &end, 10);
  check(end != text->c_str() && *end == '\0' && v >= lowest && v <= highest, "distributed: ", name,
        "='", *text, "' is not a whole number in [", lowest, ", ", highest, "]");
  return v;
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// What a collective hands the backend in place of `tensor`: an alias of the same memory that no
// Python object owns. The backend's worker thread drops its references after the collective
// completes; in recent PyTorch (2.14, 2.15) dropping one of a tensor Python made takes the GIL,
// which an exiting interpreter never grants, and the process aborts ("terminate called without an
// active exception") if the caller's script ends right after a collective.
at::Tensor for_backend(const at::Tensor& tensor) {
  return tensor.detach();
}

std::vector<at::Tensor> for_backend(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(for_backend(t));
  return out;
}

}  // namespace

Communicator::Communicator() = default;

Communicator::Communicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group, Duration timeout)
    : Communicator(group.defined() ? compat::collective_group(group)
                                   : c10::intrusive_ptr<compat::CollectiveGroup>(),
                   timeout, Own{}) {}

Communicator::Communicator(c10::intrusive_ptr<compat::CollectiveGroup> group, Duration timeout, Own)
    : group_(std::move(group)), timeout_(timeout) {
  check(group_.defined(), "distributed: the process group is null");
  check(timeout.count() >= 0, "distributed: the timeout must be ≥ 0 ms (0: the group's own), got ",
        timeout.count());
  rank_ = group_->getRank();
  world_ = group_->getSize();
  ring_reduce_scatter_ = group_->getBackendName() == "gloo";
#if MUON_WITH_NCCL
  if (group_->getBackendName() == "nccl") {
    device_ = at::Device(at::kCUDA, c10::cuda::current_device());
  }
#endif
}

// NCCL only reduces device tensors: small CPU tensors (norms, flags, checkpoint pieces) make a
// round trip; a no-op for Gloo.
template <class Collective>
void Communicator::on_device(at::Tensor& tensor, Collective&& collective) {
  if (tensor.device() == device_) return collective(tensor);
  auto there = tensor.to(device_);
  collective(there);
  tensor.copy_(there);
}

Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::from_environment(Duration timeout) {
  if (!env("WORLD_SIZE")) return std::make_shared<Communicator>();
  const auto world = static_cast<int>(env_integer("WORLD_SIZE", 1, 1 << 20));
  if (world == 1) return std::make_shared<Communicator>();
  const auto rank = static_cast<int>(env_integer("RANK", 0, world - 1));
  const auto address = env("MASTER_ADDR");
  check(address.has_value(),
        "distributed: environment variable MASTER_ADDR is not set (the "
        "host of rank 0, e.g. 127.0.0.1)");
  const auto port = static_cast<int>(env_integer("MASTER_PORT", 1, 65535));
  return connect(rank, world, *address, port, timeout);
}

std::shared_ptr<Communicator> Communicator::connect(int rank, int world, const std::string& address,
                                                    int port, Duration timeout) {
  check(world >= 1 && rank >= 0 && rank < world, "distributed: rank ", rank,
        " is not in [0, world size ", world, ")");
  check(port > 0 && port < 65536, "distributed: port ", port, " is not in [1, 65535]");
  check(timeout.count() > 0, "distributed: the timeout must be > 0 ms, got ", timeout.count());
  if (world == 1) return std::make_shared<Communicator>();
  // Both ways of not meeting (store or group) say the same thing: who, where, for how long.
  const auto unreachable = [&](const std::exception& e) {
    return DistributedError(detail::concat(
        "distributed: rank ", rank, " of ", world, " could not reach the other ranks through ",
        address, ":", port, " within ", static_cast<double>(timeout.count()) / 1000.0, " s (",
        first_line(e.what()), "); are all ", world,
        " ranks running with the same MASTER_ADDR and MASTER_PORT?"));
  };
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(port);
  store_options.isServer = rank == 0;
  store_options.numWorkers = world;
  store_options.timeout = timeout;
  compat::use_plain_tcp_store(store_options);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(address, store_options);
  } catch (const std::exception& e) {
    throw unreachable(e);
  }
#if MUON_WITH_NCCL
  // NCCL when this LibTorch has it and CUDA is there (MUON_DIST_BACKEND=gloo keeps Gloo): rank r
  // uses CUDA device LOCAL_RANK (else r modulo the device count).
  if (c10::cuda::device_count() > 0 && env("MUON_DIST_BACKEND").value_or("nccl") == "nccl") {
    const int devices = static_cast<int>(c10::cuda::device_count());
    const int local =
        env("LOCAL_RANK") ? static_cast<int>(env_integer("LOCAL_RANK", 0, 1 << 20)) : rank;
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(local % devices));
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    try {
      auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
      return std::shared_ptr<Communicator>(new Communicator(std::move(group), timeout, Own{}));
    } catch (const std::exception& e) {
      throw unreachable(e);
    }
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (const auto interface = env("GLOO_SOCKET_IFNAME")) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*interface));
  } else if (is_loopback(address)) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  try {
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
    return std::shared_ptr<Communicator>(new Communicator(std::move(group), timeout, Own{}));
  } catch (const std::exception& e) {
    throw unreachable(e);
  }
}

void Communicator::fail(const std::string& what, const std::string& reason) const {
  const auto limit =
      timeout_.count() == 0
          ? std::string("the process group's timeout")
          : detail::concat("timeout ", static_cast<double>(timeout_.count()) / 1000.0, " s");
  throw DistributedError(
      detail::concat("distributed: ", what, " failed on rank ", rank_, " of ", world_, ": ", reason,
                     " — another rank exited, hung or took a different path (", limit, ")"),
      reason);
}

template <class Issue>
c10::intrusive_ptr<c10d::Work> Communicator::start(const std::string& what, Issue&& issue) {
  try {
    return issue();
  } catch (const std::exception& e) {
    fail(what, first_line(e.what()));
  }
}

void Communicator::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  bool completed = false;
  try {
    completed = work->wait(timeout_);
  } catch (const std::exception& e) {
    fail(what, first_line(e.what()));
  }
  if (!completed) fail(what, "no answer");
}

at::Tensor Communicator::reduce_scatter(const at::Tensor& flat) {
  check(flat.dim() == 1 && flat.is_contiguous() && flat.numel() % world_ == 0,
        "distributed: reduce_scatter needs a contiguous 1-D tensor whose length (", flat.numel(),
        ") divides by the world size ", world_);
  const int64_t chunk = flat.numel() / world_;
  if (world_ == 1) return flat;
  bytes_sent_ += (world_ - 1) * chunk * static_cast<int64_t>(flat.element_size());
  if (!ring_reduce_scatter_) {
    auto out = at::empty({chunk}, flat.options());
    std::vector<at::Tensor> outputs{out};
    std::vector<std::vector<at::Tensor>> inputs{for_backend(flat.split(chunk))};
    run("reduce_scatter", [&] { return group_->reduce_scatter(outputs, inputs); });
    return out;
  }
  // Ring: at step s rank r sends its partial sum of chunk (r − s − 1) mod N to r + 1 and adds the
  // partial sum of chunk (r − s − 2) mod N from r − 1; after N − 1 steps it holds chunk r whole.
  auto work = flat.clone();
  auto incoming = at::empty({chunk}, flat.options());
  const int next = (rank_ + 1) % world_, previous = (rank_ + world_ - 1) % world_;
  const auto piece = [&](int64_t index) {
    return work.narrow(0, ((index % world_) + world_) % world_ * chunk, chunk);
  };
  for (int s = 0; s < world_ - 1; ++s) {
    const int tag = static_cast<int>(tag_++ % (1 << 30));
    std::vector<at::Tensor> send{for_backend(piece(rank_ - s - 1))};
    std::vector<at::Tensor> receive{incoming};
    // A receive that fails to start leaves the send unwaited: the group is of no further use.
    auto sent = start("reduce_scatter (ring send)", [&] { return group_->send(send, next, tag); });
    auto received = start("reduce_scatter (ring receive)",
                          [&] { return group_->recv(receive, previous, tag); });
    wait(received, "reduce_scatter (ring receive)");
    wait(sent, "reduce_scatter (ring send)");
    piece(rank_ - s - 2).add_(incoming);
  }
  return piece(rank_).clone();
}

Communicator::Pending::Pending(Communicator* owner, c10::intrusive_ptr<c10d::Work> work,
                               std::string what)
    : owner_(owner), work_(std::move(work)), what_(std::move(what)) {}
Communicator::Pending::Pending(Pending&&) noexcept = default;
Communicator::Pending& Communicator::Pending::operator=(Pending&&) noexcept = default;
Communicator::Pending::~Pending() = default;

void Communicator::Pending::wait() {
  if (owner_ != nullptr && work_.defined()) owner_->wait(work_, what_);
  work_.reset();
}

Communicator::Pending Communicator::all_gather(const at::Tensor& shard, at::Tensor& flat) {
  check(flat.dim() == 1 && flat.is_contiguous() && shard.numel() * world_ == flat.numel(),
        "distributed: all_gather needs a contiguous 1-D output of world size × the shard (", world_,
        " × ", shard.numel(), "), got ", flat.numel());
  if (world_ == 1) {
    flat.copy_(shard);
    return {};
  }
  bytes_sent_ += (world_ - 1) * shard.numel() * static_cast<int64_t>(shard.element_size());
  std::vector<at::Tensor> input{for_backend(shard.contiguous())};
  std::vector<std::vector<at::Tensor>> outputs{for_backend(flat.split(shard.numel()))};
  return Pending(this, start("all_gather", [&] { return group_->allgather(outputs, input); }),
                 "all_gather");
}

void Communicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  if (world_ == 1) return;
  bytes_sent_ +=
      2 * (world_ - 1) * tensor.numel() * static_cast<int64_t>(tensor.element_size()) / world_;
  on_device(tensor, [&](at::Tensor& t) {
    std::vector<at::Tensor> tensors{for_backend(t)};
    c10d::AllreduceOptions options;
    options.reduceOp = op == ReduceOp::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    run("all_reduce", [&] { return group_->allreduce(tensors, options); });
  });
}

void Communicator::broadcast(at::Tensor& tensor, int root) {
  if (world_ == 1) return;
  if (rank_ == root) {
    bytes_sent_ += tensor.numel() * static_cast<int64_t>(tensor.element_size());
  }
  on_device(tensor, [&](at::Tensor& t) {
    std::vector<at::Tensor> tensors{for_backend(t)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, options); });
  });
}

void Communicator::check_root(const char* what, int root, size_t parts) const {
  check(root >= 0 && root < world_, "distributed: ", what, "'s root ", root, " is not in [0, ",
        world_, ")");
  check(rank_ != root || static_cast<int>(parts) == world_, "distributed: ", what, " needs ",
        world_, " parts on its root, got ", parts);
}

void Communicator::gather(const at::Tensor& sent, std::vector<at::Tensor>& parts, int root) {
  check_root("gather", root, parts.size());
  if (world_ == 1) {
    parts[0].copy_(sent);
    return;
  }
  if (rank_ != root) bytes_sent_ += sent.numel() * static_cast<int64_t>(sent.element_size());
  std::vector<at::Tensor> input{for_backend(sent)};
  std::vector<std::vector<at::Tensor>> outputs;
  if (rank_ == root) outputs.push_back(for_backend(parts));
  c10d::GatherOptions options;
  options.rootRank = root;
  run("gather", [&] { return group_->gather(outputs, input, options); });
}

void Communicator::scatter(at::Tensor& received, const std::vector<at::Tensor>& parts, int root) {
  check_root("scatter", root, parts.size());
  if (world_ == 1) {
    received.copy_(parts[0]);
    return;
  }
  if (rank_ == root) {
    bytes_sent_ += (world_ - 1) * received.numel() * static_cast<int64_t>(received.element_size());
  }
  std::vector<at::Tensor> output{for_backend(received)};
  std::vector<std::vector<at::Tensor>> inputs;
  if (rank_ == root) inputs.push_back(for_backend(parts));
  c10d::ScatterOptions options;
  options.rootRank = root;
  run("scatter", [&] { return group_->scatter(output, inputs, options); });
}

void Communicator::barrier() {
  if (world_ == 1) return;
  run("barrier", [&] { return group_->barrier(); });
}

}  // namespace muon
