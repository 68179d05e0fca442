// mantissa_tracking: bf16 parameters whose updates act on the exact fp32 weight, checked bit for
// bit against the same optimizer on an fp32 master copy fed the same (bf16) gradients.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include "helpers.h"
#include "muon/adam.h"
#include "muon/lion.h"
#include "muon/muon.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using testing::seeded;

// The bf16 value an fp32 weight truncates to (its high 16 bits), written out bit by bit here.
at::Tensor truncated(const at::Tensor& master) {
  const auto m = master.contiguous();
  auto out = at::empty(m.sizes(), m.options().dtype(at::kBFloat16));
  const auto* src = m.data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  for (int64_t i = 0; i < m.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], sizeof bits);
    dst[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

// The fp32 weight a bf16 parameter and its mantissa stand for.
at::Tensor joined(const at::Tensor& param, const at::Tensor& mantissa) {
  const auto p = param.contiguous();
  const auto m = mantissa.contiguous();
  auto out = at::empty(p.sizes(), p.options().dtype(at::kFloat));
  const auto* high = reinterpret_cast<const uint16_t*>(p.data_ptr());
  const auto* low = reinterpret_cast<const uint16_t*>(m.data_ptr());
  auto* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const uint32_t bits = (static_cast<uint32_t>(high[i]) << 16) | low[i];
    std::memcpy(&dst[i], &bits, sizeof bits);
  }
  return out;
}

using MakeOptimizer =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>, bool)>;

at::Tensor mantissa_of(torch::optim::Optimizer& opt) {
  return read_param_state(opt, opt.param_groups().at(0).params().at(0))->tensors.at("mantissa");
}

// Steps a bf16 parameter with tracking and an fp32 master with the same bf16 gradients; after
// every step the bf16 weight with its mantissa is the master bit for bit.
void expect_follows_master(const MakeOptimizer& make, std::vector<int64_t> shape, uint64_t seed,
                           bool transposed = false) {
  auto gen = seeded(seed);
  auto start = at::randn(shape, gen);
  auto master = start.clone().requires_grad_(true);
  auto W = (transposed ? start.t().contiguous().t() : start).to(at::kBFloat16);
  W.requires_grad_(true);
  // The master starts where the bf16 weight does (the mantissa starts at zero).
  master.detach().copy_(W.detach().to(at::kFloat));
  auto untracked = W.detach().clone().requires_grad_(true);
  auto ours = make({W}, true);
  auto theirs = make({master}, false);
  auto plain = make({untracked}, false);
  for (int step = 0; step < 5; ++step) {
    const auto grad = at::randn(shape, gen).to(at::kBFloat16);
    W.mutable_grad() = grad.clone();
    untracked.mutable_grad() = grad.clone();
    master.mutable_grad() = grad.to(at::kFloat);
    ours->step();
    theirs->step();
    plain->step();
    ASSERT_TRUE(at::equal(joined(W.detach(), mantissa_of(*ours)), master.detach()))
        << "step " << step;
    ASSERT_TRUE(at::equal(W.detach(), truncated(master.detach()))) << "step " << step;
  }
  EXPECT_EQ(W.is_contiguous(), !transposed);
  // Without the mantissa, bf16 rounding loses updates the master keeps.
  EXPECT_FALSE(at::equal(untracked.detach(), W.detach()));
}

const MakeOptimizer kMuon = [](std::vector<at::Tensor> p, bool track) {
  return std::make_unique<Muon>(
      p, MuonOptions(0.02).weight_decay(0.1).cautious(true).mantissa_tracking(track));
};

TEST(MantissaTracking, MuonFollowsAnFp32MasterBitForBit) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    const MakeOptimizer make = [&](std::vector<at::Tensor> p, bool track) {
      return std::make_unique<Muon>(p, MuonOptions(0.02)
                                           .weight_decay(0.1)
                                           .cautious_weight_decay(true)
                                           .mantissa_tracking(track)
                                           .fused(fused));
    };
    expect_follows_master(make, {24, 16}, 1);
    expect_follows_master(make, {16, 24}, 2, /*transposed=*/true);
    expect_follows_master(kMuon, {3, 8, 12}, 3);  // an expert stack, with the cautious mask
  }
}

TEST(MantissaTracking, AdamFamilyFollowsAnFp32MasterBitForBit) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    expect_follows_master(
        [&](std::vector<at::Tensor> p, bool track) {
          return std::make_unique<AdamW>(
              p, AdamWOptions(1e-3).weight_decay(0.1).mantissa_tracking(track).fused(fused));
        },
        {40, 7}, 4);
    expect_follows_master(
        [&](std::vector<at::Tensor> p, bool track) {
          return std::make_unique<AdamW>(p, AdamWOptions(1e-3)
                                                .state_dtype(at::kBFloat16)
                                                .nesterov(true)
                                                .mantissa_tracking(track)
                                                .fused(fused));
        },
        {9, 5}, 5, /*transposed=*/true);
    expect_follows_master(
        [&](std::vector<at::Tensor> p, bool track) {
          return std::make_unique<Lamb>(
              p, LambOptions(1e-3).weight_decay(0.01).mantissa_tracking(track).fused(fused));
        },
        {33}, 6);
  }
}

TEST(MantissaTracking, LionFollowsAnFp32MasterBitForBit) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    expect_follows_master(
        [&](std::vector<at::Tensor> p, bool track) {
          return std::make_unique<Lion>(
              p, LionOptions(1e-3).weight_decay(0.1).mantissa_tracking(track).fused(fused));
        },
        {12, 9}, 8, /*transposed=*/true);
  }
}

TEST(MantissaTracking, OtherDtypesAreUnaffectedAndTheMantissaIsCheckpointed) {
  auto gen = seeded(7);
  auto W32 = at::randn({6, 4}, gen).requires_grad_(true);
  Muon fp32({W32}, MuonOptions(0.02).mantissa_tracking(true));
  W32.mutable_grad() = at::randn({6, 4}, gen);
  fp32.step();
  EXPECT_FALSE(static_cast<const MuonParamState&>(*fp32.state().begin()->second)
                   .mantissa()
                   .defined());

  // Saved after 2 steps and loaded into a new optimizer, the run continues as if uninterrupted.
  const auto start = at::randn({8, 6}, gen).to(at::kBFloat16);
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 4; ++i) grads.push_back(at::randn({8, 6}, gen).to(at::kBFloat16));
  const auto options = AdamWOptions(1e-3).mantissa_tracking(true);
  auto whole = start.clone().requires_grad_(true);
  AdamW straight({whole}, options);
  auto resumed = start.clone().requires_grad_(true);
  auto first = std::make_unique<AdamW>(std::vector<at::Tensor>{resumed}, options);
  std::stringstream archive;
  for (int i = 0; i < 4; ++i) {
    whole.mutable_grad() = grads[i].clone();
    straight.step();
    if (i == 2) {
      torch::save(*first, archive);
      first = std::make_unique<AdamW>(std::vector<at::Tensor>{resumed}, options);
      torch::load(*first, archive);
    }
    resumed.mutable_grad() = grads[i].clone();
    first->step();
  }
  EXPECT_TRUE(at::equal(resumed.detach(), whole.detach()));
  EXPECT_TRUE(at::equal(mantissa_of(*first), mantissa_of(straight)));
}

}  // namespace
}  // namespace muon
