// The `muon` command line: train the demo GPT, show how a model is routed.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "muon/error.h"
#include "muon/routing.h"
#include "train.h"

namespace {

void add_model_options(CLI::App& cmd, muon::demo::GptConfig& model) {
  cmd.add_option("--layers", model.n_layers, "transformer blocks")->capture_default_str();
  cmd.add_option("--d-model", model.d_model, "model width")->capture_default_str();
  cmd.add_option("--heads", model.n_heads, "query heads")->capture_default_str();
  cmd.add_option("--kv-heads", model.n_kv_heads, "key/value heads (grouped-query attention)")
      ->capture_default_str();
  cmd.add_option("--seq-len", model.seq_len, "context length in bytes")->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "muon — Muon + AdamW optimizers for LibTorch.\n"
      "Run `muon train` to train a small GPT on the King James Bible with the hybrid optimizer."};
  app.require_subcommand(1);

  muon::demo::TrainConfig config;
  int threads = 0;
  auto* train = app.add_subcommand(
      "train",
      "Train the demo GPT (byte-level, RoPE, GQA, SwiGLU) with Muon for hidden matrices "
      "and AdamW for the rest; prints progress and writes metrics.csv, routing.txt and "
      "config.txt into --out.");
  train->add_option("--steps", config.steps, "optimizer updates")->capture_default_str();
  train->add_option("--seed", config.seed, "seed for initialization and batches")
      ->capture_default_str();
  train->add_option("--out", config.out_dir, "output directory")->capture_default_str();
  train->add_option("--data", config.data, "\"kjv\" (Debian's bible-kjv) or a text file")
      ->capture_default_str();
  train->add_option("--batch-size", config.batch_size, "sequences per step")->capture_default_str();
  train->add_option("--optimizer", config.optimizer,
                    "muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for all")
      ->check(CLI::IsMember({"muon", "adamw"}))
      ->capture_default_str();
  std::string state_dtype = "float32";
  train->add_option("--state-dtype", state_dtype,
                    "optimizer state storage: float32, or bfloat16 (stochastic rounding)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  train->add_option("--muon-lr", config.muon_lr, "peak learning rate of the Muon matrices")
      ->capture_default_str();
  train->add_option("--adamw-lr", config.adamw_lr, "peak learning rate of the AdamW tensors")
      ->capture_default_str();
  train->add_option("--log-every", config.log_every, "steps between progress lines")
      ->capture_default_str();
  train->add_option("--eval-every", config.eval_every, "steps between validation evaluations")
      ->capture_default_str();
  train->add_option("--threads", threads, "intra-op threads (0: LibTorch's default)")
      ->capture_default_str();
  add_model_options(*train, config.model);

  muon::demo::GptConfig route_model;
  bool untied = false;
  auto* route =
      app.add_subcommand("route",
                         "Print the routing report of the demo GPT: each parameter's shape, dtype, "
                         "optimizer (muon/adamw/frozen) and the reason.");
  route->add_flag("--untied", untied, "give the head its own weight instead of the embedding's");
  add_model_options(*route, route_model);

  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (*train) {
      config.state_dtype = state_dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
      muon::demo::train(config, std::cout);
    } else if (*route) {
      route_model.tie_embeddings = !untied;
      muon::demo::Gpt model(route_model);
      std::cout << muon::format_routing_report(muon::route(*model));
    }
  } catch (const muon::Error& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 2;
  }
  return 0;
}
