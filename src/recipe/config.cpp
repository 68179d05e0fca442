#include "muon/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "muon/error.h"
#include "yaml_section.h"

namespace muon {
namespace {

using detail::kind_of;
using detail::Section;

void require(bool ok, const std::string& path, const std::string& rule, double value) {
  check(ok, path, " must be ", rule, ", got ", value);
}

template <class T>
T one_of(const std::string& path, const std::string& value,
         const std::function<T(const std::string&)>& parse) {
  try {
    return parse(value);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

Betas read_betas(const YAML::Node& n, const std::string& path) {
  check(n.IsSequence() && n.size() == 2, path, ": expected [beta1, beta2], got ", kind_of(n));
  const double b1 = Section::as_number(n[0], path + "[0]");
  const double b2 = Section::as_number(n[1], path + "[1]");
  require(b1 >= 0 && b1 < 1, path + "[0]", "in [0, 1)", b1);
  require(b2 >= 0 && b2 < 1, path + "[1]", "in [0, 1)", b2);
  return {b1, b2};
}

CoefficientTable read_table(const YAML::Node& n, const std::string& path) {
  if (n.IsScalar()) {
    return one_of<CoefficientTable>(path, n.Scalar(), CoefficientTable::by_name);
  }
  check(n.IsSequence() && n.size() > 0, path,
        ": expected quintic, polar_express, dion or a list of [a, b, c] rows, got ", kind_of(n));
  std::vector<Coefficients> rows;
  for (size_t i = 0; i < n.size(); ++i) {
    const auto row_path = path + "[" + std::to_string(i) + "]";
    check(n[i].IsSequence() && n[i].size() == 3, row_path, ": expected [a, b, c], got ",
          kind_of(n[i]));
    rows.push_back({Section::as_number(n[i][0], row_path + "[0]"),
                    Section::as_number(n[i][1], row_path + "[1]"),
                    Section::as_number(n[i][2], row_path + "[2]")});
  }
  return CoefficientTable::custom(std::move(rows));
}

LrSchedule read_schedule(Section s) {
  LrSchedule out;
  const auto name = s.text("name");
  check(name.has_value(), s.key_path("name"),
        ": a schedule needs a name (constant, cosine, power, linear, warmdown, one_cycle, "
        "exponential)");
  out.kind = one_of<ScheduleKind>(s.key_path("name"), *name, schedule_kind_from_string);
  const auto non_negative = [&](const char* key, int64_t& field) {
    if (const auto v = s.integer(key)) {
      require(*v >= 0, s.key_path(key), ">= 0", static_cast<double>(*v));
      field = *v;
    }
  };
  non_negative("warmup_steps", out.warmup_steps);
  if (const auto v = s.integer("decay_steps")) out.decay_steps = *v;
  if (const auto v = s.number("init_value")) out.init_value = *v;
  if (const auto v = s.number("end_value")) out.end_value = *v;
  if (const auto v = s.number("exponent")) out.exponent = *v;
  if (const auto v = s.integer("decay_start")) out.decay_start = *v;
  if (const auto v = s.number("a")) out.power_a = *v;
  if (const auto v = s.number("b")) out.power_b = *v;
  if (const auto v = s.number("c")) out.power_c = *v;
  if (const auto tail = s.find("tail"); tail && !tail.IsNull()) {
    check(out.kind == ScheduleKind::power, s.key_path("tail"),
          ": only the power schedule has a tail");
    Section t(tail, s.key_path("tail"));
    if (const auto v = t.integer("start")) out.tail_start = *v;
    if (const auto v = t.integer("steps")) out.tail_steps = *v;
    if (const auto v = t.number("end")) out.end_value = *v;
    check(out.tail_start.has_value(), t.key_path("start"), ": a tail needs its start step");
    t.finish();
  }
  if (const auto v = s.number("warmdown_ratio")) out.warmdown_ratio = *v;
  if (const auto v = s.number("final_lr_frac")) out.final_lr_frac = *v;
  if (const auto v = s.text("shape")) {
    check(*v == "linear" || *v == "cosine", s.key_path("shape"),
          ": expected linear or cosine, got '", *v, "'");
    out.cosine_shape = *v == "cosine";
  }
  if (const auto v = s.number("pct_start")) out.pct_start = *v;
  if (const auto v = s.number("div_factor")) out.div_factor = *v;
  if (const auto v = s.number("final_div_factor")) out.final_div_factor = *v;
  if (const auto v = s.number("decay_rate")) out.decay_rate = *v;
  if (const auto v = s.integer("transition_steps")) out.transition_steps = *v;
  s.finish();
  return out;
}

ParamGroupSpec read_group(Section s) {
  ParamGroupSpec g;
  const auto name = s.text("name");
  check(name.has_value(), s.key_path("name"), ": a parameter group needs a name");
  g.name = *name;
  const auto patterns = s.strings("patterns");
  check(patterns.has_value(), s.key_path("patterns"),
        ": a parameter group needs patterns, e.g. [\"*\"]");
  g.patterns = *patterns;
  if (const auto v = s.number("lr_multiplier")) {
    require(*v > 0, s.key_path("lr_multiplier"), "> 0", *v);
    g.lr_multiplier = *v;
  }
  if (const auto v = s.number("lr")) {
    require(*v > 0, s.key_path("lr"), "> 0", *v);
    g.lr = *v;
  }
  if (const auto v = s.number("weight_decay")) {
    require(*v >= 0, s.key_path("weight_decay"), ">= 0", *v);
    g.weight_decay = *v;
  }
  if (const auto n = s.find("betas"); n && !n.IsNull())
    g.betas = read_betas(n, s.key_path("betas"));
  if (const auto v = s.number("eps")) {
    require(*v > 0, s.key_path("eps"), "> 0", *v);
    g.eps = *v;
  }
  if (const auto v = s.number("momentum")) {
    require(*v >= 0 && *v < 1, s.key_path("momentum"), "in [0, 1)", *v);
    g.momentum = *v;
  }
  if (const auto n = s.find("schedule"); n && !n.IsNull()) {
    g.schedule = read_schedule(Section(n, s.key_path("schedule")));
  }
  s.finish();
  return g;
}

// Reads the `optimizer` mapping into `config`.
void read_optimizer(Section s, OptimConfig& config, const std::optional<bool>& root_muon_plus,
                    const std::optional<bool>& root_cautious) {
  if (const auto name = s.text("name")) config.name = *name;
  check(config.name == "muon" || config.name == "muonclip" || config.name == "adamw",
        s.key_path("name"), ": unknown optimizer '", config.name,
        "'; valid optimizers are muon, muonclip, adamw");
  const bool muon_family = config.name != "adamw";
  auto& h = config.hybrid;
  h.all_adamw = !muon_family;

  // Rates and decay.
  const double lr = s.number("lr").value_or(muon_family ? 0.02 : 1e-3);
  require(lr > 0, s.key_path("lr"), "> 0", lr);
  const double adamw_lr = s.number("adamw_lr").value_or(muon_family ? 1e-3 : lr);
  require(adamw_lr > 0, s.key_path("adamw_lr"), "> 0", adamw_lr);
  const double wd = s.number("weight_decay").value_or(0.0);
  require(wd >= 0, s.key_path("weight_decay"), ">= 0", wd);
  h.muon.lr(lr).weight_decay(wd);
  h.adamw.lr(adamw_lr).weight_decay(wd);
  if (const auto n = s.find("betas"); n && !n.IsNull()) {
    h.adamw.betas(read_betas(n, s.key_path("betas")));
  }
  if (const auto v = s.number("eps")) {
    require(*v > 0, s.key_path("eps"), "> 0", *v);
    h.adamw.eps(*v);
  }

  // Muon.
  if (const auto v = s.number("momentum", {"muon_momentum"})) {
    require(*v >= 0 && *v < 1, s.key_path("momentum"), "in [0, 1)", *v);
    h.muon.momentum(*v);
  }
  if (const auto v = s.boolean("nesterov")) h.muon.nesterov(*v);
  if (const auto v = s.text("momentum_form")) {
    h.muon.momentum_form(
        one_of<MomentumForm>(s.key_path("momentum_form"), *v, momentum_form_from_string));
  }
  if (const auto v = s.number("ns_steps", {"muon_ns_steps"})) {
    require(*v >= 1 && std::floor(*v) == *v, s.key_path("ns_steps"), "a whole number >= 1", *v);
    // Newton–Schulz converges in about 5 iterations; thousands would only stall the run.
    require(*v <= 1000, s.key_path("ns_steps"), "<= 1000", *v);
    h.muon.ns_steps(static_cast<int64_t>(*v));
  }
  if (const auto n = s.find("ns_coefficients"); n && !n.IsNull()) {
    h.muon.coefficients(read_table(n, s.key_path("ns_coefficients")));
  }
  if (const auto v = s.text("ns_dtype")) {  // null: per device (float32 on CPU, bf16 elsewhere)
    check(*v == "float32" || *v == "bfloat16" || *v == "float64", s.key_path("ns_dtype"),
          ": expected float32, bfloat16 or float64 (or null: per device), got '", *v, "'");
    h.muon.ns_dtype(*v == "bfloat16" ? at::kBFloat16 : *v == "float64" ? at::kDouble : at::kFloat);
  }
  if (const auto v = s.text("ns_method")) {
    h.muon.ns_method(one_of<NsMethod>(s.key_path("ns_method"), *v, ns_method_from_string));
  }
  if (const auto v = s.text("adjust_lr")) {
    h.muon.adjust_lr(one_of<AdjustLr>(s.key_path("adjust_lr"), *v, adjust_lr_from_string));
  }
  // muon_plus: true/false or {mode, eps}; the root-level scalar form must agree.
  const auto plus = s.find("muon_plus");
  std::optional<bool> plus_on;
  if (plus && plus.IsMap()) {
    Section p(plus, s.key_path("muon_plus"));
    h.muon.post_norm(PostNorm::row_col);
    if (const auto mode = p.text("mode")) {
      h.muon.post_norm(one_of<PostNorm>(p.key_path("mode"), *mode, post_norm_from_string));
    }
    if (const auto eps = p.number("eps")) h.muon.post_norm_eps(*eps);
    p.finish();
    plus_on = h.muon.post_norm() != PostNorm::none;
  } else if (plus && !plus.IsNull()) {
    plus_on = Section::as_bool(plus, s.key_path("muon_plus"));
    if (*plus_on) h.muon.post_norm(PostNorm::row_col);
  }
  if (const auto eps = s.number("muon_norm_eps")) h.muon.post_norm_eps(*eps);
  require(h.muon.post_norm_eps() > 0, s.key_path("muon_norm_eps"), "> 0", h.muon.post_norm_eps());
  if (root_muon_plus) {
    check(!plus_on || *plus_on == *root_muon_plus, "muon_plus: the root value ",
          *root_muon_plus ? "true" : "false", " conflicts with optimizer.muon_plus ",
          plus_on.value_or(false) ? "true" : "false", "; set it in one place");
    if (*root_muon_plus && !plus_on) h.muon.post_norm(PostNorm::row_col);
    plus_on = *root_muon_plus;
  }
  check(!plus_on.value_or(false) || muon_family, s.key_path("muon_plus"),
        ": Muon+ needs name muon or muonclip, not '", config.name, "'");
  if (const auto n = s.find("normuon"); n && !n.IsNull()) {
    if (n.IsMap()) {
      Section nm(n, s.key_path("normuon"));
      NorMuonOptions o;
      if (const auto b = nm.number("beta2")) {
        require(*b >= 0 && *b < 1, nm.key_path("beta2"), "in [0, 1)", *b);
        o.beta2 = *b;
      }
      if (const auto a = nm.text("axis")) {
        o.axis = one_of<NorMuonAxis>(nm.key_path("axis"), *a, normuon_axis_from_string);
      }
      nm.finish();
      h.muon.normuon(o);
    } else if (Section::as_bool(n, s.key_path("normuon"))) {
      h.muon.normuon(NorMuonOptions{});
    }
  }
  if (const auto v = s.boolean("cautious_weight_decay")) h.muon.cautious_weight_decay(*v);

  // Cautious masking, nested or at the root (they must agree).
  std::optional<bool> cautious = s.boolean("cautious");
  if (root_cautious) {
    check(!cautious || *cautious == *root_cautious, "cautious: the root value ",
          *root_cautious ? "true" : "false", " conflicts with optimizer.cautious ",
          cautious.value_or(false) ? "true" : "false", "; set it in one place");
    cautious = root_cautious;
  }
  config.cautious = cautious.value_or(false);
  h.muon.cautious(config.cautious);
  h.adamw.cautious(config.cautious);

  if (const auto v = s.text("state_dtype")) {
    check(*v == "float32" || *v == "bfloat16", s.key_path("state_dtype"),
          ": expected float32 or bfloat16, got '", *v, "'");
    const auto dtype = *v == "bfloat16" ? at::kBFloat16 : at::kFloat;
    h.muon.state_dtype(dtype);
    h.adamw.state_dtype(dtype);
  }
  // fused: null (per device), true (fused CPU kernels) or false (the device-generic ATen form).
  if (const auto n = s.find("fused"); n && !n.IsNull()) {
    const bool fused = Section::as_bool(n, s.key_path("fused"));
    h.muon.fused(fused);
    h.adamw.fused(fused);
  }
  if (const auto v = s.number("grad_clip")) {
    require(*v > 0, s.key_path("grad_clip"), "> 0 (or null to turn clipping off)", *v);
    h.max_grad_norm = *v;
  }
  if (const auto v = s.text("nonfinite")) {
    check(*v == "skip" || *v == "error", s.key_path("nonfinite"), ": expected skip or error, got '",
          *v, "'");
    h.nonfinite = *v == "skip" ? NonfinitePolicy::skip : NonfinitePolicy::error;
  }
  const auto qk = s.find("qk_clip");
  if (qk && !qk.IsNull()) {
    Section q(qk, s.key_path("qk_clip"));
    const double tau = q.number("tau").value_or(100.0);
    require(tau > 0, q.key_path("tau"), "> 0", tau);
    q.finish();
    check(muon_family, s.key_path("qk_clip"), ": QK-clip needs name muon or muonclip");
    h.qk_clip_tau = tau;
  } else if (config.name == "muonclip") {
    h.qk_clip_tau = 100.0;
  }

  // Schedules.
  if (const auto n = s.find("schedule"); n && !n.IsNull()) {
    h.schedule = read_schedule(Section(n, s.key_path("schedule")));
  }
  if (const auto n = s.find("momentum_schedule"); n && !n.IsNull()) {
    Section m(n, s.key_path("momentum_schedule"));
    MomentumSchedule ms;
    if (const auto v = m.number("start")) ms.start = *v;
    if (const auto v = m.number("target")) ms.target = *v;
    if (const auto v = m.integer("steps")) ms.steps = *v;
    if (const auto v = m.boolean("cool_down")) ms.cool_down = *v;
    if (const auto v = m.number("warmdown_ratio")) ms.warmdown_ratio = *v;
    m.finish();
    try {
      ms.check();
    } catch (const Error& e) {
      throw Error(m.path() + ": " + e.what());
    }
    h.momentum_schedule = ms;
  }
  if (const auto v = s.text("weight_decay_schedule")) {
    check(*v == "constant" || *v == "cosine", s.key_path("weight_decay_schedule"),
          ": expected constant or cosine, got '", *v, "'");
    h.weight_decay_schedule = WeightDecaySchedule{*v == "cosine"};
  }

  // Groups: a preset or an explicit list.
  const auto preset = s.find("preset");
  const auto groups = s.find("param_groups");
  check(!(preset && !preset.IsNull() && groups && !groups.IsNull()), s.key_path("preset"),
        ": give either a preset or param_groups, not both");
  if (groups && !groups.IsNull()) {
    check(groups.IsSequence(), s.key_path("param_groups"), ": expected a list, got ",
          kind_of(groups));
    for (size_t i = 0; i < groups.size(); ++i) {
      h.groups.push_back(read_group(
          Section(groups[i], s.key_path("param_groups") + "[" + std::to_string(i) + "]")));
    }
    try {
      check_groups(h.groups);
    } catch (const Error& e) {
      throw Error(s.key_path("param_groups") + ": " + e.what());
    }
  }
  if (preset && !preset.IsNull()) {
    Section p(preset, s.key_path("preset"));
    config.preset = p.text("name").value_or("");
    if (config.preset == "mup") {
      const double width = p.number("width_multiplier").value_or(1.0);
      require(width > 0, p.key_path("width_multiplier"), "> 0", width);
      h.groups = mup_groups(width);
    } else if (config.preset == "nanochat") {
      NanochatSettings n;
      if (const auto v = p.integer("d_model")) n.d_model = *v;
      for (auto [key, field] : {std::pair{"embedding_lr", &n.embedding_lr},
                                {"unembedding_lr", &n.unembedding_lr},
                                {"matrix_lr", &n.matrix_lr},
                                {"scalar_lr", &n.scalar_lr}}) {
        if (const auto v = p.number(key)) {
          require(*v > 0, p.key_path(key), "> 0", *v);
          *field = *v;
        }
      }
      if (const auto v = p.number("weight_decay")) {
        require(*v >= 0, p.key_path("weight_decay"), ">= 0", *v);
        n.weight_decay = *v;
      }
      require(n.d_model > 0, p.key_path("d_model"), "> 0", static_cast<double>(n.d_model));
      const auto built = nanochat_preset(n);
      h.groups = built.groups;
      // The recipe's algorithm settings; storage, clipping and the rest stay as configured.
      h.muon.lr(built.muon.lr())
          .momentum(built.muon.momentum())
          .coefficients(built.muon.coefficients())
          .normuon(built.muon.normuon())
          .cautious_weight_decay(built.muon.cautious_weight_decay())
          .weight_decay(built.muon.weight_decay());
      h.adamw.lr(built.adamw.lr()).eps(built.adamw.eps());
    } else {
      throw Error(p.key_path("name") + ": unknown preset '" + config.preset +
                  "'; valid presets are mup, nanochat");
    }
    p.finish();
  }

  // Routing overrides.
  if (const auto n = s.find("routing"); n && !n.IsNull()) {
    Section r(n, s.key_path("routing"));
    if (const auto v = r.strings("muon")) config.routing.muon_patterns = *v;
    if (const auto v = r.strings("adamw")) config.routing.adamw_patterns = *v;
    if (const auto v = r.text("higher_rank")) {
      config.routing.higher_rank =
          one_of<HigherRankPolicy>(r.key_path("higher_rank"), *v, higher_rank_policy_from_string);
    }
    r.finish();
  }

  // Scaling rules, applied to the base rates and decay.
  if (const auto n = s.find("scaling"); n && !n.IsNull()) {
    Section sc(n, s.key_path("scaling"));
    ScalingRules rules;
    if (const auto v = sc.number("batch_tokens")) rules.batch_tokens = *v;
    if (const auto v = sc.integer("d_model")) rules.d_model = *v;
    if (const auto v = sc.number("training_tokens")) rules.training_tokens = *v;
    if (const auto v = sc.number("reference_tokens")) rules.reference_tokens = *v;
    sc.finish();
    require(rules.batch_tokens > 0, sc.key_path("batch_tokens"), "> 0", rules.batch_tokens);
    require(rules.d_model > 0, sc.key_path("d_model"), "> 0", static_cast<double>(rules.d_model));
    h.muon.lr(h.muon.lr() * rules.lr_multiplier());
    h.adamw.lr(h.adamw.lr() * rules.adamw_lr_multiplier());
    h.muon.weight_decay(h.muon.weight_decay() * rules.weight_decay_multiplier());
    h.adamw.weight_decay(h.adamw.weight_decay() * rules.weight_decay_multiplier());
    std::ostringstream note;
    note << "scaling: Muon lr x " << rules.lr_multiplier() << " (sqrt(B/2^19)), AdamW lr x "
         << rules.adamw_lr_multiplier() << " (also (d_model/768)^-0.5), weight decay x "
         << rules.weight_decay_multiplier() << " -> lr " << h.muon.lr() << ", adamw_lr "
         << h.adamw.lr() << ", weight_decay " << h.muon.weight_decay();
    config.notes.push_back(note.str());
  }
  s.finish();
  check_options(h.muon);
}

// ---- writing the resolved config back ----

void emit_schedule(YAML::Emitter& out, const LrSchedule& s) {
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << to_string(s.kind);
  out << YAML::Key << "warmup_steps" << YAML::Value << s.warmup_steps;
  switch (s.kind) {
    case ScheduleKind::cosine:
      if (s.decay_steps) out << YAML::Key << "decay_steps" << YAML::Value << *s.decay_steps;
      out << YAML::Key << "init_value" << YAML::Value << s.init_value << YAML::Key << "end_value"
          << YAML::Value << s.end_value << YAML::Key << "exponent" << YAML::Value << s.exponent;
      break;
    case ScheduleKind::linear:
      if (s.decay_start) out << YAML::Key << "decay_start" << YAML::Value << *s.decay_start;
      if (s.decay_steps) out << YAML::Key << "decay_steps" << YAML::Value << *s.decay_steps;
      out << YAML::Key << "end_value" << YAML::Value << s.end_value;
      break;
    case ScheduleKind::power:
      out << YAML::Key << "a" << YAML::Value << s.power_a << YAML::Key << "b" << YAML::Value
          << s.power_b << YAML::Key << "c" << YAML::Value << s.power_c;
      if (s.tail_start) {
        out << YAML::Key << "tail" << YAML::Value << YAML::BeginMap << YAML::Key << "start"
            << YAML::Value << *s.tail_start;
        if (s.tail_steps) out << YAML::Key << "steps" << YAML::Value << *s.tail_steps;
        out << YAML::Key << "end" << YAML::Value << s.end_value << YAML::EndMap;
      }
      break;
    case ScheduleKind::warmdown:
      out << YAML::Key << "warmdown_ratio" << YAML::Value << s.warmdown_ratio << YAML::Key
          << "final_lr_frac" << YAML::Value << s.final_lr_frac << YAML::Key << "shape"
          << YAML::Value << (s.cosine_shape ? "cosine" : "linear");
      break;
    case ScheduleKind::one_cycle:
      out << YAML::Key << "pct_start" << YAML::Value << s.pct_start << YAML::Key << "div_factor"
          << YAML::Value << s.div_factor << YAML::Key << "final_div_factor" << YAML::Value
          << s.final_div_factor;
      break;
    case ScheduleKind::exponential:
      out << YAML::Key << "decay_rate" << YAML::Value << s.decay_rate << YAML::Key
          << "transition_steps" << YAML::Value << s.transition_steps;
      break;
    case ScheduleKind::constant:
      break;
  }
  out << YAML::EndMap;
}

OptimConfig read_config(const YAML::Node& root);

}  // namespace

OptimConfig OptimConfig::from_yaml(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error("config: invalid YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  try {
    return read_config(root);
  } catch (const YAML::Exception& e) {  // a node of a shape no reader above expected
    throw Error("config: unexpected YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

namespace {

OptimConfig read_config(const YAML::Node& root) {
  Section top(root, "");
  OptimConfig config;
  const auto root_muon_plus = top.boolean("muon_plus");
  const auto root_cautious = top.boolean("cautious");
  const auto optimizer = top.find("optimizer");
  if (optimizer && optimizer.IsScalar()) {  // the scalar form: `optimizer: muon`
    YAML::Node mapping(YAML::NodeType::Map);
    mapping["name"] = optimizer.Scalar();
    read_optimizer(Section(mapping, "optimizer"), config, root_muon_plus, root_cautious);
  } else if (optimizer && !optimizer.IsNull()) {
    read_optimizer(Section(optimizer, "optimizer"), config, root_muon_plus, root_cautious);
  } else {
    read_optimizer(Section(YAML::Node(YAML::NodeType::Map), "optimizer"), config, root_muon_plus,
                   root_cautious);
  }
  top.finish();
  return config;
}

}  // namespace

OptimConfig OptimConfig::from_yaml_file(const std::string& path) {
  std::ifstream file(path);
  check(file.good(), "config: cannot read '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  try {
    return from_yaml(text.str());
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

std::string OptimConfig::to_yaml() const {
  const auto& h = hybrid;
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << name;
  out << YAML::Key << "lr" << YAML::Value << (name == "adamw" ? h.adamw.lr() : h.muon.lr());
  if (name != "adamw") out << YAML::Key << "adamw_lr" << YAML::Value << h.adamw.lr();
  out << YAML::Key << "weight_decay" << YAML::Value << h.adamw.weight_decay();
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << std::get<0>(h.adamw.betas()) << std::get<1>(h.adamw.betas()) << YAML::EndSeq;
  out << YAML::Key << "eps" << YAML::Value << h.adamw.eps();
  out << YAML::Key << "momentum" << YAML::Value << h.muon.momentum();
  out << YAML::Key << "nesterov" << YAML::Value << h.muon.nesterov();
  out << YAML::Key << "momentum_form" << YAML::Value << to_string(h.muon.momentum_form());
  out << YAML::Key << "ns_steps" << YAML::Value << h.muon.ns_steps();
  out << YAML::Key << "ns_coefficients" << YAML::Value;
  if (h.muon.coefficients().name == "custom") {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& r : h.muon.coefficients().rows) {
      out << YAML::BeginSeq << r[0] << r[1] << r[2] << YAML::EndSeq;
    }
    out << YAML::EndSeq;
  } else {
    out << h.muon.coefficients().name;
  }
  out << YAML::Key << "ns_method" << YAML::Value << to_string(h.muon.ns_method());
  out << YAML::Key << "ns_dtype" << YAML::Value;
  if (const auto d = h.muon.ns_dtype()) {
    out << (*d == at::kBFloat16 ? "bfloat16" : *d == at::kDouble ? "float64" : "float32");
  } else {
    out << YAML::Null;
  }
  out << YAML::Key << "adjust_lr" << YAML::Value << to_string(h.muon.adjust_lr());
  out << YAML::Key << "muon_plus" << YAML::Value << YAML::BeginMap << YAML::Key << "mode"
      << YAML::Value << to_string(h.muon.post_norm()) << YAML::Key << "eps" << YAML::Value
      << h.muon.post_norm_eps() << YAML::EndMap;
  out << YAML::Key << "normuon" << YAML::Value;
  if (h.muon.normuon()) {
    out << YAML::BeginMap << YAML::Key << "beta2" << YAML::Value << h.muon.normuon()->beta2
        << YAML::Key << "axis" << YAML::Value << to_string(h.muon.normuon()->axis) << YAML::EndMap;
  } else {
    out << false;
  }
  out << YAML::Key << "cautious_weight_decay" << YAML::Value << h.muon.cautious_weight_decay();
  out << YAML::Key << "cautious" << YAML::Value << cautious;
  out << YAML::Key << "state_dtype" << YAML::Value
      << (h.adamw.state_dtype() == at::kBFloat16 ? "bfloat16" : "float32");
  out << YAML::Key << "fused" << YAML::Value;
  if (h.adamw.fused()) {
    out << *h.adamw.fused();
  } else {
    out << YAML::Null;
  }
  out << YAML::Key << "grad_clip" << YAML::Value;
  if (h.max_grad_norm) {
    out << *h.max_grad_norm;
  } else {
    out << YAML::Null;
  }
  out << YAML::Key << "nonfinite" << YAML::Value
      << (h.nonfinite == NonfinitePolicy::skip ? "skip" : "error");
  if (h.qk_clip_tau) {
    out << YAML::Key << "qk_clip" << YAML::Value << YAML::BeginMap << YAML::Key << "tau"
        << YAML::Value << *h.qk_clip_tau << YAML::EndMap;
  }
  if (h.schedule) {
    out << YAML::Key << "schedule" << YAML::Value;
    emit_schedule(out, *h.schedule);
  }
  if (h.momentum_schedule) {
    const auto& m = *h.momentum_schedule;
    out << YAML::Key << "momentum_schedule" << YAML::Value << YAML::BeginMap << YAML::Key << "start"
        << YAML::Value << m.start << YAML::Key << "target" << YAML::Value << m.target << YAML::Key
        << "steps" << YAML::Value << m.steps << YAML::Key << "cool_down" << YAML::Value
        << m.cool_down << YAML::Key << "warmdown_ratio" << YAML::Value << m.warmdown_ratio
        << YAML::EndMap;
  }
  if (h.weight_decay_schedule) {
    out << YAML::Key << "weight_decay_schedule" << YAML::Value
        << (h.weight_decay_schedule->cosine ? "cosine" : "constant");
  }
  if (!h.groups.empty()) {
    out << YAML::Key << "param_groups" << YAML::Value << YAML::BeginSeq;
    for (const auto& g : h.groups) {
      out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << g.name << YAML::Key
          << "patterns" << YAML::Value << YAML::Flow << g.patterns << YAML::Key << "lr_multiplier"
          << YAML::Value << g.lr_multiplier;
      if (g.lr) out << YAML::Key << "lr" << YAML::Value << *g.lr;
      if (g.weight_decay) out << YAML::Key << "weight_decay" << YAML::Value << *g.weight_decay;
      if (g.betas) {
        out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
            << std::get<0>(*g.betas) << std::get<1>(*g.betas) << YAML::EndSeq;
      }
      if (g.eps) out << YAML::Key << "eps" << YAML::Value << *g.eps;
      if (g.momentum) out << YAML::Key << "momentum" << YAML::Value << *g.momentum;
      if (g.schedule) {
        out << YAML::Key << "schedule" << YAML::Value;
        emit_schedule(out, *g.schedule);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  out << YAML::Key << "routing" << YAML::Value << YAML::BeginMap << YAML::Key << "muon"
      << YAML::Value << YAML::Flow << routing.muon_patterns << YAML::Key << "adamw" << YAML::Value
      << YAML::Flow << routing.adamw_patterns << YAML::Key << "higher_rank" << YAML::Value
      << to_string(routing.higher_rank) << YAML::EndMap;
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::unique_ptr<HybridOptimizer> build_optimizer(const OptimConfig& config,
                                                 const std::vector<NamedParameter>& parameters,
                                                 int64_t total_steps) {
  check(total_steps > 0, "build_optimizer: total_steps must be > 0, got ", total_steps);
  auto options = config.hybrid;
  options.total_steps = total_steps;
  return std::make_unique<HybridOptimizer>(route(parameters, config.routing), options);
}

std::unique_ptr<HybridOptimizer> build_optimizer(const OptimConfig& config,
                                                 const torch::nn::Module& model,
                                                 int64_t total_steps) {
  return build_optimizer(config, named_parameters_of(model), total_steps);
}

}  // namespace muon
