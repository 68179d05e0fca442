// Checkpoints: bit-exact resume, validation before any change, crash safety
// (docs/design.md §Checkpoints).
#include "muon/checkpoint.h"

#include "archive_check.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/config.h"
#include "muon/error.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using testing::expect_error;

cli::GptConfig tiny(int64_t d_model = 16, int64_t layers = 1) {
  cli::GptConfig c;
  c.n_layers = layers;
  c.d_model = d_model;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

OptimConfig config_with(const std::string& state_dtype) {
  return OptimConfig::from_yaml(
      "optimizer:\n  name: muon\n  normuon: true\n  state_dtype: " + state_dtype +
      "\n  schedule: {name: cosine, warmup_steps: 2}\n  grad_clip: 1.0\n");
}

// One training step on a batch that depends only on the step number.
void train_step(cli::Gpt& model, HybridOptimizer& opt, int64_t step) {
  auto gen = testing::seeded(1000 + static_cast<uint64_t>(step));
  const auto tokens = at::randint(0, 32, {4, 8}, gen, at::kLong);
  opt.zero_grad();
  model->loss(tokens, tokens.roll(1, 1)).backward();
  opt.step();
}

std::vector<at::Tensor> weights(cli::Gpt& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// A model initialized under seed `seed` and its optimizer for a run of `total` steps under
// `config`, trained for the steps before `steps`.
struct Trained {
  cli::Gpt model;
  std::unique_ptr<HybridOptimizer> opt;
};
Trained trained(const OptimConfig& config, uint64_t seed, int64_t steps, int64_t total,
                int64_t d_model = 16) {
  at::manual_seed(seed);
  cli::Gpt model(tiny(d_model));
  auto opt = build_optimizer(*model, config, total);
  for (int64_t s = 0; s < steps; ++s) train_step(model, *opt, s);
  return {model, std::move(opt)};
}

// Trains `run` from step `from` to `to` and expects the weights of `straight`, bit for bit.
void expect_continues_as(Trained& run, int64_t from, int64_t to, Trained& straight) {
  for (int64_t s = from; s < to; ++s) train_step(run.model, *run.opt, s);
  const auto a = weights(straight.model);
  const auto b = weights(run.model);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

TEST(Checkpoint, ResumeIsBitExactForFp32Bf16AndInt8State) {
  for (const char* dtype : {"float32", "bfloat16", "int8"}) {
    SCOPED_TRACE(dtype);
    const auto config = config_with(dtype);
    const int64_t K = 3;
    // Width 64: the MLP's matrices (256 × 64) are large enough for 8-bit state.
    const int64_t width = std::string(dtype) == "int8" ? 64 : 16;
    auto straight = trained(config, 1, 2 * K, 2 * K, width);
    auto first = trained(config, 1, K, 2 * K, width);
    const auto path = temp_path(std::string("muon_ckpt_") + dtype + ".pt");
    save_checkpoint(path, *first.opt, first.model.get(), config.to_yaml());

    // A differently initialized model: the checkpoint restores it.
    auto resumed = trained(config, 99, 0, 2 * K, width);
    const auto info = load_checkpoint(path, *resumed.opt, resumed.model.get());
    EXPECT_EQ(info.step_count, K);
    EXPECT_EQ(info.config_yaml, config.to_yaml());
    EXPECT_TRUE(info.converted_state.empty());
    expect_continues_as(resumed, K, 2 * K, straight);
  }
}

// A run's state saved in float32 resumes with int8 state (and back): converted once on load, as
// quantizing (dequantizing) the saved tensors gives, and reported.
TEST(Checkpoint, SwitchingBetweenFloatAndInt8StateConvertsOnce) {
  const int64_t K = 2;
  for (const auto& [from, to] : {std::pair{"float32", "int8"}, std::pair{"int8", "float32"}}) {
    SCOPED_TRACE(std::string(from) + " → " + to);
    auto first = trained(config_with(from), 1, K, 2 * K, 64);
    const auto path = temp_path(std::string("muon_ckpt_switch_") + from + ".pt");
    save_checkpoint(path, *first.opt, first.model.get());
    auto resumed = trained(config_with(to), 99, 0, 2 * K, 64);
    const auto info = load_checkpoint(path, *resumed.opt, resumed.model.get());
    ASSERT_FALSE(info.converted_state.empty());
    const auto resumed_params = resumed.model->named_parameters();
    for (const auto& item : first.model->named_parameters()) {
      const auto& name = item.key();
      const auto saved = read_param_state(*first.opt, item.value());
      if (!saved) continue;
      auto expected = *saved;
      const auto& q = resumed_params[name];
      const auto lines = convert_state_precision(*resumed.opt, q, expected, name);
      const auto loaded = read_param_state(*resumed.opt, q).value();
      for (const auto& [slot, t] : loaded.tensors) {
        EXPECT_TRUE(at::equal(t, expected.tensors.at(slot))) << name << "." << slot;
      }
      const bool converted = std::find_if(info.converted_state.begin(), info.converted_state.end(),
                                          [&](const std::string& line) {
                                            return line.rfind(name + ": ", 0) == 0;
                                          }) != info.converted_state.end();
      EXPECT_EQ(converted, !lines.empty()) << name;
    }
    train_step(resumed.model, *resumed.opt, K);  // and the run goes on
  }
}

TEST(Checkpoint, TruncatedCorruptAndForeignFilesChangeNothing) {
  const auto config = config_with("float32");
  at::manual_seed(2);
  cli::Gpt model(tiny());
  auto opt = build_optimizer(*model, config, 10);
  train_step(model, *opt, 0);
  const auto path = temp_path("muon_ckpt_good.pt");
  save_checkpoint(path, *opt, model.get());
  const auto before = weights(model);
  train_step(model, *opt, 1);  // state and weights now differ from the file
  const auto current = weights(model);

  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto truncated = temp_path("muon_ckpt_truncated.pt");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_error<Error>([&] { load_checkpoint(truncated, *opt, model.get()); },
                      {"muon_ckpt_truncated.pt' is truncated or corrupt", "nothing was loaded"});
  const auto garbage = temp_path("muon_ckpt_garbage.pt");
  std::ofstream(garbage, std::ios::binary) << std::string(4096, 'x');
  expect_error<Error>([&] { load_checkpoint(garbage, *opt, model.get()); },
                      {"truncated or corrupt"});
  expect_error<Error>([&] { load_checkpoint(temp_path("muon_no_such.pt"), *opt, model.get()); },
                      {"cannot read"});

  // A checkpoint of a different model: names, then shapes.
  cli::Gpt deeper(tiny(16, 2));
  auto deeper_opt = build_optimizer(*deeper, config, 10);
  expect_error<Error>([&] { load_checkpoint(path, *deeper_opt, deeper.get()); },
                      {"has no state for parameter 'blocks.1.", "different model"});
  cli::Gpt wider(tiny(32));
  auto wider_opt = build_optimizer(*wider, config, 10);
  expect_error<Error>([&] { load_checkpoint(path, *wider_opt, wider.get()); },
                      {"has shape", "this optimizer needs"});
  // A checkpoint with bf16 state into an fp32-state optimizer: dtype.
  auto bf16_opt = build_optimizer(*model, config_with("bfloat16"), 10);
  expect_error<Error>([&] { load_checkpoint(path, *bf16_opt, model.get()); },
                      {"has dtype Float, this optimizer stores BFloat16"});

  // An AdamW checkpoint into a hybrid whose others run Adam (the same state tensors): the
  // algorithm each parameter was optimized by.
  auto adam_opt = build_optimizer(
      *model, OptimConfig::from_yaml("optimizer: {name: muon, normuon: true, others: adam}\n"), 10);
  expect_error<Error>([&] { load_checkpoint(path, *adam_opt, model.get()); },
                      {"checkpoint: state['blocks.0.attn_norm.weight'] was optimized by adamw, this "
                       "optimizer runs adam on it"});

  const auto after = weights(model);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i], current[i])) << i;
  // The good file still loads and restores the earlier weights.
  load_checkpoint(path, *opt, model.get());
  const auto restored = weights(model);
  for (size_t i = 0; i < restored.size(); ++i) EXPECT_TRUE(at::equal(restored[i], before[i])) << i;
}

// Rewrites the checkpoint at `path` as versions before Dion was an algorithm wrote it: its
// parameters' entries said `algorithm: muon` (the state, dion_q included, was the same).
void write_as_when_dion_was_a_muon_setting(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  auto root = torch::jit::pickle_load(bytes).toGenericDict();
  auto state = root.at("state").toGenericDict();
  int rewritten = 0;
  for (const auto& item : state) {
    auto entry = item.value().toGenericDict();
    if (entry.at("algorithm").toStringRef() == "dion") {
      entry.insert_or_assign("algorithm", std::string("muon"));
      ++rewritten;
    }
  }
  EXPECT_GT(rewritten, 0);
  const auto out = torch::jit::pickle_save(c10::IValue(root));
  std::ofstream(path, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
}

TEST(Checkpoint, DionRunsOfEarlierVersionsResume) {
  const auto config = OptimConfig::from_yaml("optimizer: {name: dion, dion: {rank_fraction: 0.5}}\n");
  const int64_t K = 2;
  auto straight = trained(config, 4, 2 * K, 2 * K);
  auto first = trained(config, 4, K, 2 * K);
  const auto path = temp_path("muon_ckpt_dion_earlier.pt");
  save_checkpoint(path, *first.opt, first.model.get());
  write_as_when_dion_was_a_muon_setting(path);

  // A Muon hybrid refuses it (its matrices ran Dion), naming what ran them.
  auto muon = trained(OptimConfig::from_yaml("optimizer: muon\n"), 5, 0, 2 * K);
  expect_error<Error>([&] { load_checkpoint(path, *muon.opt, muon.model.get()); },
                      {"was optimized by dion, this optimizer runs muon on it"});

  auto resumed = trained(config, 5, 0, 2 * K);
  load_checkpoint(path, *resumed.opt, resumed.model.get());
  expect_continues_as(resumed, K, 2 * K, straight);

  // Saved before the first step: no entry holds state (nor dion_q), and each says muon.
  auto fresh = trained(config, 4, 0, 2 * K);
  const auto early = temp_path("muon_ckpt_dion_earlier_fresh.pt");
  save_checkpoint(early, *fresh.opt, fresh.model.get());
  write_as_when_dion_was_a_muon_setting(early);
  auto restarted = trained(config, 6, 0, 2 * K);
  load_checkpoint(early, *restarted.opt, restarted.model.get());
  expect_continues_as(restarted, 0, 2 * K, straight);
}

TEST(Checkpoint, ArchiveChecksBoundEverySizeByTheFile) {
  using detail::check_pickle_structure;
  using detail::check_zip_structure;
  // PROTO 2, BININT1 5, BINPUT 0, BINGET 0, TUPLE2, STOP: fine.
  check_pickle_structure(std::string("\x80\x02K\x05q\x00h\x00\x86.", 10));
  // A memo index LibTorch's unpickler would allocate a 2^31-entry table for.
  expect_error<Error>(
      [] { check_pickle_structure(std::string("\x80\x02K\x05r\xff\xff\xff\x7f.", 10)); },
      {"the pickle refers to memo entry 2147483647 with 0 memoized"});
  expect_error<Error>([] { check_pickle_structure(std::string("X\xff\xff\xff\x0f", 5)); },
                      {"the pickle's string runs past its end"});
  expect_error<Error>([] { check_pickle_structure("K\x05"); }, {"without its STOP"});
  expect_error<Error>([] { check_pickle_structure("\xff."); },
                      {"the pickle holds opcode 0xff, which a checkpoint never contains"});
  // The simulated stack: a fill without its dict, two values left, a foreign global.
  expect_error<Error>([] { check_pickle_structure("(K\x01K\x02u."); },
                      {"the pickle's SETITEMS has no dict to fill"});
  expect_error<Error>([] { check_pickle_structure("K\x01K\x02."); },
                      {"the pickle ends with 2 items on its stack instead of one"});
  expect_error<Error>([] { check_pickle_structure("cos\nsystem\n)R."); },
                      {"the pickle names 'os.system', which a checkpoint never contains"});

  // A real checkpoint passes; a changed byte fails its entry's CRC-32; an entry claiming 2 GB
  // fails, and load says so.
  cli::Gpt model(tiny());
  auto opt = build_optimizer(*model, config_with("float32"), 10);
  train_step(model, *opt, 0);
  const auto path = temp_path("muon_ckpt_sizes.pt");
  save_checkpoint(path, *opt, model.get());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check_zip_structure(bytes);
  auto flipped = bytes;
  flipped[flipped.size() / 3] ^= 0x01;
  expect_error<Error>([&] { check_zip_structure(flipped); }, {"fails its CRC-32 check"});
  const std::string central("PK\x01\x02", 4);
  const auto entry = std::search(bytes.begin(), bytes.end(), central.begin(), central.end());
  ASSERT_NE(entry, bytes.end());
  for (const int field : {20, 24}) {  // compressed and uncompressed size: 0x7fffffff
    std::fill(entry + field, entry + field + 3, '\xff');
    *(entry + field + 3) = '\x7f';
  }
  expect_error<Error>([&] { check_zip_structure(bytes); },
                      {"zip entry 0 claims 2147483647 bytes beyond the end of its data"});
  const auto broken = temp_path("muon_ckpt_sizes_broken.pt");
  std::ofstream(broken, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_error<Error>([&] { load_checkpoint(broken, *opt, model.get()); },
                      {"is truncated or corrupt (zip entry 0 claims"});
}

TEST(Checkpoint, KillingTheWriterLeavesThePreviousCheckpointLoadable) {
  const auto config = config_with("float32");
  at::manual_seed(3);
  cli::Gpt model(tiny(64, 2));
  auto opt = build_optimizer(*model, config, 10);
  train_step(model, *opt, 0);
  const auto path = temp_path("muon_ckpt_crash.pt");
  save_checkpoint(path, *opt, model.get());
  for (int attempt = 0; attempt < 5; ++attempt) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (;;) save_checkpoint(path, *opt, model.get());  // until killed
    }
    usleep(static_cast<useconds_t>(2000 + 3000 * attempt));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    cli::Gpt fresh(tiny(64, 2));
    auto fresh_opt = build_optimizer(*fresh, config, 10);
    EXPECT_NO_THROW(load_checkpoint(path, *fresh_opt, fresh.get())) << "attempt " << attempt;
  }
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

c10::impl::GenericDict pickled_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  return torch::jit::pickle_load(bytes).toGenericDict();
}

// Files of version 1, whose roles say muon and adamw, as that version's trained() runs wrote them
// (seed 11, two of four steps; tests/data/checkpoint_*.pt): each loads, and the optimizer and
// model then hold exactly the file's tensors — what saving them again writes, role names aside.
TEST(Checkpoint, FilesOfVersionOneLoadUnchanged) {
  const std::pair<const char*, const char*> files[] = {
      {"checkpoint_muon_adamw.pt",
       "optimizer:\n  name: muon\n  normuon: true\n  state_dtype: bfloat16\n"
       "  schedule: {name: cosine, warmup_steps: 2}\n  grad_clip: 1.0\n"},
      {"checkpoint_dion_lion.pt",
       "optimizer: {name: dion, others: lion, dion: {rank_fraction: 0.5}}\n"}};
  for (const auto& [name, yaml] : files) {
    SCOPED_TRACE(name);
    const std::string path = std::string(MUON_TEST_DATA_DIR) + "/" + name;
    const auto old = pickled_dict(path);
    ASSERT_EQ(old.at("version").toInt(), 1);
    const auto config = OptimConfig::from_yaml(yaml);
    auto fresh = trained(config, 12, 0, 4);
    EXPECT_EQ(load_checkpoint(path, *fresh.opt, fresh.model.get()).step_count, 2);
    const auto again = temp_path("muon_ckpt_version_one_again.pt");
    save_checkpoint(again, *fresh.opt, fresh.model.get());
    const auto now = pickled_dict(again);
    EXPECT_EQ(now.at("version").toInt(), 2);
    const auto old_state = old.at("state").toGenericDict();
    const auto new_state = now.at("state").toGenericDict();
    ASSERT_EQ(old_state.size(), new_state.size());
    std::set<std::string> roles;
    for (const auto& item : old_state) {
      const auto key = item.key().toStringRef();
      SCOPED_TRACE(key);
      const auto was = item.value().toGenericDict();
      const auto is = new_state.at(key).toGenericDict();
      roles.insert(was.at("role").toStringRef());
      EXPECT_EQ(is.at("role").toStringRef(), current_role_name(was.at("role").toStringRef()));
      ASSERT_EQ(was.size(), is.size());
      for (const auto& field : was) {
        if (field.key().toStringRef() == "role") continue;
        const auto& mine = is.at(field.key());
        if (field.value().isTensor()) {
          EXPECT_TRUE(at::equal(field.value().toTensor(), mine.toTensor()))
              << field.key().toStringRef();
        } else {
          EXPECT_EQ(field.value(), mine) << field.key().toStringRef();
        }
      }
    }
    EXPECT_EQ(roles, (std::set<std::string>{"adamw", "muon"}));
    const auto old_model = old.at("model").toGenericDict();
    const auto new_model = now.at("model").toGenericDict();
    ASSERT_EQ(old_model.size(), new_model.size());
    for (const auto& item : old_model) {
      EXPECT_TRUE(at::equal(item.value().toTensor(), new_model.at(item.key()).toTensor()))
          << item.key().toStringRef();
    }
    train_step(fresh.model, *fresh.opt, 2);  // and the run goes on
  }
}

// A role that differs from this optimizer's routing, and a version this build does not know, are
// refused by name.
TEST(Checkpoint, RolesAndVersionsAreChecked) {
  const std::string path = std::string(MUON_TEST_DATA_DIR) + "/checkpoint_muon_adamw.pt";
  auto rerouted = trained(OptimConfig::from_yaml("optimizer: {normuon: true, state_dtype: "
                                                 "bfloat16, routing: {adamw: ['*q_proj*']}}\n"),
                          12, 0, 4);
  expect_error<Error>([&] { load_checkpoint(path, *rerouted.opt, rerouted.model.get()); },
                      {"checkpoint: state['blocks.0.attn.q_proj.weight'] was routed to the "
                       "matrices, this optimizer routes it to the others"});
  auto root = pickled_dict(path);
  root.insert_or_assign("version", int64_t{3});
  const auto future = temp_path("muon_ckpt_future.pt");
  const auto out = torch::jit::pickle_save(c10::IValue(root));
  std::ofstream(future, std::ios::binary)
      .write(out.data(), static_cast<std::streamsize>(out.size()));
  auto fresh = trained(config_with("bfloat16"), 12, 0, 4);
  expect_error<Error>([&] { load_checkpoint(future, *fresh.opt, fresh.model.get()); },
                      {"muon_ckpt_future.pt' has version 3; this build reads versions 1 to 2"});
}

}  // namespace
}  // namespace muon
