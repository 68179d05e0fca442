// What the fuzz targets check for each input, shared with the regression tests
// (tests/test_fuzz_regressions.cpp) so that every finding stays fixed in the normal build.
//
// An input may be accepted or rejected with muon::Error; anything else — another exception type,
// a crash, a sanitizer report, an accepted config that does not survive its own round trip — is a
// finding.
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "archive_check.h"
#include "muon/checkpoint.h"
#include "muon/config.h"
#include "muon/error.h"

namespace muon::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

// A small model with every kind of tensor routing distinguishes: embedding, matrices, a norm, a
// bias, a 3-D expert stack. Fresh copies on every call: steps on one input do not leak into the next.
inline std::vector<NamedParameter> model_parameters() {
  static const std::vector<NamedParameter> initial = [] {
    at::manual_seed(0);
    const auto f = [](std::vector<int64_t> shape) {
      return at::randn(shape).mul_(0.1).requires_grad_(true);
    };
    return std::vector<NamedParameter>{
        {"wte.weight", f({16, 8}), "EmbeddingImpl"},
        {"blocks.0.attn.q_proj.weight", f({8, 8}), "LinearImpl"},
        {"blocks.0.mlp.up_proj.weight", f({12, 8}), "LinearImpl"},
        {"blocks.0.mlp.up_proj.bias", f({12}), "LinearImpl"},
        {"blocks.0.norm.weight", f({8}), "LayerNormImpl"},
        {"blocks.0.moe.experts", f({2, 4, 8}), ""},
        {"lm_head.weight", f({16, 8}), "LinearImpl"},
    };
  }();
  auto parameters = initial;
  for (auto& p : parameters) p.tensor = p.tensor.detach().clone().requires_grad_(true);
  return parameters;
}

// Parses `text`; an accepted config must print and re-read to itself and build an optimizer over
// model_parameters() that can take a step (or refuse with muon::Error).
inline void check_config_input(const std::string& text) {
  OptimConfig config;
  try {
    config = OptimConfig::from_yaml(text);
  } catch (const Error&) {
    return;
  }
  const auto yaml = config.to_yaml();
  OptimConfig again;
  try {
    again = OptimConfig::from_yaml(yaml);
  } catch (const Error& e) {
    finding(std::string("the resolved config does not read back: ") + e.what() + "\n" + yaml);
  }
  if (again.to_yaml() != yaml) finding("the config round trip changed it:\n" + yaml);
  try {
    const auto parameters = model_parameters();
    auto optimizer = build_optimizer(parameters, config, 50);
    for (const auto& p : parameters) p.tensor.mutable_grad() = at::full_like(p.tensor, 0.01);
    optimizer->step();
  } catch (const Error&) {
  }
}

// The optimizer and model a checkpoint is loaded into, with state from two steps.
struct CheckpointFixture {
  torch::nn::Sequential model{torch::nn::Embedding(16, 8), torch::nn::Linear(8, 12),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})),
                              torch::nn::Linear(12, 16)};
  std::unique_ptr<HybridOptimizer> optimizer;
  std::string path = "/tmp/muon_fuzz_checkpoint_" + std::to_string(::getpid()) + ".pt";

  CheckpointFixture() {
    at::manual_seed(0);
    for (auto& p : model->parameters()) p.detach().normal_(0, 0.1);
    optimizer = build_optimizer(*model,
                                OptimConfig::from_yaml("optimizer: {name: muon, state_dtype: "
                                                       "bfloat16, normuon: {beta2: 0.9}}"),
                                10);
    for (int step = 0; step < 2; ++step) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::full_like(p, 0.01);
      optimizer->step();
    }
  }
};

inline CheckpointFixture& checkpoint_fixture() {
  static CheckpointFixture fixture;
  return fixture;
}

// A valid checkpoint of the fixture: the seed the checkpoint fuzzer mutates.
inline void write_checkpoint_seed(const std::string& path) {
  auto& f = checkpoint_fixture();
  save_checkpoint(path, *f.optimizer, f.model.get(), "optimizer: muon\n");
}

// Rewrites the CRC-32 of every (non-zip64) entry whose data lies inside `bytes`, so that mutations
// reach the checks behind the CRC check as corruption with a matching CRC would.
inline void forge_crcs(std::string& bytes) {
  const auto le = [&](size_t at, int width) {
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[at + i]);
    return v;
  };
  const auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  if (bytes.size() < 22) return;
  size_t end = bytes.size() - 22;
  while (end > 0 && le(end, 4) != 0x06054b50) --end;
  if (le(end, 4) != 0x06054b50) return;
  size_t at = le(end + 16, 4);
  for (uint64_t e = le(end + 10, 2); e > 0 && at + 46 <= bytes.size(); --e) {
    if (le(at, 4) != 0x02014b50) return;
    const uint64_t size = le(at + 20, 4), local = le(at + 42, 4);
    if (local + 30 > bytes.size()) return;
    const uint64_t data = local + 30 + le(local + 26, 2) + le(local + 28, 2);
    if (data <= bytes.size() && size <= bytes.size() - data) {
      const auto crc = detail::crc32(bytes.data() + data, size);
      put32(at + 16, crc);
      put32(local + 14, crc);
    }
    at += 46 + le(at + 28, 2) + le(at + 30, 2) + le(at + 32, 2);
  }
}

// Loads `bytes` as a checkpoint file into the fixture, half the time with its CRCs forged.
inline void check_checkpoint_input(std::string bytes) {
  auto& f = checkpoint_fixture();
  if (!bytes.empty() && (bytes.back() & 1) != 0) forge_crcs(bytes);
  {
    std::ofstream file(f.path, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    load_checkpoint(f.path, *f.optimizer, f.model.get());
  } catch (const Error&) {
  }
}

}  // namespace muon::fuzz
