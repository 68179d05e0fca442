// Writes the golden scenarios' results (scenarios.h) to the file given as the argument, with the
// machine they were computed on: tests/golden/record.sh runs it.
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iostream>

#include "machine.h"
#include "scenarios.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: muon_golden_record OUTPUT.pt\n";
    return 2;
  }
  c10::impl::GenericDict tensors(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : muon::golden::run_all()) tensors.insert(name, t);
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("machine", muon::golden::machine());
  root.insert("tensors", tensors);
  const auto bytes = torch::jit::pickle_save(c10::IValue(root));
  std::ofstream(argv[1], std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::cout << "wrote " << tensors.size() << " tensors computed on " << muon::golden::machine()
            << " to " << argv[1] << "\n";
  return 0;
}
