// The default paths give the results recorded before the optimizers were restructured
// (tests/golden/record.sh): bit for bit on the machine that recorded them; elsewhere, where the
// BLAS kernels sum in another order, to within float32 rounding of that order.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>

#include "golden/machine.h"
#include "golden/scenarios.h"
#include "helpers.h"

namespace muon {
namespace {

TEST(Golden, DefaultPathsGiveTheRecordedResults) {
  std::ifstream file(std::string(MUON_TEST_DATA_DIR) + "/golden.pt", std::ios::binary);
  ASSERT_TRUE(file.good()) << "tests/data/golden.pt is missing (tests/golden/record.sh)";
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  const auto root = torch::jit::pickle_load(bytes).toGenericDict();
  const auto recorded_on = root.at("machine").toStringRef();
  const auto recorded = root.at("tensors").toGenericDict();
  const bool same_machine = recorded_on == golden::machine();
  std::cout << "recorded on: " << recorded_on << "\nthis machine: " << golden::machine() << "\n"
            << (same_machine ? "comparing bit for bit" : "comparing to float32 rounding") << "\n";
  const auto now = golden::run_all();
  EXPECT_EQ(now.size(), recorded.size());
  for (const auto& [name, t] : now) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(recorded.contains(name));
    const auto then = recorded.at(name).toTensor();
    ASSERT_EQ(t.sizes(), then.sizes());
    ASSERT_EQ(t.scalar_type(), then.scalar_type());
    if (same_machine) {
      EXPECT_TRUE(at::equal(t, then));
    } else {
      EXPECT_LE(testing::max_rel_diff(t, then), 1e-3);
    }
  }
}

}  // namespace
}  // namespace muon
