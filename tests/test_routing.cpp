// Routing of the demo GPT and of hand-made modules (docs/design.md §Routing, rules 1, 2 and 5).
#include "muon/routing.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <map>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/error.h"
#include "muon/hybrid.h"

namespace muon {
namespace {

std::map<std::string, const RoutedParameter*> by_name(const std::vector<RoutedParameter>& routes) {
  std::map<std::string, const RoutedParameter*> out;
  for (const auto& r : routes) out[r.name] = &r;
  return out;
}

cli::GptConfig small_gpt(int64_t layers, bool tied) {
  cli::GptConfig c;
  c.n_layers = layers;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.seq_len = 16;
  c.tie_embeddings = tied;
  return c;
}

TEST(Routing, TiedGptSendsSevenMatricesPerLayerToMuonAndTheRestToAdamW) {
  for (int64_t layers : {1, 3}) {
    cli::Gpt model(small_gpt(layers, /*tied=*/true));
    const auto routes = route(*model);
    const auto muon = tensors_with_role(routes, Role::matrices);
    const auto adamw = tensors_with_role(routes, Role::others);
    EXPECT_EQ(muon.size(), static_cast<size_t>(7 * layers));
    EXPECT_EQ(adamw.size(), static_cast<size_t>(2 * layers + 2));
    // The tied tensor appears once, under the embedding's name.
    const auto named = by_name(routes);
    ASSERT_EQ(named.count("wte.weight"), 1u);
    EXPECT_EQ(named.count("lm_head.weight"), 0u);
    EXPECT_EQ(named.at("wte.weight")->role, Role::others);
    EXPECT_EQ(named.at("wte.weight")->reason,
              "owned by an embedding module (torch::nn::EmbeddingImpl)");
    EXPECT_TRUE(named.at("wte.weight")->tensor.is_same(model->lm_head->weight));
    for (const char* proj : {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      const auto& r = *named.at(std::string("blocks.0.") + proj + ".weight");
      EXPECT_EQ(r.role, Role::matrices) << proj;
      EXPECT_EQ(r.reason, "hidden 2-D matrix");
    }
    const auto& norm = *named.at("blocks.0.attn_norm.weight");
    EXPECT_EQ(norm.role, Role::others);
    EXPECT_EQ(norm.reason, "rank-1 tensor");
    // Every trainable tensor of the model is in exactly one optimizer.
    EXPECT_EQ(muon.size() + adamw.size(), routes.size());
  }
}

TEST(Routing, UntiedHeadIsAdamWByItsRows) {
  cli::Gpt model(small_gpt(2, /*tied=*/false));
  const auto routes = route(*model);
  EXPECT_EQ(tensors_with_role(routes, Role::matrices).size(), 14u);
  EXPECT_EQ(tensors_with_role(routes, Role::others).size(), 2u * 2 + 3);
  const auto named = by_name(routes);
  EXPECT_EQ(named.at("lm_head.weight")->role, Role::others);
  EXPECT_EQ(named.at("lm_head.weight")->reason,
            "an output head: its " + std::to_string(model->wte->weight.size(0)) +
                " rows match the embedding 'wte.weight'");
  EXPECT_EQ(routing_warning(routes), "");  // the structure decided everything
}

TEST(Routing, FrozenParametersAreInNeitherOptimizer) {
  cli::Gpt model(small_gpt(1, true));
  model->blocks[0]->as<cli::BlockImpl>()->attn->q_proj->weight.set_requires_grad(false);
  model->norm->weight.set_requires_grad(false);
  const auto routes = route(*model);
  const auto named = by_name(routes);
  EXPECT_EQ(named.at("blocks.0.attn.q_proj.weight")->role, Role::frozen);
  EXPECT_EQ(named.at("norm.weight")->reason, "requires_grad is false");
  EXPECT_EQ(tensors_with_role(routes, Role::matrices).size(), 6u);
  EXPECT_EQ(tensors_with_role(routes, Role::others).size(), 3u);
  EXPECT_EQ(tensors_with_role(routes, Role::frozen).size(), 2u);
}

TEST(Routing, NameTypeAndRankHeuristics) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const std::vector<NamedParameter> params = {
      {"layers.0.custom_mixer", t({8, 8}), "MyModule"},
      {"layers.0.proj.bias", t({8}), "torch::nn::LinearImpl"},
      {"layers.0.gate.bias_matrix_bias", t({8, 8}), "MyModule"},
      {"ln_f.weight", t({8, 8}), "torch::nn::LayerNormImpl"},
      {"tok.weight", t({16, 8}), "torch::nn::EmbeddingImpl"},
      {"Classifier.weight", t({3, 8}), "torch::nn::LinearImpl"},
      {"model.value_embeds.0", t({12, 8}), ""},
      {"attn.out_proj.weight", t({8, 8}), "torch::nn::LinearImpl"},
      {"conv.weight", t({4, 3, 3, 3}), "torch::nn::Conv2dImpl"},
      {"scale", t({}), ""},
      {"counts", at::zeros({4, 4}, at::kLong), ""},
      {"heads.weight", t({8, 8}), ""},
  };
  const auto routes = route(params);
  const auto named = by_name(routes);
  auto expect = [&](const std::string& name, Role role, const std::string& reason) {
    EXPECT_EQ(named.at(name)->role, role) << name;
    EXPECT_EQ(named.at(name)->reason, reason) << name;
  };
  expect("layers.0.custom_mixer", Role::matrices, "hidden 2-D matrix");
  expect("layers.0.proj.bias", Role::others, "rank-1 tensor");
  expect("layers.0.gate.bias_matrix_bias", Role::others, "a bias");
  expect("ln_f.weight", Role::others, "owned by a norm module (torch::nn::LayerNormImpl)");
  expect("tok.weight", Role::others, "owned by an embedding module (torch::nn::EmbeddingImpl)");
  expect("Classifier.weight", Role::others, "name part 'classifier' marks an input/output layer");
  expect("model.value_embeds.0", Role::others,
         "name part 'value_embeds' marks an input/output layer");
  expect("attn.out_proj.weight", Role::matrices, "hidden 2-D matrix");
  expect("conv.weight", Role::others,
         "rank-4 tensor without declared matrix axes (higher_rank policy 'adamw')");
  expect("scale", Role::others, "rank-0 tensor");
  expect("counts", Role::frozen, "requires_grad is false");
  // "heads" is not "head": whole parts only.
  expect("heads.weight", Role::matrices, "hidden 2-D matrix");
}

TEST(Routing, WithoutNamesRankAndDtypeDecideAlone) {
  // Parameters given without names (Python's plain tensors): the names below would send each of
  // them to AdamW, or make the last a guessed output layer; without use_names they count for
  // nothing.
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const std::vector<NamedParameter> params = {
      {"0.bias_matrix_bias", t({8, 8}), ""}, {"1.lm_head", t({8, 8}), ""}, {"2.bias", t({8}), ""},
      {"3.conv", t({4, 3, 3, 3}), ""},       {"4.out", t({3, 8}), ""},
  };
  RoutingRules rules;
  rules.use_names = false;
  const auto routes = route(params, rules);
  const auto named = by_name(routes);
  const std::string by_shape = "2-D matrix (routed by shape: given without a name)";
  for (const char* name : {"0.bias_matrix_bias", "1.lm_head", "4.out"}) {
    EXPECT_EQ(named.at(name)->role, Role::matrices) << name;
    EXPECT_EQ(named.at(name)->reason, by_shape) << name;
  }
  EXPECT_EQ(named.at("2.bias")->reason, "rank-1 tensor");
  EXPECT_EQ(named.at("3.conv")->role, Role::others);  // the higher_rank policy still applies
  // With names, the same parameters go as their names say.
  const auto routes_by_name = route(params);
  const auto with_names = by_name(routes_by_name);
  EXPECT_EQ(with_names.at("0.bias_matrix_bias")->role, Role::others);
  EXPECT_EQ(with_names.at("1.lm_head")->role, Role::others);
  EXPECT_EQ(with_names.at("4.out")->role, Role::others);
}

TEST(Routing, OutputLayersOfCommonModelsGoToAdamW) {
  // nn.Sequential(Linear, ReLU, Linear): the last layer produces the output.
  torch::nn::Sequential mlp(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
  const auto sequential = route(*mlp);
  auto named = by_name(sequential);
  EXPECT_EQ(named.at("0.weight")->role, Role::matrices);
  EXPECT_EQ(named.at("2.weight")->role, Role::others);
  EXPECT_EQ(named.at("2.weight")->reason,
            "the last layer of a sequential model (it produces the output)");
  // Output layers and positional tables by name; a tensor of a model without one is a guess.
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const auto routes = route(std::vector<NamedParameter>{{"pos", t({32, 8}), ""},
                                                        {"fc1.weight", t({16, 8}), ""},
                                                        {"out.weight", t({4, 16}), ""},
                                                        {"logits.weight", t({4, 16}), ""}});
  named = by_name(routes);
  EXPECT_EQ(named.at("pos")->reason, "name part 'pos' marks an input/output layer");
  EXPECT_EQ(named.at("out.weight")->role, Role::others);
  EXPECT_EQ(named.at("logits.weight")->role, Role::others);
  EXPECT_EQ(named.at("fc1.weight")->reason, "hidden 2-D matrix");  // io layers were seen
  const auto guessed = route(
      std::vector<NamedParameter>{{"fc1.weight", t({16, 8}), ""}, {"fc2.weight", t({4, 16}), ""}});
  EXPECT_EQ(guessed[0].reason, "hidden 2-D matrix");
  EXPECT_EQ(guessed[1].role, Role::matrices);
  EXPECT_NE(guessed[1].reason.find("a guess: the model's last matrix"), std::string::npos);
}

// What the structure shows decides before names (docs/design.md §Routing, rule 5): the three ways
// names alone sent layers to the wrong algorithm.
TEST(Routing, MatricesInsideRepeatedBlocksAreHiddenWhateverTheirNames) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const auto routes = route(std::vector<NamedParameter>{
      {"wte.weight", t({64, 16}), "Embedding"},
      {"blocks.0.mlp.out.weight", t({16, 64}), "Linear"},
      {"blocks.1.mlp.output_proj.weight", t({16, 64}), "Linear"},
      {"layers.3.ffn.head.weight", t({64, 16}), "Linear"},  // as many rows as the vocabulary too
      {"h.0.attn.c_proj.weight", t({16, 16}), "Conv1D"},
      {"lm_head.weight", t({64, 16}), "Linear"}});
  const auto named = by_name(routes);
  for (const char* name : {"blocks.0.mlp.out.weight", "blocks.1.mlp.output_proj.weight",
                           "layers.3.ffn.head.weight", "h.0.attn.c_proj.weight"}) {
    EXPECT_EQ(named.at(name)->role, Role::matrices) << name;
    EXPECT_EQ(named.at(name)->reason, "hidden 2-D matrix") << name;
    EXPECT_FALSE(named.at(name)->guessed) << name;
  }
  EXPECT_EQ(named.at("lm_head.weight")->reason,
            "an output head: its 64 rows match the embedding 'wte.weight'");
  // A list of single layers is no block: its last matrix may produce the output, a guess.
  const auto list = route(std::vector<NamedParameter>{{"layers.0.weight", t({16, 8}), "Linear"},
                                                      {"layers.1.weight", t({4, 16}), "Linear"}});
  EXPECT_FALSE(list[0].guessed);
  EXPECT_TRUE(list[1].guessed);
}

TEST(Routing, TheLogitsHeadOfASequentialModelWithAnEmbeddingIsAdamW) {
  // README's example: nn.Sequential(Embedding(256, 64), Linear(64, 64), ReLU, Linear(64, 256)).
  torch::nn::Sequential model(torch::nn::Embedding(256, 64), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 256));
  const auto logits = route(*model);
  auto named = by_name(logits);
  EXPECT_EQ(named.at("1.weight")->role, Role::matrices);
  EXPECT_EQ(named.at("3.weight")->role, Role::others);
  EXPECT_EQ(named.at("3.weight")->reason,
            "an output head: its 256 rows match the embedding '0.weight'");
  // A classifier over the sequence: its rows match nothing; it is still the last layer.
  torch::nn::Sequential classifier(torch::nn::Embedding(256, 64), torch::nn::Linear(64, 64),
                                   torch::nn::ReLU(), torch::nn::Linear(64, 10));
  const auto routes = route(*classifier);
  named = by_name(routes);
  EXPECT_EQ(named.at("1.weight")->role, Role::matrices);
  EXPECT_EQ(named.at("3.weight")->role, Role::others);
  EXPECT_EQ(named.at("3.weight")->reason,
            "the last layer of a sequential model (it produces the output)");
  EXPECT_EQ(routing_warning(routes), "");
}

TEST(Routing, AHeadWithTheVocabularysRowsOrTiedToTheEmbeddingIsAnOutputLayerWhateverItsName) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const auto routes =
      route(std::vector<NamedParameter>{{"tok.weight", t({100, 16}), "Embedding"},
                                        {"blocks.0.proj.weight", t({16, 16}), ""},
                                        {"proj.weight", t({100, 16}), "Linear"}});
  auto named = by_name(routes);
  EXPECT_EQ(named.at("blocks.0.proj.weight")->role, Role::matrices);
  EXPECT_EQ(named.at("proj.weight")->role, Role::others);
  EXPECT_EQ(named.at("proj.weight")->reason,
            "an output head: its 100 rows match the embedding 'tok.weight'");
  // The tied tensor met first under the head's name: the embedding's own name comes later.
  const auto shared = t({100, 16});
  const auto tied = route(std::vector<NamedParameter>{{"decoder.weight", shared, "Linear"},
                                                       {"fc.weight", t({16, 16}), "Linear"},
                                                       {"encoder.weight", shared, "Embedding"}});
  named = by_name(tied);
  ASSERT_EQ(named.count("encoder.weight"), 0u);
  EXPECT_EQ(named.at("decoder.weight")->role, Role::others);
  EXPECT_EQ(named.at("decoder.weight")->reason, "tied to the embedding 'encoder.weight'");
  EXPECT_EQ(named.at("fc.weight")->role, Role::matrices);
}

TEST(Routing, RolesThatRestOnANameOrAGuessAreMarkedAndWarnedOnce) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const std::vector<NamedParameter> params = {{"fc1.weight", t({16, 8}), "Linear"},
                                              {"score.weight", t({3, 16}), "Linear"}};
  const auto routes = route(params);
  EXPECT_TRUE(routes[1].guessed);
  EXPECT_FALSE(routes[0].guessed);
  const std::string warning =
      "routing: 1 parameter's role rests on a name or a guess, not on the model's structure: "
      "'score.weight' → others (name part 'score' marks an input/output layer). If one is wrong, "
      "route it with a routing.adamw or routing.muon pattern (or a tag in C++); from Python, "
      "example_inputs= finds the output layer by a traced forward";
  EXPECT_EQ(routing_warning(routes), warning);
  ::testing::internal::CaptureStderr();
  route(params);
  const auto printed = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find(warning), std::string::npos) << printed;
  // routing.outputs names the output layer: the structure is known, nothing is guessed.
  RoutingRules rules;
  rules.output_names = {"score.weight"};
  const auto known = route(params, rules);
  EXPECT_EQ(known[1].role, Role::others);
  EXPECT_EQ(known[1].reason, "produces the model's output (routing.outputs)");
  EXPECT_EQ(routing_warning(known), "");
  // A model whose ends nothing shows: its last matrix stays hidden, a guess, listed.
  const auto guessed = route(std::vector<NamedParameter>{{"fc1.weight", t({16, 8}), ""},
                                                         {"fc2.weight", t({4, 16}), ""}});
  EXPECT_TRUE(guessed[1].guessed);
  EXPECT_EQ(routing_warning(guessed).rfind(
                "routing: 1 parameter's role rests on a name or a guess, not on the model's "
                "structure: 'fc2.weight' → matrices (hidden 2-D matrix (a guess: the model's last "
                "matrix;",
                0),
            0u);
}

// The naming of three common GPTs routes as it did before structure came first: nanoGPT and HF's
// GPT-2 (tied head), nanochat (untied head over the same vocabulary); no warning.
TEST(Routing, NanoGptNanochatAndHfGpt2RouteTheirHiddenMatricesToMuonAndNothingIsGuessed) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const auto vocab = 96, d = 16;
  const auto wte = t({vocab, d});
  auto gpt = [&](const std::string& matrix_type, const std::vector<std::string>& matrices,
                 bool tied) {
    std::vector<NamedParameter> p = {{"transformer.wte.weight", wte, "Embedding"},
                                     {"transformer.wpe.weight", t({32, d}), "Embedding"}};
    for (int layer = 0; layer < 2; ++layer) {
      const auto block = "transformer.h." + std::to_string(layer) + ".";
      p.push_back({block + "ln_1.weight", t({d}), "LayerNorm"});
      for (const auto& m : matrices) p.push_back({block + m + ".weight", t({d, d}), matrix_type});
      p.push_back({block + "ln_2.weight", t({d}), "LayerNorm"});
    }
    p.push_back({"transformer.ln_f.weight", t({d}), "LayerNorm"});
    p.push_back({"lm_head.weight", tied ? wte : t({vocab, d}), "Linear"});
    return p;
  };
  const std::vector<std::string> nanogpt = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                            "mlp.c_proj"};
  const std::vector<std::string> nanochat = {"attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj",
                                             "mlp.c_fc", "mlp.c_proj"};
  for (const auto& [model, routes] :
       {std::pair{"nanoGPT", route(gpt("Linear", nanogpt, true))},
        std::pair{"HF GPT-2", route(gpt("Conv1D", nanogpt, true))},
        std::pair{"nanochat", route(gpt("Linear", nanochat, false))}}) {
    const bool untied = std::string(model) == "nanochat";
    const size_t per_layer = untied ? nanochat.size() : nanogpt.size();
    EXPECT_EQ(tensors_with_role(routes, Role::matrices).size(), 2 * per_layer) << model;
    EXPECT_EQ(tensors_with_role(routes, Role::others).size(), 2u + 5 + (untied ? 1 : 0)) << model;
    EXPECT_EQ(routing_warning(routes), "") << model;
  }
}

TEST(Routing, OverridesByPatternAndByTagWithClearErrors) {
  cli::Gpt model(small_gpt(1, true));
  RoutingRules rules;
  rules.adamw_patterns = {"*.mlp.*"};
  rules.muon_patterns = {"*.up_proj.weight"};  // muon patterns are checked before adamw ones
  rules.tag_module(*model->blocks[0]->as<cli::BlockImpl>()->attn->v_proj, Role::others);
  const auto routes = route(*model, rules);
  const auto named = by_name(routes);
  EXPECT_EQ(named.at("blocks.0.mlp.gate_proj.weight")->role, Role::others);
  EXPECT_EQ(named.at("blocks.0.mlp.gate_proj.weight")->reason, "routing.adamw pattern '*.mlp.*'");
  EXPECT_EQ(named.at("blocks.0.mlp.up_proj.weight")->role, Role::matrices);
  EXPECT_EQ(named.at("blocks.0.mlp.up_proj.weight")->reason,
            "routing.muon pattern '*.up_proj.weight'");
  EXPECT_EQ(named.at("blocks.0.attn.v_proj.weight")->role, Role::others);
  EXPECT_EQ(named.at("blocks.0.attn.v_proj.weight")->reason, "tagged 'others' in code");
  EXPECT_EQ(role_from_string("frozen"), Role::frozen);
  EXPECT_EQ(role_from_string(current_role_name("muon")), Role::matrices);  // files of version 1
  EXPECT_EQ(role_from_string(current_role_name("adamw")), Role::others);
  // Code written before the roles were named after the slots still compiles, with a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  static_assert(Role::muon == Role::matrices && Role::adamw == Role::others);
#pragma GCC diagnostic pop
  testing::expect_error<Error>([] { role_from_string("sgd"); },
                               {"unknown optimizer role 'sgd'", "matrices, others, frozen"});
  RoutingRules bad;
  bad.muon_patterns = {"*norm*"};
  testing::expect_error<Error>([&] { route(*model, bad); },
                               {"parameter 'blocks.0.attn_norm.weight' of shape [32]",
                                "overridden to muon (routing.muon pattern '*norm*')",
                                "floating-point 2-D matrix or declared matrix axes"});
}

TEST(Routing, ConvKernelUnderEachHigherRankPolicy) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3));
  RoutingRules rules;
  auto routed = route(*conv, rules);
  EXPECT_EQ(routed[0].role, Role::others);
  EXPECT_EQ(routed[0].reason,
            "rank-4 tensor without declared matrix axes (higher_rank policy 'adamw')");
  EXPECT_EQ(routed[1].reason, "rank-1 tensor");  // the bias
  rules.higher_rank = HigherRankPolicy::flatten;
  routed = route(*conv, rules);
  EXPECT_EQ(routed[0].role, Role::matrices);
  EXPECT_EQ(routed[0].view, (std::vector<int64_t>{8, 27}));
  EXPECT_EQ(routed[0].reason, "rank-4 tensor flattened to [8, 27] (higher_rank policy 'flatten')");
  rules.higher_rank = HigherRankPolicy::error;
  testing::expect_error<Error>([&] { route(*conv, rules); },
                               {"parameter 'weight' is a rank-4 tensor of shape [8, 3, 3, 3]",
                                "higher_rank policy 'error'", "'flatten' or 'adamw'"});
  EXPECT_EQ(higher_rank_policy_from_string("flatten"), HigherRankPolicy::flatten);
  testing::expect_error<Error>([] { higher_rank_policy_from_string("reshape"); },
                               {"'reshape'", "adamw, flatten, error"});
}

TEST(Routing, DeclaredAxesFollowDewsRules) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const std::vector<NamedParameter> params = {
      {"attn.q", t({64, 4, 16}), ""},         // (embed, heads, head_dim)
      {"attn.o", t({4, 16, 64}), ""},         // (heads, head_dim, embed)
      {"moe.up", t({8, 64, 128}), ""},        // (exp, embed, mlp)
      {"moe.router", t({64, 8}), ""},         // (embed, exp)
      {"tok", t({256, 64}), ""},              // (vocab, embed)
      {"lm_head_like", t({64, 256}), "Foo"},  // (embed, output)
      {"norm_scale", t({64}), ""},            // (embed)
  };
  RoutingRules rules;
  rules.declare_axes("attn.q", {"embed", "heads", "head_dim"});
  rules.declare_axes("attn.o", {"heads", "head_dim", "embed"});
  rules.declare_axes("moe.up", {"exp", "embed", "mlp"});
  rules.declare_axes("moe.router", {"embed", "exp"});
  rules.declare_axes("tok", {"vocab", "embed"});
  rules.declare_axes("lm_head_like", {"embed", "output"});
  rules.declare_axes("norm_scale", {"embed"});
  const auto routes = route(params, rules);
  const auto named = by_name(routes);
  auto expect = [&](const std::string& name, Role role, std::vector<int64_t> view,
                    const std::string& reason) {
    EXPECT_EQ(named.at(name)->role, role) << name;
    EXPECT_EQ(named.at(name)->view, view) << name;
    EXPECT_EQ(named.at(name)->reason, reason) << name;
  };
  expect("attn.q", Role::matrices, {64, 64},
         "declared axes (embed, heads, head_dim): matrix (embed) x (heads, head_dim)");
  expect("attn.o", Role::matrices, {64, 64},
         "declared axes (heads, head_dim, embed): matrix (heads, head_dim) x (embed)");
  expect("moe.up", Role::matrices, {8, 64, 128},
         "declared axes (exp, embed, mlp): matrix (embed) x (mlp)");
  expect("moe.router", Role::others, {}, "declared axes (embed, exp): a router (last axis 'exp')");
  expect("tok", Role::others, {}, "declared axes (vocab, embed): selection axis 'vocab'");
  expect("lm_head_like", Role::others, {},
         "declared axes (embed, output): selection axis 'output'");
  expect("norm_scale", Role::others, {}, "rank-1 tensor");

  RoutingRules undeclarable;
  undeclarable.declare_axes("w", {"heads", "embed", "head_dim"});
  testing::expect_error<Error>(
      [&] {
        route(std::vector<NamedParameter>{{"w", t({4, 64, 16}), ""}}, undeclarable);
      },
      {"parameter 'w'", "3 matrix sides (heads) (embed) (head_dim)", "exactly two"});
  RoutingRules late_expert;
  late_expert.declare_axes("w", {"embed", "exp", "mlp"});
  testing::expect_error<Error>(
      [&] {
        route(std::vector<NamedParameter>{{"w", t({64, 8, 32}), ""}}, late_expert);
      },
      {"batch axis 'exp' after a matrix axis"});
  RoutingRules wrong_rank;
  wrong_rank.declare_axes("w", {"embed", "mlp"});
  testing::expect_error<Error>(
      [&] {
        route(std::vector<NamedParameter>{{"w", t({4, 64, 16}), ""}}, wrong_rank);
      },
      {"parameter 'w' has shape [4, 64, 16] but 2 declared axes (embed, mlp)"});
}

TEST(Routing, SplitHeadsSplitsADeclaredRowsSideIntoItsHeads) {
  auto t = [](std::vector<int64_t> shape) { return at::zeros(shape).requires_grad_(true); };
  const std::vector<NamedParameter> params = {
      {"q_proj", t({4, 16, 64}), ""},     // (heads, head_dim, embed): torch's (out, in)
      {"kv_proj", t({2, 2, 8, 64}), ""},  // (kv, heads, head_dim, embed)
      {"o_proj", t({64, 4, 16}), ""},     // (embed, heads, head_dim): heads on the columns
      {"fused", t({64, 64}), ""},         // (mlp, embed): no head axes
  };
  RoutingRules rules;
  rules.declare_axes("q_proj", {"heads", "head_dim", "embed"});
  rules.declare_axes("kv_proj", {"kv", "heads", "head_dim", "embed"});
  rules.declare_axes("o_proj", {"embed", "heads", "head_dim"});
  rules.declare_axes("fused", {"mlp", "embed"});
  EXPECT_FALSE(route(params, rules)[0].num_heads);  // off by default: the rows stay one matrix
  rules.split_heads = true;
  const auto routes = route(params, rules);
  const auto named = by_name(routes);
  EXPECT_EQ(named.at("q_proj")->num_heads, 4);
  EXPECT_EQ(named.at("q_proj")->view, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(named.at("q_proj")->reason,
            "declared axes (heads, head_dim, embed): matrix (heads, head_dim) x (embed), 4 heads "
            "orthogonalized alone");
  EXPECT_EQ(named.at("kv_proj")->num_heads, 4);  // 2 × 2 blocks of head_dim rows
  EXPECT_FALSE(named.at("o_proj")->num_heads);
  EXPECT_FALSE(named.at("fused")->num_heads);
  // A Muon override keeps the split of the declared axes.
  rules.muon_patterns = {"q_proj"};
  EXPECT_EQ(route(params, rules)[0].num_heads, 4);
}

TEST(Routing, AHybridThatGivesMuonNothingSaysSo) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3));
  ::testing::internal::CaptureStderr();
  HybridOptimizer cnn(route(*conv), HybridOptions{});
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "muon: warning: no parameter is routed to Muon; every trainable one goes to adamw "
            "(weight [8, 3, 3, 3] and any other tensor of rank > 2 under routing higher_rank "
            "'adamw'; higher_rank 'flatten' trains each as an (out, rest) matrix). report_text() "
            "gives each parameter's reason.\n");
  // Nothing said when Muon gets a matrix, or when AdamW for everything was asked for.
  RoutingRules flatten;
  flatten.higher_rank = HigherRankPolicy::flatten;
  HybridOptions all_adamw;
  all_adamw.matrices = AlgorithmOptions();
  ::testing::internal::CaptureStderr();
  HybridOptimizer flattened(route(*conv, flatten), HybridOptions{});
  HybridOptimizer asked(route(*conv), all_adamw);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(Routing, ModulesReportTheirTypeNames) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
  const auto params = named_parameters_of(*conv);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].name, "weight");
  EXPECT_EQ(params[0].module_type, "torch::nn::Conv2dImpl");
}

TEST(Routing, ReportListsEveryParameterAligned) {
  cli::Gpt model(small_gpt(1, true));
  const auto report = format_routing_report(route(*model));
  EXPECT_NE(report.find("blocks.0.attn.q_proj.weight"), std::string::npos);
  EXPECT_NE(report.find("[32, 32]"), std::string::npos);
  EXPECT_NE(report.find("matrices: 7 tensors"), std::string::npos);
  EXPECT_NE(report.find("others: 4 tensors"), std::string::npos);
  // The role column starts at the same offset on every row.
  std::istringstream lines(report);
  std::string header;
  std::getline(lines, header);
  const auto column = header.find("role");
  std::string line;
  std::getline(lines, line);
  EXPECT_TRUE(line.compare(column, 6, "others") == 0 || line.compare(column, 8, "matrices") == 0)
      << line;
}

}  // namespace
}  // namespace muon
