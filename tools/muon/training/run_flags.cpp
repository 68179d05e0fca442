#include "training/run_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <type_traits>
#include <utility>

#include "muon/algorithms.h"
#include "muon/error.h"
#include "muon/internal/yaml_section.h"

namespace muon::cli {

namespace {

// A field's value as its flag's text ("" for a type no flag sets).
template <class T>
std::string text_of(const T&) {
  return "";
}
std::string text_of(const std::string& v) {
  return v;
}
std::string text_of(int64_t v) {
  return std::to_string(v);
}
std::string text_of(bool v) {
  return v ? "true" : "false";
}

// A number's text as the user wrote it, quoted when it is not a number at all.
std::string shown(const std::string& text, bool numeric) {
  return numeric ? text : "'" + text + "'";
}

}  // namespace

CLI::Validator whole_number(int64_t least, int64_t most) {
  const bool to_max = most == kMaxWholeNumber;
  const std::string bound =
      to_max ? "a whole number >= " + std::to_string(least) + " (at most 2^53)"
             : "a whole number in [" + std::to_string(least) + ", " + std::to_string(most) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const long double v = std::strtold(text.c_str(), &end);
        const bool numeric = end != text.c_str() && *end == '\0';
        if (numeric && std::floor(v) == v && v >= static_cast<long double>(least) &&
            v <= static_cast<long double>(most)) {
          return "";
        }
        return "must be " + bound + ", got " + shown(text, numeric);
      },
      to_max ? "INT >= " + std::to_string(least)
             : "INT in [" + std::to_string(least) + ", " + std::to_string(most) + "]");
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool numeric = end != text.c_str() && *end == '\0';
        if (numeric && std::isfinite(v) && v > 0) return "";
        return "must be a finite number > 0, got " + shown(text, numeric);
      },
      "NUMBER > 0");
}

CLI::Validator number_in(double least, double most) {
  std::ostringstream range;
  range << "[" << least << ", " << most << "]";
  return CLI::Validator(
      [least, most, bound = range.str()](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool numeric = end != text.c_str() && *end == '\0';
        if (numeric && v >= least && v <= most) return "";
        return "must be a number in " + bound + ", got " + shown(text, numeric);
      },
      "NUMBER in " + range.str());
}

namespace {

// The flag of one field: the parsed value lands in `parsed`, apply() copies it into a run.
template <class T>
RunFlag field_flag(CLI::App& app, TrainConfig& parsed, const FieldFlag& flag,
                   const OptionInfo& info, T& value) {
  CLI::Option* option = nullptr;
  if constexpr (std::is_same_v<T, bool>) {
    option = app.add_flag(flag.name, value, info.doc);  // on when given, no value
  } else {
    option = app.add_option(flag.name, value, info.doc)->capture_default_str();
  }
  if constexpr (std::is_same_v<T, int64_t>) {
    // Whole numbers a double holds exactly; CLI11 alone would clamp 1e20 to 2^63 − 1 silently.
    option->check(whole_number(least_of(info)));
  }
  const auto apply = [&parsed, flag](TrainConfig& c) {
    with_field(c, flag, [&](const OptionInfo&, auto& to) {
      with_field(std::as_const(parsed), flag, [&](const OptionInfo&, const auto& from) {
        if constexpr (std::is_same_v<std::decay_t<decltype(to)>, std::decay_t<decltype(from)>>) {
          to = from;
        }
      });
    });
  };
  const auto text = [flag](const TrainConfig& c) {
    std::string out;
    with_field(c, flag, [&](const OptionInfo&, const auto& v) { out = text_of(v); });
    return out;
  };
  return {flag.name, std::string(flag.section) + "." + flag.key, flag.safe_on_resume, option, apply,
          text};
}

// "key.path" → value (flow YAML) of every leaf of `node`, into `out`.
void collect_leaves(const YAML::Node& node, const std::string& path,
                    std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& entry : node) {
      const auto key = entry.first.as<std::string>();
      collect_leaves(entry.second, path.empty() ? key : path + "." + key, out);
    }
    return;
  }
  YAML::Emitter text;
  text << YAML::Flow << node;
  out[path] = text.c_str();
}

std::map<std::string, std::string> leaves(const TrainConfig& config) {
  std::map<std::string, std::string> out;
  collect_leaves(YAML::Load(config.to_yaml()), "", out);
  return out;
}

// Throws unless `described` (what the command line says) is the run `stored` in `dir`, but for the
// keys a resumed run may change; the message names every key that differs, both values and the
// flag or file that set the described one.
void check_describes(const TrainConfig& stored, const TrainConfig& described,
                     const std::vector<RunFlag>& flags, const std::string& config_path,
                     const std::string& dir) {
  // A flag of the matrices' settings (optimizer.muon.*) sets the section of the algorithm they run.
  const auto& slot = described.optimizer.hybrid.matrices;
  const std::string matrices = slot ? algorithm_name(*slot) : "muon";
  const auto key_of = [&](const RunFlag& flag) {
    const std::string muon = "optimizer.muon.";
    return flag.key.rfind(muon, 0) == 0
               ? "optimizer." + matrices + "." + flag.key.substr(muon.size())
               : flag.key;
  };
  std::map<std::string, const RunFlag*> given;  // key → the flag given for it
  std::vector<std::string> may_change;
  for (const auto& flag : flags) {
    if (flag.safe_on_resume) may_change.push_back(key_of(flag));
    if (flag.option->count() > 0) given[key_of(flag)] = &flag;
  }
  const auto theirs = leaves(stored), ours = leaves(described);
  auto keys = ours;  // every key of either run: one may hold a section the other lacks
  keys.insert(theirs.begin(), theirs.end());
  const auto value_in = [](const auto& run, const std::string& key) {
    const auto it = run.find(key);
    return it == run.end() ? std::string("(absent)") : it->second;
  };
  std::string differences;
  for (const auto& [key, unused] : keys) {
    const auto stored_value = value_in(theirs, key), value = value_in(ours, key);
    if (stored_value == value || std::count(may_change.begin(), may_change.end(), key) > 0) {
      continue;
    }
    const auto flag = given.find(key);
    const auto source = flag != given.end()   ? flag->second->name
                        : config_path.empty() ? std::string("the flags given")
                                              : "--config " + config_path;
    differences += (differences.empty() ? "" : "; ") + key + ": " + stored_value + " in the run, " +
                   value + " from " + source;
  }
  check(differences.empty(), "train: the run in ", dir, " is not the one this command describes — ",
        differences,
        ". Drop or change what differs to continue it (--steps and the log, eval and checkpoint "
        "intervals may change), or start a new run with another --out");
}

// Applies the flags given to `run`; --batch-size counts per rank of this launch's `world`.
void apply_given(const std::vector<RunFlag>& flags, TrainConfig& run, int64_t world) {
  for (const auto& flag : flags) {
    if (flag.option->count() == 0) continue;
    flag.apply(run);
    if (flag.name == "--batch-size") run.ranks = world;
  }
}

// Resuming on another number of ranks keeps the run's global batch: a batch size that changes it
// is refused with the one that keeps it. `stored` as the run recorded it; `described` and `here`
// (the run) on this launch's ranks.
void check_same_batch(const TrainConfig& stored, const TrainConfig& described,
                      const TrainConfig& here, const std::vector<RunFlag>& flags,
                      const std::string& dir) {
  if (described.batch_size == here.batch_size) return;
  const bool flag_given = std::any_of(flags.begin(), flags.end(), [](const RunFlag& f) {
    return f.name == "--batch-size" && f.option->count() > 0;
  });
  const auto global = [](const TrainConfig& c) { return c.batch_size * c.ranks; };
  const std::string trains =
      stored.ranks == 0
          ? std::to_string(stored.batch_size) +
                " sequences a step per rank (it does not record its ranks: an earlier muon train "
                "wrote it)"
          : std::to_string(global(stored)) + " sequences a step (" +
                std::to_string(stored.batch_size) + " per rank × " + ranks_text(stored.ranks) + ")";
  throw Error("train: " + std::string(flag_given ? "--batch-size " : "a batch_size of ") +
              std::to_string(described.batch_size) + " on " + ranks_text(here.ranks) +
              " makes a global batch of " + std::to_string(global(described)) +
              ", but the run in " + dir + " trains " + trains + "; on " + ranks_text(here.ranks) +
              ", --batch-size " + std::to_string(here.batch_size) +
              " continues it (as does leaving it out)");
}

// The base rate at update `step` of a run of `steps` under `config`'s schedule.
double rate_at(const OptimConfig& config, int64_t step, int64_t steps) {
  const auto& h = config.hybrid;
  const double peak = (h.matrices ? *h.matrices : *h.others).get_lr();
  return h.schedule ? peak * h.schedule->multiplier(step, steps, peak) : peak;
}

}  // namespace

const std::vector<FieldFlag>& field_flags() {
  static const std::vector<FieldFlag> flags{
      {"--steps", "train", "steps", true},
      {"--seed", "train", "seed", false},
      {"--data", "data", "source", false},
      {"--batch-size", "train", "batch_size", false},
      {"--log-every", "train", "log_every", true},
      {"--eval-every", "train", "eval_every", true},
      {"--eval-batches", "train", "eval_batches", true},
      {"--checkpoint-every", "train", "checkpoint_every", true},
      {"--step-in-backward", "train", "step_in_backward", true},
      {"--layers", "model", "n_layers", false},
      {"--d-model", "model", "d_model", false},
      {"--heads", "model", "n_heads", false},
      {"--kv-heads", "model", "n_kv_heads", false},
      {"--seq-len", "model", "seq_len", false},
  };
  return flags;
}

std::vector<RunFlag> add_run_flags(CLI::App& train, ParsedFlags& values) {
  std::vector<RunFlag> flags;
  auto& parsed = values.run;
  for (const auto& flag : field_flags()) {
    with_field(parsed, flag, [&](const OptionInfo& info, auto& value) {
      using T = std::decay_t<decltype(value)>;
      if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::string> ||
                    std::is_same_v<T, bool>) {
        flags.push_back(field_flag(train, parsed, flag, info, value));
      }
    });
  }

  // The optimizer's flags set fields of its config.
  for (auto& flag : optimizer_flags(train, values)) flags.push_back(std::move(flag));
  return flags;
}

TrainConfig resolve_run(const TrainConfig& invocation, bool out_given,
                        const std::vector<RunFlag>& flags, const std::string& config_path,
                        std::ostream& log, int64_t world) {
  TrainConfig run;
  if (invocation.resume_dir.empty()) {
    if (!config_path.empty()) run = train_config_from_yaml_file(config_path);
    apply_given(flags, run, world);
    run = split_batch(run, world);
    // The embedded default's policy for a non-finite gradient, skipping the whole step, needs
    // every gradient before the first update: inside backward it steps as torch.optim does.
    if (config_path.empty() && run.step_in_backward) {
      run.optimizer.hybrid.nonfinite = NonfinitePolicy::ignore;
    }
  } else {
    const auto& dir = invocation.resume_dir;
    const auto stored = read_stored_run(dir);
    // What this command line describes, resolved as a fresh run resolves it: the --config file,
    // then every flag given. Without --config it starts from the stored run itself, so that
    // `--resume DIR` alone continues whatever the run was made from.
    auto described = config_path.empty() ? stored.config : train_config_from_yaml_file(config_path);
    apply_given(flags, described, world);
    // Both on this launch's ranks: the run's global batch, split among them.
    const auto here = split_batch(stored.config, world), ours = split_batch(described, world);
    check_same_batch(stored.config, ours, here, flags, dir);
    check_describes(here, ours, flags, config_path, dir);
    run = here;
    for (const auto& flag : flags) {  // what may change: intervals and the run's length
      if (!flag.safe_on_resume || flag.option->count() == 0) continue;
      auto changed = run;
      flag.apply(changed);
      const auto before = flag.value(run), after = flag.value(changed);
      if (flag.name == "--steps" && before != after) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "warning: --steps %s changes the run's length from %s: its schedules are "
                      "re-planned (the rate at step %lld moves from %.3g to %.3g)\n",
                      after.c_str(), before.c_str(), static_cast<long long>(stored.step),
                      rate_at(run.optimizer, stored.step, run.steps),
                      rate_at(changed.optimizer, stored.step, changed.steps));
        log << line;
      }
      run = changed;
    }
  }
  run.out_dir =
      out_given || invocation.resume_dir.empty() ? invocation.out_dir : invocation.resume_dir;
  run.resume_dir = invocation.resume_dir;
  run.stop_after = invocation.stop_after;
  run.progress_bar = invocation.progress_bar;
  run.handle_signals = invocation.handle_signals;
  run.overwrite = invocation.overwrite;
  run.program = invocation.program;
  run.threads_reason = invocation.threads_reason;
  return run;
}

}  // namespace muon::cli
