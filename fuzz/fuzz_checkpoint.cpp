// libFuzzer target: the checkpoint loader, on bytes mutated from a valid checkpoint.
#include "harness.h"

// MUON_FUZZ_WRITE_SEED=path: write a valid checkpoint of the fixture there and exit (scripts/fuzz.sh
// makes the seed corpus this way, so that it always matches the fixture).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* path = std::getenv("MUON_FUZZ_WRITE_SEED")) {
    muon::fuzz::write_checkpoint_seed(path);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  muon::fuzz::check_checkpoint_input(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
