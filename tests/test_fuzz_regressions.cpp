// The fuzz targets' checks (fuzz/harness.h) on their seed corpora, on every input a fuzzer ever
// found (tests/data/fuzz/<target>/), and on mutations of a valid checkpoint: in the normal build
// too, so that a fixed finding stays fixed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "harness.h"

namespace muon::fuzz {
namespace {

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::vector<std::filesystem::path> files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FuzzRegressions, ConfigCorpusAndFindings) {
  int count = 0;
  for (const auto& dir : {MUON_SOURCE_DIR "/fuzz/corpus/config", MUON_TEST_DATA_DIR "/fuzz/config"}) {
    for (const auto& path : files_in(dir)) {
      SCOPED_TRACE(path.string());
      check_config_input(read_bytes(path));
      ++count;
    }
  }
  EXPECT_GE(count, 10);
}

TEST(FuzzRegressions, CheckpointFindingsAndMutations) {
  const auto seed_path = std::filesystem::temp_directory_path() / "muon_fuzz_seed.pt";
  write_checkpoint_seed(seed_path.string());
  const auto seed = read_bytes(seed_path);
  ASSERT_GT(seed.size(), 1000u);
  check_checkpoint_input(seed);  // valid: loads
  for (const auto& path : files_in(MUON_TEST_DATA_DIR "/fuzz/checkpoint")) {
    SCOPED_TRACE(path.string());
    check_checkpoint_input(read_bytes(path));
  }
  // Truncations and single-byte changes all over the file.
  for (size_t cut = 0; cut < seed.size(); cut += seed.size() / 50 + 1) {
    check_checkpoint_input(seed.substr(0, cut));
  }
  for (size_t at = 0; at < seed.size(); at += seed.size() / 200 + 1) {
    auto changed = seed;
    changed[at] = static_cast<char>(changed[at] ^ 0x5a);
    check_checkpoint_input(changed);
  }
}

}  // namespace
}  // namespace muon::fuzz
