// Data-parallel training (docs/design.md, "Data parallelism") on loopback Gloo, ranks as threads of
// this process: N ranks equal one process with the whole batch, each Muon matrix is orthogonalized
// on exactly one rank, checkpoints move between world sizes, and collectives fail cleanly.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/checkpoint.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/param_state.h"
#include "system/launch.h"
#include "training/train.h"

namespace muon {
namespace {

using namespace std::chrono_literals;

// Runs `body(communicator)` on `world` ranks (threads) and rethrows the first failure.
void run_ranks(int world, const std::function<void(std::shared_ptr<Communicator>)>& body,
               std::chrono::milliseconds timeout = 60s) {
  const int port = cli::free_local_port();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(Communicator::connect(rank, world, "127.0.0.1", port, timeout));
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

cli::TrainConfig tiny_run(const std::string& out, int64_t batch_size, const std::string& opt) {
  cli::TrainConfig c;
  c.data.source = MUON_TEST_DATA_DIR "/genesis.txt";
  c.data.val_fraction = 0.1;
  c.model.d_model = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.seq_len = 32;
  c.batch_size = batch_size;
  c.optimizer = cli::demo_optimizer(opt);
  if (opt == "dion") c.optimizer.hybrid.matrices.as<DionOptions>()->rank_fraction(0.5);
  c.steps = 24;
  c.log_every = 12;
  c.eval_every = 12;
  c.eval_batches = 1;
  c.optimizer.hybrid.schedule->warmup_steps = 4;
  c.sample_bytes = 8;
  c.out_dir = out;
  c.overwrite = true;
  return c;
}

std::string temp_dir(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / ("muon_dist_" + name);
  std::filesystem::remove_all(path);
  return path.string();
}

// The model tensors a checkpoint holds.
std::map<std::string, at::Tensor> checkpoint_model(const std::string& dir) {
  std::ifstream file(dir + "/checkpoint.pt", std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  const auto root = torch::jit::pickle_load(bytes).toGenericDict();
  std::map<std::string, at::Tensor> out;
  for (const auto& item : root.at("model").toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

// max over tensors of max|a − b| / max|b|.
double max_difference(const std::map<std::string, at::Tensor>& a,
                      const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, t] : b) worst = std::max(worst, testing::max_rel_diff(a.at(name), t));
  return worst;
}

void train_on_ranks(int world, const cli::TrainConfig& config) {
  run_ranks(world, [&](std::shared_ptr<Communicator> communicator) {
    std::ostringstream log;
    cli::train(config, log, communicator);
  });
}

// Float32 tolerance after 24 steps: the ranks sum gradients in another order and the two batch
// shapes take other kernels; Newton–Schulz amplifies such differences, and so does AdamW's 1/√v
// where v is small (measured: up to 3.2e-5 on a Zen 5 CPU with LibTorch 2.6's AVX-512 kernels,
// under 2e-5 with 1.13). A rank that missed a gradient or a step differs by 1e-2 or more.
constexpr double kMuonTolerance = 2e-4;
constexpr double kAdamwTolerance = 1e-4;

// The validation loss before training, from a run's metrics.csv (its first row).
double step0_val_loss(const std::string& dir) {
  std::ifstream csv(dir + "/metrics.csv");
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  std::stringstream cells(row);
  std::string step, train_loss, val_loss;
  std::getline(cells, step, ',');
  std::getline(cells, train_loss, ',');
  std::getline(cells, val_loss, ',');
  EXPECT_EQ(step, "0") << row;
  return std::stod(val_loss);
}

TEST(Distributed, TwoRanksEqualOneRankWithTheWholeBatch) {
  for (const std::string opt : {"muon", "dion", "adamw"}) {
    const auto one = temp_dir("one_" + opt), two = temp_dir("two_" + opt);
    std::ostringstream log;
    cli::train(tiny_run(one, 8, opt), log);
    train_on_ranks(2, tiny_run(two, 4, opt));
    EXPECT_LT(max_difference(checkpoint_model(two), checkpoint_model(one)),
              opt == "adamw" ? kAdamwTolerance : kMuonTolerance)
        << opt;
    // The same weights give the same validation loss: it is taken on the global batch (8 windows
    // per evaluation batch here), not on rank 0's share of it.
    EXPECT_NEAR(step0_val_loss(two), step0_val_loss(one), 1e-6) << opt;
  }
}

TEST(Distributed, CheckpointsMoveBetweenWorldSizes) {
  // 2 ranks → 1 rank: stop at step 12 on two ranks, finish on one; compare with two ranks all the
  // way. And 1 → 2 the other way round.
  for (const auto& [first, second] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const auto label = std::to_string(first) + "to" + std::to_string(second);
    const auto whole = temp_dir("whole_" + label), split = temp_dir("split_" + label);
    auto config = tiny_run(whole, 8 / first, "muon");
    train_on_ranks(first, config);
    config.out_dir = split;
    config.stop_after = 12;
    train_on_ranks(first, config);
    auto rest = tiny_run(split, 8 / second, "muon");
    rest.resume_dir = split;
    train_on_ranks(second, rest);
    EXPECT_LT(max_difference(checkpoint_model(split), checkpoint_model(whole)), kMuonTolerance)
        << label;
  }
}

// The hybrid optimizer over a small model with given per-rank gradients.
struct Replica {
  torch::nn::Sequential model;
  std::unique_ptr<HybridOptimizer> optimizer;

  explicit Replica(uint64_t seed, std::optional<double> max_grad_norm = 0.5) {
    // Ranks are threads here: the global generator is seeded and drawn from by one at a time
    // (interleaved, another rank's seed would change rank 0's model mid-construction).
    static std::mutex global_generator;
    std::lock_guard<std::mutex> lock(global_generator);
    at::manual_seed(seed);
    model = torch::nn::Sequential(torch::nn::Embedding(16, 24), torch::nn::Linear(24, 40),
                                  torch::nn::Linear(40, 24), torch::nn::Linear(24, 24),
                                  torch::nn::Linear(24, 40));
    HybridOptions options;
    options.matrices = MuonOptions(0.02).weight_decay(0.1);
    options.others = AdamWOptions(0.01);
    options.max_grad_norm = max_grad_norm;  // of the averaged gradients, reduced across ranks
    optimizer = std::make_unique<HybridOptimizer>(route(*model), options);
  }
  std::vector<at::Tensor> params() const { return model->parameters(); }
};

std::vector<at::Tensor> gradients_for(const Replica& replica, int rank, int step) {
  auto generator = testing::seeded(1000 * step + rank);
  std::vector<at::Tensor> out;
  for (const auto& p : replica.params()) out.push_back(at::normal(0, 1, p.sizes(), generator));
  return out;
}

TEST(Distributed, EachParameterIsUpdatedByExactlyOneRank) {
  constexpr int kWorld = 3, kSteps = 3;
  // The reference: one process stepping on the mean of the ranks' gradients.
  Replica reference(7);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<at::Tensor> mean;
    for (int rank = 0; rank < kWorld; ++rank) {
      const auto g = gradients_for(reference, rank, step);
      if (mean.empty()) {
        mean = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) mean[i] = mean[i] + g[i];
      }
    }
    const auto params = reference.params();
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = mean[i] / kWorld;
    reference.optimizer->step();
  }

  std::vector<std::map<std::string, int64_t>> steps_seen(kWorld);  // name → state step, per rank
  std::vector<std::vector<at::Tensor>> finals(kWorld);
  run_ranks(kWorld, [&](std::shared_ptr<Communicator> communicator) {
    const int rank = communicator->rank();
    Replica replica(rank == 0 ? 7 : 99);  // other ranks start elsewhere: rank 0's values win
    replica.optimizer->set_communicator(communicator, /*bucket_numel=*/600);  // several buckets
    for (int step = 0; step < kSteps; ++step) {
      const auto g = gradients_for(replica, rank, step);
      const auto params = replica.params();
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].clone();
      replica.optimizer->step();
      // The caller's own gradients are back afterwards.
      for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i].grad(), g[i]));
    }
    for (const auto& [name, p] : replica.optimizer->named_trainable()) {
      auto& opt = *replica.optimizer;
      const auto state = read_param_state(opt, p);
      EXPECT_EQ(state.has_value(), opt.owns(p)) << name;
      if (state) steps_seen[rank][name] = state->step;
    }
    for (const auto& p : replica.params()) finals[rank].push_back(p.detach().clone());
  });

  // Every parameter has state on exactly one rank, updated every step; work is spread.
  Replica names(7);
  for (const auto& [name, p] : names.optimizer->named_trainable()) {
    int owners = 0;
    for (int rank = 0; rank < kWorld; ++rank) {
      if (steps_seen[rank].count(name) != 0) {
        ++owners;
        EXPECT_EQ(steps_seen[rank][name], kSteps) << name;
      }
    }
    EXPECT_EQ(owners, 1) << name;
  }
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_FALSE(steps_seen[rank].empty()) << rank;
  // All ranks hold the same values, those of the one-process reference.
  const auto expected = reference.params();
  for (int rank = 0; rank < kWorld; ++rank) {
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(at::equal(finals[rank][i], finals[0][i])) << rank << " " << i;
      EXPECT_LT(testing::max_rel_diff(finals[rank][i], expected[i].detach()), 1e-5) << i;
    }
  }
}

// A rank's view of the model under set_partition: the Gpt's QK-clip targets with each weight
// replaced by the tensor the optimizer holds on this rank (whole if owned, else a placeholder).
class HeldQkSource : public QkClipSource {
 public:
  HeldQkSource(cli::Gpt model, std::map<const void*, at::Tensor> held)
      : model_(std::move(model)), held_(std::move(held)) {}
  std::vector<QkClipTarget> qk_clip_targets() override {
    auto targets = model_->qk_clip_targets();
    for (auto& t : targets) {
      t.q_weight = held_.at(t.q_weight.unsafeGetTensorImpl());
      t.k_weight = held_.at(t.k_weight.unsafeGetTensorImpl());
    }
    return targets;
  }
  std::map<std::string, at::Tensor> qk_max_logits() override { return model_->qk_max_logits(); }

 private:
  cli::Gpt model_;
  std::map<const void*, at::Tensor> held_;
};

cli::GptConfig tiny_gpt() {
  cli::GptConfig c;
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

// set_partition (how the Python module runs the hybrid on FSDP2's shards): each rank holds the
// parameters it owns whole and placeholders for the rest, and sees half of each batch. Clipping
// on the global gradient norm and QK-clip on the largest logits of all ranks give what one
// process gives with the whole batch.
TEST(Distributed, APartitionedHybridEqualsOneProcess) {
  constexpr int kWorld = 2, kSteps = 3;
  at::manual_seed(0);
  cli::Gpt reference(tiny_gpt());
  std::vector<at::Tensor> initial;
  for (const auto& p : reference->parameters()) initial.push_back(p.detach().clone());
  std::vector<at::Tensor> batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(at::randint(0, 32, {4, 8}));
  {
    at::NoGradGuard no_grad;
    reference->forward(batches[0]);
  }
  HybridOptions options;
  options.max_grad_norm = 0.05;  // below every step's norm: each step clips
  options.qk_clip_tau = 0.5 * reference->qk_max_logits().at("blocks.0.attn").max().item<double>();
  const auto reference_routes = route(*reference);
  HybridOptimizer one(reference_routes, options);
  one.set_qk_clip_source(reference.get());
  std::vector<std::vector<at::Tensor>> grads(kSteps);
  std::vector<StepStats> expected_stats;
  for (int step = 0; step < kSteps; ++step) {
    one.zero_grad();
    reference->loss(batches[step], batches[step]).backward();
    for (const auto& r : reference_routes) grads[step].push_back(r.tensor.grad().clone());
    one.step();
    EXPECT_LT(one.last_step().clip_factor, 1.0) << step;
    expected_stats.push_back(one.last_step());
  }
  EXPECT_FALSE(expected_stats[0].qk_clip.empty());

  std::vector<std::vector<at::Tensor>> finals(kWorld);
  run_ranks(kWorld, [&](std::shared_ptr<Communicator> communicator) {
    const int rank = communicator->rank();
    cli::Gpt model(tiny_gpt());
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < initial.size(); ++i) model->parameters()[i].copy_(initial[i]);
    }
    auto routes = route(*model);
    std::vector<at::Tensor> whole;  // the model's parameters, which every step refreshes
    std::vector<int> owner;
    std::map<const void*, at::Tensor> held;
    std::vector<std::pair<at::Tensor, int>> owners;
    for (size_t i = 0; i < routes.size(); ++i) {
      whole.push_back(routes[i].tensor);
      owner.push_back(static_cast<int>(i) % kWorld);
      if (owner[i] != rank) {
        routes[i].tensor = at::zeros({}, whole[i].options()).expand(whole[i].sizes());
      }
      held[whole[i].unsafeGetTensorImpl()] = routes[i].tensor;
      owners.emplace_back(routes[i].tensor, owner[i]);
    }
    HybridOptimizer opt(routes, options);
    opt.set_partition(communicator, owners);
    HeldQkSource source(model, held);
    opt.set_qk_clip_source(&source);
    for (int step = 0; step < kSteps; ++step) {
      {
        at::NoGradGuard no_grad;  // this rank's half of the batch: its share of the logits
        model->forward(batches[step].narrow(0, 2 * rank, 2));
      }
      for (size_t i = 0; i < routes.size(); ++i) {
        if (owner[i] == rank) routes[i].tensor.mutable_grad() = grads[step][i].clone();
      }
      opt.step();
      const auto& stats = opt.last_step();
      EXPECT_NEAR(stats.grad_norm, expected_stats[step].grad_norm,
                  1e-6 * expected_stats[step].grad_norm);
      ASSERT_EQ(stats.qk_clip.size(), expected_stats[step].qk_clip.size()) << step;
      for (size_t h = 0; h < stats.qk_clip.size(); ++h) {
        EXPECT_NEAR(stats.qk_clip[h].factor, expected_stats[step].qk_clip[h].factor, 1e-5);
      }
      // The caller's part: every owner's new values to the other ranks' models.
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < whole.size(); ++i) {
        auto values = whole[i].detach();
        communicator->broadcast(values, owner[i]);
      }
    }
    for (size_t i = 0; i < routes.size(); ++i) {
      EXPECT_EQ(read_param_state(opt, routes[i].tensor).has_value(), owner[i] == rank) << i;
      EXPECT_EQ(opt.owns(routes[i].tensor), owner[i] == rank) << i;
      finals[rank].push_back(whole[i].detach().clone());
    }
    // What set_partition refuses.
    testing::expect_error<Error>([&] { opt.set_partition(communicator, owners); },
                                 {"set_partition: this optimizer's ranks are set already"});
    const auto groups = opt.param_groups().size();
    testing::expect_error<Error>(
        [&] { opt.add_param_group(torch::optim::OptimizerParamGroup({at::zeros({2})})); },
        {"HybridOptimizer::add_param_group: set_partition's owners cover only the groups before "
         "it"});
    EXPECT_EQ(opt.param_groups().size(), groups);  // nothing added
    HybridOptimizer fresh(routes, options);
    auto missing = owners;
    missing.pop_back();
    testing::expect_error<Error>([&] { fresh.set_partition(communicator, missing); },
                                 {"set_partition: parameter '", "' has no owner"});
    auto outside = owners;
    outside[0].second = kWorld;
    testing::expect_error<Error>([&] { fresh.set_partition(communicator, outside); },
                                 {"has owner 2, not a rank of [0, 2)"});
    testing::expect_error<Error>(
        [&] {
          fresh.set_partition(communicator, {{at::zeros({3}), 0}});
        },
        {"set_partition: an owned tensor (shape [3]) is not one of this optimizer's trainable "
         "parameters"});
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    for (size_t i = 0; i < reference_routes.size(); ++i) {
      EXPECT_LT(testing::max_rel_diff(finals[rank][i], reference_routes[i].tensor.detach()), 1e-5)
          << rank << " " << reference_routes[i].name;
    }
  }
}

TEST(Distributed, OneAndTwoRanksLeaveTheSameGradientsAndParameters) {
  // Both ranks get the same gradients, so their mean is that gradient exactly: two ranks must
  // leave what one process leaves, in the parameters and in the caller's .grad. With clipping the
  // norm is summed in another order (per rank, then across), so parameters agree to rounding.
  constexpr int kSteps = 3;
  for (const std::optional<double> clip : {std::optional<double>(), std::optional<double>(0.5)}) {
    const std::string label = clip ? "clipped" : "unclipped";
    Replica single(7, clip);
    std::vector<std::vector<at::Tensor>> grads_after(kSteps);
    for (int step = 0; step < kSteps; ++step) {
      const auto g = gradients_for(single, 0, step);
      const auto params = single.params();
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].clone();
      single.optimizer->step();
      for (const auto& p : params) grads_after[step].push_back(p.grad().clone());
      for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i].grad(), g[i]));
    }
    run_ranks(2, [&](std::shared_ptr<Communicator> communicator) {
      Replica replica(7, clip);
      replica.optimizer->set_communicator(communicator, /*bucket_numel=*/600);
      for (int step = 0; step < kSteps; ++step) {
        const auto g = gradients_for(replica, 0, step);  // rank 0's on both
        const auto params = replica.params();
        for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].clone();
        replica.optimizer->step();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_TRUE(at::equal(params[i].grad(), grads_after[step][i])) << label << " " << i;
        }
      }
      const auto expected = single.params();
      const auto params = replica.params();
      for (size_t i = 0; i < params.size(); ++i) {
        if (clip) {
          EXPECT_LT(testing::max_rel_diff(params[i], expected[i].detach()), 1e-6) << label << i;
        } else {
          EXPECT_TRUE(at::equal(params[i], expected[i])) << label << " " << i;
        }
      }
    });
  }
}

TEST(Distributed, NonFiniteGradientOnOneRankSkipsTheStepOnAll) {
  std::vector<std::vector<at::Tensor>> before(2), after(2);
  std::vector<char> skipped(2);  // not vector<bool>: its bits share a word, which both ranks write
  run_ranks(2, [&](std::shared_ptr<Communicator> communicator) {
    const int rank = communicator->rank();
    Replica replica(7);
    replica.optimizer->set_communicator(communicator);
    const auto params = replica.params();
    for (const auto& p : params) before[rank].push_back(p.detach().clone());
    const auto g = gradients_for(replica, rank, 0);
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].clone();
    if (rank == 1) params.back().mutable_grad()[0] = std::nan("");
    replica.optimizer->step();
    skipped[rank] = replica.optimizer->last_step().skipped;
    for (const auto& p : params) after[rank].push_back(p.detach().clone());
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(skipped[rank]);
    for (size_t i = 0; i < before[rank].size(); ++i) {
      EXPECT_TRUE(at::equal(before[rank][i], after[rank][i]));
    }
  }
}

TEST(Distributed, AMissingRankIsAClearErrorWithinTheTimeout) {
  // Rank 1 of 2 never comes: rank 0 cannot meet it.
  const auto start = std::chrono::steady_clock::now();
  testing::expect_error<DistributedError>(
      [] { Communicator::connect(0, 2, "127.0.0.1", cli::free_local_port(), 1500ms); },
      {"distributed: rank 0 of 2 could not reach the other ranks through 127.0.0.1:",
       "within 1.5 s", "are all 2 ranks running"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);

  // Rank 1 leaves after one collective: rank 0's next collective fails, naming it.
  run_ranks(
      2,
      [](std::shared_ptr<Communicator> communicator) {
        auto t = at::ones({4});
        communicator->all_reduce(t, ReduceOp::sum);
        EXPECT_TRUE(at::equal(t, at::full({4}, 2.0f)));
        if (communicator->rank() == 1) return;  // rank 1 stops taking part
        testing::expect_error<DistributedError>([&] { communicator->all_reduce(t, ReduceOp::sum); },
                                                {"distributed: all_reduce failed on rank 0 of 2",
                                                 "another rank exited, hung", "(timeout 2 s)"});
        // Gloo's point-to-point send and receive (the ring reduce-scatter) run part of their
        // work when started: a peer gone fails there, and is reported the same way.
        testing::expect_error<DistributedError>(
            [&] { communicator->reduce_scatter(at::ones({4})); },
            {"distributed: reduce_scatter (ring send) failed on rank 0 of 2",
             "another rank exited, hung"});
        // reason(): the backend's own words alone, which the message quotes.
        try {
          communicator->all_reduce(t, ReduceOp::sum);
          ADD_FAILURE() << "the second all_reduce without rank 1 succeeded";
        } catch (const DistributedError& e) {
          EXPECT_FALSE(e.reason().empty());
          EXPECT_EQ(e.reason().find("distributed:"), std::string::npos) << e.reason();
          EXPECT_NE(std::string(e.what()).find(": " + e.reason() + " — "), std::string::npos)
              << e.what();
        }
      },
      2000ms);
}

TEST(Distributed, CollectivesComputeWhatTheySay) {
  run_ranks(3, [](std::shared_ptr<Communicator> c) {
    const int r = c->rank();
    // flat = [r, r+1, ..., r+5]; chunk k of the sum over ranks = Σ_r (r + 2k, r + 2k + 1).
    const auto flat = at::arange(6, at::kFloat) + r;
    const auto mine = c->reduce_scatter(flat);
    const auto expected = at::arange(2 * r, 2 * r + 2, at::kFloat) * 3 + 3;
    EXPECT_TRUE(at::equal(mine, expected)) << mine;
    auto gathered = at::empty({6}, at::kFloat);
    auto pending = c->all_gather(at::full({2}, static_cast<float>(r)), gathered);
    pending.wait();
    EXPECT_TRUE(at::equal(gathered, at::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f})));
    auto peak = at::full({1}, static_cast<float>(r));
    c->all_reduce(peak, ReduceOp::max);
    EXPECT_EQ(peak.item<float>(), 2.0f);
    auto value = at::full({2}, static_cast<float>(r + 10));
    c->broadcast(value, 2);
    EXPECT_TRUE(at::equal(value, at::full({2}, 12.0f)));
    // gather to rank 1: part k = rank k's [k, 2k]; scatter from rank 0: rank k gets [−k].
    std::vector<at::Tensor> parts;
    if (r == 1) parts = {at::empty({2}), at::empty({2}), at::empty({2})};
    c->gather(at::tensor({static_cast<float>(r), 2.0f * r}), parts, 1);
    for (int k = 0; k < static_cast<int>(parts.size()); ++k) {
      EXPECT_TRUE(at::equal(parts[k], at::tensor({1.0f * k, 2.0f * k}))) << k << parts[k];
    }
    std::vector<at::Tensor> sent;
    if (r == 0) sent = {at::tensor({-0.0f}), at::tensor({-1.0f}), at::tensor({-2.0f})};
    auto received = at::empty({1});
    c->scatter(received, sent, 0);
    EXPECT_EQ(received.item<float>(), -1.0f * r);
    // Bytes: reduce-scatter 2/3 of 24, all-gather 2 × 8, all-reduce 2·2/3 of 4 (integer), 8
    // from the broadcast's root, 8 to the gather's root, 2 × 4 from the scatter's root.
    EXPECT_EQ(c->bytes_sent(),
              16 + 16 + 5 + (r == 2 ? 8 : 0) + (r != 1 ? 8 : 0) + (r == 0 ? 8 : 0));
    // A root outside the group, or a root without a part for each rank, is refused on the spot.
    testing::expect_error<Error>([&] { c->gather(received, parts, 3); },
                                 {"distributed: gather's root 3 is not in [0, 3)"});
    std::vector<at::Tensor> two{received, received};
    testing::expect_error<Error>([&] { c->scatter(received, two, r); },
                                 {"distributed: scatter needs 3 parts on its root, got 2"});
  });
}

TEST(Distributed, EnvironmentVariablesAreChecked) {
  const auto with_env = [](std::map<std::string, std::string> vars,
                           std::initializer_list<std::string> fragments) {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
    testing::expect_error<Error>([] { Communicator::from_environment(1000ms); }, fragments);
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
  };
  with_env({{"WORLD_SIZE", "2"}}, {"RANK is not set"});
  with_env({{"WORLD_SIZE", "2"}, {"RANK", "2"}}, {"RANK='2' is not a whole number in [0, 1]"});
  with_env({{"WORLD_SIZE", "two"}}, {"WORLD_SIZE='two'"});
  with_env({{"WORLD_SIZE", "2"}, {"RANK", "0"}}, {"MASTER_ADDR is not set"});
  with_env({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}},
           {"MASTER_PORT is not set"});
  // No variables: one process.
  EXPECT_EQ(Communicator::from_environment(1000ms)->world_size(), 1);
}

// `muon train --nproc`'s report of a failed run names the failure that caused the others: a rank
// whose collective lost its peer (exit 3) or that the launcher killed past the grace is not the
// cause when another failed on its own, whatever order they were reaped in; a rank killed by
// something else (the kernel's OOM killer: 137 too) is.
TEST(Distributed, TheLauncherNamesTheFailureThatCausedTheOthers) {
  using cli::failure_cause;
  using cli::RankFailure;
  const auto cause = [](std::vector<RankFailure> failures) {
    const auto& f = failure_cause(failures);
    return std::pair{f.rank, f.code};
  };
  EXPECT_EQ(cause({{1, 3}, {0, 2}}), std::pair(0, 2));
  EXPECT_EQ(cause({{1, 137, true}, {2, 3}, {0, 1}}), std::pair(0, 1));
  EXPECT_EQ(cause({{1, 137}, {0, 2}}), std::pair(1, 137));  // killed, not by the launcher
  EXPECT_EQ(cause({{0, 2}, {1, 2}}), std::pair(0, 2));      // the first of two of their own
  EXPECT_EQ(cause({{1, 3}, {0, 3}}), std::pair(1, 3));      // every one lost a peer: the first
  EXPECT_EQ(cause({{2, 137, true}, {0, 3}}), std::pair(2, 137));
  testing::expect_error<Error>([] { failure_cause({}); }, {"failure_cause: no failures"});
}

}  // namespace
}  // namespace muon
