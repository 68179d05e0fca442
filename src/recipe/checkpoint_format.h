// The checkpoint file's format, shared by writing (checkpoint.cpp) and reading
// (checkpoint_load.cpp); docs/checkpoints.md describes it.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>

namespace muon::detail {

inline constexpr const char* kFormat = "muon-cpp checkpoint";
// Version 2 names the roles matrices and others; version 1 (still read) named them muon and adamw.
inline constexpr int64_t kVersion = 2;
inline constexpr int64_t kEarliestVersion = 1;

// The model's parameters and buffers by name: what a checkpoint stores of the model.
std::map<std::string, at::Tensor> model_tensors(const torch::nn::Module& model);

}  // namespace muon::detail
