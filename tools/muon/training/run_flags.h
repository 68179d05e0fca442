// The flags of `muon train` that describe the run, one declaration each: its name, the key it
// sets in the run config, and whether a resumed run may change it. From the same list come the
// CLI options, a fresh run's config (embedded default or --config, then the flags given) and a
// resumed run's (the checkpoint's, refusing a flag that contradicts it).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "training/train.h"

namespace muon::cli {

struct RunFlag {
  std::string name;     // "--layers"
  std::string key;      // "model.n_layers"; optimizer.muon.* is the matrices' section (dion's)
  bool safe_on_resume;  // a resumed run may change it (intervals, the run's length)
  CLI::Option* option;
  std::function<void(TrainConfig&)> apply;               // the parsed value into a config
  std::function<std::string(const TrainConfig&)> value;  // the config's value, as text
};

// The flags that set one field of the run config's model, data or train section, one entry each:
// a short name for a field of GptConfig's, DataConfig's or TrainConfig's field list, whose doc is
// the flag's help and whose range (positive, nonnegative) its bound. train registers all of them
// as run flags (keys model.*, data.*, train.*), route and compare the model's on a model of their
// own.
struct FieldFlag {
  const char* name;     // "--layers"
  const char* section;  // "model", "data" or "train"
  const char* key;      // "n_layers": the field's key in its list
  bool safe_on_resume;  // a resumed run may change it (intervals, the run's length)
};
const std::vector<FieldFlag>& field_flags();

// f(info, field) for the field `key` of a struct with a field list (GptConfig, ...).
template <class Fields, class F>
void with_key(Fields& fields, const std::string& key, F&& f) {
  visit_options(fields, [&](const OptionInfo& info, auto& value) {
    if (key == info.name) f(info, value);
  });
}

// f(info, field) for the field `flag` sets in `config` (a TrainConfig, const or not).
template <class Config, class F>
void with_field(Config& config, const FieldFlag& flag, F&& f) {
  const std::string section = flag.section;
  if (section == "model") return with_key(config.model, flag.key, f);
  if (section == "data") return with_key(config.data, flag.key, f);
  with_key(config, flag.key, f);
}

// The bound a whole-number field's range gives its flag: 1 for positive, else 0.
inline int64_t least_of(const OptionInfo& info) {
  return info.range == Range::positive ? 1 : 0;
}

// Where the parsed values land (it must outlive the flags).
struct ParsedFlags {
  TrainConfig run;
  std::string optimizer = "muon", others = "adamw", state_dtype = "float32";
  double muon_lr = 0.02, adamw_lr = 0.004;
};

// Registers the run's flags on `train`.
std::vector<RunFlag> add_run_flags(CLI::App& train, ParsedFlags& values);
// Registers the flags that set the optimizer's fields (optimizer_flags.cpp); add_run_flags calls it.
std::vector<RunFlag> optimizer_flags(CLI::App& train, ParsedFlags& values);

// The run to train: fresh (the embedded default or `config_path`, then every flag given) or, when
// invocation.resume_dir is set, the checkpoint's run. Resuming, the command line — `config_path`
// (or, without one, the stored run) with every flag given — must describe the stored run, key by
// key, but for the keys of safe flags, which it then applies (a change of --steps is reported on
// `log`); so the command that started a run, plus --resume, continues it. Otherwise it throws,
// naming each key that differs, both values and the flag or file that set it. The invocation
// fields (out_dir — default: the resumed directory —, stop_after, overwrite, ...) come from
// `invocation`; out_given says --out was typed. `world`: the ranks of this launch; the run's
// global batch (batch_size × ranks, --batch-size counting per rank of this launch) is split among
// them, so a run resumes on any number of ranks that divides it (split_batch).
TrainConfig resolve_run(const TrainConfig& invocation, bool out_given,
                        const std::vector<RunFlag>& flags, const std::string& config_path,
                        std::ostream& log, int64_t world = 1);

// Validators of numeric flags, each refusing with a readable bound and the value given ("--steps:
// must be a whole number >= 1 (at most 2^53), got 0"), text that is not a number included. A whole
// number in [least, most] (most at most 2^53, what a double holds exactly: CLI11 alone clamps 1e20
// to 2^63 − 1 silently); a finite number > 0; a number in [least, most].
inline constexpr int64_t kMaxWholeNumber = int64_t{1} << 53;
CLI::Validator whole_number(int64_t least, int64_t most = kMaxWholeNumber);
CLI::Validator positive_number();
CLI::Validator number_in(double least, double most);

// For arguments CLI11 refused: an unknown command named, with the close ones ("did you mean")
// and every command — which replaces CLI11's "A subcommand is required" —; or an unknown option
// with the close ones: those holding it as a dash-separated part ("--lr": "--muon-lr",
// "--adamw-lr") and the nearest by edit distance, said before CLI11's message (text "" when none
// is close). `args` are the program's arguments without its name.
struct UsageHint {
  std::string text;
  bool replaces_message = false;
};
UsageHint did_you_mean(const CLI::App& app, const std::vector<std::string>& args);

}  // namespace muon::cli
