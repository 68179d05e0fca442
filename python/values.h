// Internal to the Python module: Python values ↔ C++ settings, with TypeErrors naming the key, and
// optimizer options ↔ the dicts of a torch.optim param_groups entry.
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "muon/orthogonalize.h"

namespace muon::python {

namespace py = pybind11;

// Throws TypeError: "<key> must be <expected>, got <type> <repr>".
[[noreturn]] void type_error(const std::string& key, const std::string& expected, py::handle v);

int64_t integer(const std::string& key, py::handle v);
std::vector<int64_t> integers(const std::string& key, py::handle v);
bool boolean(const std::string& key, py::handle v);
std::string text(const std::string& key, py::handle v);
at::ScalarType dtype(const std::string& key, py::handle v);
py::object dtype_object(at::ScalarType t);
// A table name or rows [[a, b, c], ...].
CoefficientTable coefficients(const std::string& key, py::handle v);
std::vector<at::Tensor> tensors(const std::string& key, py::handle v);

// The options of a group as its param_groups dict, and back (a missing key keeps the setting;
// unknown keys are ignored). The options' type (Muon, AdamW, Adam or Lamb) picks the keys.
py::dict options_to_dict(const torch::optim::OptimizerOptions& o);
void update_options(torch::optim::OptimizerOptions& o, const py::dict& d);
// The options of `algorithm` ("muon", "adamw", "adam" or "lamb") in the schema's order: tuples
// (name, default as a Python value, doc line, range).
py::list option_schema(const std::string& algorithm);
// "muon", "adamw", "adam" or "lamb".
std::string algorithm_of(const torch::optim::OptimizerOptions& o);

}  // namespace muon::python
