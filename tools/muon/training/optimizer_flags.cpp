// The flags of `muon train` that set the optimizer's fields: --optimizer, --others, --state-dtype,
// --muon-lr and --adamw-lr (run_flags.h).
#include <string>
#include <vector>

#include "muon/dtypes.h"
#include "muon/algorithms.h"
#include "muon/config.h"
#include "muon/error.h"
#include "muon/internal/number_text.h"
#include "training/run_flags.h"

namespace muon::cli {

namespace {

// The run's state storage: the matrices' (Dion's is float32), or under adamw the others'.
at::ScalarType state_dtype_of(const HybridOptions& h) {
  const auto& options = h.matrices ? *h.matrices : *h.others;
  return get_option<at::ScalarType>(options, "state_dtype").value_or(at::kFloat);
}

// --optimizer: a name of optimizer_names(); one whose matrices run another algorithm (dion) starts
// from that algorithm's preset at the run's rates and storage.
RunFlag optimizer_flag(CLI::App& train, std::string& optimizer) {
  std::string names_doc;
  std::vector<std::string> names;
  for (const auto& n : optimizer_names()) {
    names_doc += (names_doc.empty() ? "" : "; ") + std::string(n.name) + ": " + n.doc;
    names.emplace_back(n.name);
  }
  auto* option = train.add_option("--optimizer", optimizer, names_doc)
                     ->check(CLI::IsMember(names))
                     ->capture_default_str();
  return {
      "--optimizer",
      "optimizer.name",
      false,
      option,
      [&optimizer](TrainConfig& c) {
        auto& h = c.optimizer.hybrid;
        const std::string others = algorithm_name(*h.others);
        check(optimizer != "adamw" || others == "adamw",
              "train: --optimizer adamw trains every parameter with AdamW, but the "
              "configuration's others is ",
              others, "; choose --optimizer muon or dion, or remove others from the configuration");
        // The matrices' rates and storage so far (under adamw the others' own: AdamW's).
        const auto& was = h.matrices ? *h.matrices : *h.others;
        const std::string before = algorithm_name(was);
        const auto run = group_settings(was);
        const auto dtype = get_option<at::ScalarType>(was, "state_dtype");
        apply_optimizer_name(optimizer, h);
        if (h.matrices && algorithm_name(*h.matrices) != before) {  // the run's rates, storage
          auto settings = group_settings(*h.matrices);
          settings["lr"] = run.at("lr");
          settings["weight_decay"] = run.at("weight_decay");
          set_group_settings(*h.matrices, settings);
          check(!dtype || set_option(*h.matrices, "state_dtype", *dtype) || *dtype == at::kFloat,
                "train: --optimizer ", optimizer,
                " keeps its momentum in float32; drop "
                "--state-dtype ", state_dtype_name(*dtype), " (or the configuration's state_dtype)");
        }
        c.optimizer.name = optimizer;
      },
      [](const TrainConfig& c) { return c.optimizer.name; }};
}

// --others: the partition's other half (docs/config.md, "The partition") on another elementwise
// algorithm, from its own defaults at the run's state dtype; --adamw-lr (applied after it) sets
// its rate.
RunFlag others_flag(CLI::App& train, std::string& others) {
  std::vector<std::string> names;
  for_each_algorithm([&](auto* tag) {
    using Entry = Algorithm<std::remove_pointer_t<decltype(tag)>>;
    if (Entry::kind == ParamKind::any) names.emplace_back(Entry::name);
  });
  auto* option = train
                     .add_option("--others", others,
                                 "the algorithm of every parameter Muon does not take: " +
                                     algorithm_names_text(ParamKind::any) +
                                     " (its own defaults; --adamw-lr sets its rate)")
                     ->check(CLI::IsMember(names))
                     ->capture_default_str();
  return {
      "--others",
      "optimizer.others",
      false,
      option,
      [&others](TrainConfig& c) {
        auto& h = c.optimizer.hybrid;
        check(static_cast<bool>(h.matrices),
              "train: --others would do nothing: optimizer adamw trains every "
              "parameter with AdamW; choose --optimizer muon or dion");
        if (algorithm_name(*h.others) == others) return;  // keeps its settings
        const auto dtype = state_dtype_of(h);
        h.others = AlgorithmOptions(default_options_of(others));
        set_option(*h.others, "state_dtype", dtype);
      },
      [](const TrainConfig& c) { return std::string(algorithm_name(*c.optimizer.hybrid.others)); }};
}

}  // namespace

std::vector<RunFlag> optimizer_flags(CLI::App& train, ParsedFlags& values) {
  std::vector<RunFlag> flags;
  auto& state_dtype = values.state_dtype;
  auto& muon_lr = values.muon_lr;
  auto& adamw_lr = values.adamw_lr;
  flags.push_back(optimizer_flag(train, values.optimizer));
  flags.push_back(others_flag(train, values.others));
  auto* dtype = train
                    .add_option("--state-dtype", state_dtype,
                                "optimizer state storage: float32, bfloat16 (stochastic "
                                "rounding) or int8 (8-bit blocks); a resumed run may switch, "
                                "its state converted once")
                    ->check(CLI::IsMember({"float32", "bfloat16", "int8"}))
                    ->capture_default_str();
  flags.push_back({"--state-dtype", "optimizer.muon.state_dtype", true, dtype,
                   [&state_dtype](TrainConfig& c) {
                     const auto t = *state_dtype_named(state_dtype);
                     auto& h = c.optimizer.hybrid;
                     check(!h.matrices || set_option(*h.matrices, "state_dtype", t) ||
                               t == at::kFloat,
                           "train: ", h.matrices ? algorithm_name(*h.matrices) : "",
                           " keeps its momentum in float32; --state-dtype ", state_dtype,
                           " stores the other tensors' state only with --optimizer muon or "
                           "adamw");
                     set_option(*h.others, "state_dtype", t);
                   },
                   [](const TrainConfig& c) {
                     return state_dtype_name(state_dtype_of(c.optimizer.hybrid));
                   }});
  auto* mlr = train.add_option("--muon-lr", muon_lr, "peak learning rate of the Muon matrices")
                  ->check(positive_number())
                  ->capture_default_str();
  flags.push_back({"--muon-lr", "optimizer.muon.lr", false, mlr,
                   [&muon_lr](TrainConfig& c) {
                     check(static_cast<bool>(c.optimizer.hybrid.matrices),
                           "train: --muon-lr would do nothing: optimizer adamw trains every "
                           "parameter with AdamW, at --adamw-lr");
                     c.optimizer.hybrid.matrices->set_lr(muon_lr);
                   },
                   [](const TrainConfig& c) {
                     const auto& h = c.optimizer.hybrid;  // under adamw: the others' lr
                     return detail::shortest_text((h.matrices ? *h.matrices : *h.others).get_lr());
                   }});
  auto* alr = train
                  .add_option("--adamw-lr", adamw_lr,
                              "peak learning rate of the other tensors (AdamW's, or the "
                              "algorithm optimizer.others names)")
                  ->check(positive_number())
                  ->capture_default_str();
  flags.push_back({"--adamw-lr", "optimizer.adamw.lr", false, alr,
                   [&adamw_lr](TrainConfig& c) { c.optimizer.hybrid.others->set_lr(adamw_lr); },
                   [](const TrainConfig& c) {
                     return detail::shortest_text(c.optimizer.hybrid.others->get_lr());
                   }});
  return flags;
}

}  // namespace muon::cli
