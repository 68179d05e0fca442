// libFuzzer target: the YAML optimizer config — parser, validator, round trip, build_optimizer.
#include "harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  muon::fuzz::check_config_input(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
