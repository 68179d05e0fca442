// did_you_mean (training/run_flags.h): the close names of a mistyped command or option.
#include <algorithm>
#include <sstream>

#include "muon/internal/yaml_section.h"
#include "training/run_flags.h"

namespace muon::cli {

namespace {

// "'a'", "'a' or 'b'", "'a', 'b' or 'c'".
std::string alternatives(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += "'" + names[i] + "'";
  }
  return text;
}

// The known names close to `word`, in their order in `known`: those that hold it as a
// dash-separated part ("--lr" in "--muon-lr"), and those nearest by edit distance (at most a
// third of its length, at least 2).
std::vector<std::string> close_names(const std::string& word, const std::vector<std::string>& known) {
  const auto parts = [](const std::string& name) {
    std::vector<std::string> out;
    const auto start = name.find_first_not_of('-');
    if (start == std::string::npos) return out;  // "", "---": no parts
    std::istringstream in(name.substr(start));
    for (std::string part; std::getline(in, part, '-');) out.push_back(part);
    return out;
  };
  const auto word_parts = parts(word);
  size_t nearest = std::max<size_t>(2, word.size() / 3);
  for (const auto& k : known) nearest = std::min(nearest, detail::distance(word, k));
  std::vector<std::string> close;
  for (const auto& k : known) {
    const auto name_parts = parts(k);
    const bool holds = word_parts.size() == 1 &&
        std::find(name_parts.begin(), name_parts.end(), word_parts[0]) != name_parts.end();
    if ((holds || detail::distance(word, k) == nearest) &&
        std::find(close.begin(), close.end(), k) == close.end()) {
      close.push_back(k);
    }
  }
  return close;
}

std::string unknown_command(const std::string& word, const std::vector<std::string>& commands) {
  const auto close = close_names(word, commands);
  std::string text = "unknown command '" + word + "'";
  if (!close.empty()) text += "; did you mean " + alternatives(close) + "?";
  std::string all;
  for (const auto& c : commands) all += (all.empty() ? "" : ", ") + c;
  return text + " (the commands: " + all + ")";
}

}  // namespace

UsageHint did_you_mean(const CLI::App& app, const std::vector<std::string>& args) {
  if (args.empty() || args[0].rfind("-", 0) == 0) return {};
  std::vector<std::string> commands;
  const CLI::App* command = nullptr;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands.push_back(sub->get_name());
    if (sub->get_name() == args[0]) command = sub;
  }
  if (command == nullptr) return {unknown_command(args[0], commands), true};
  std::vector<std::string> flags;
  for (const auto* option : command->get_options()) {
    for (const auto& name : option->get_lnames()) flags.push_back("--" + name);
  }
  for (size_t i = 1; i < args.size(); ++i) {
    const auto word = args[i].substr(0, args[i].find('='));
    if (word.rfind("--", 0) != 0 || word.size() == 2 ||
        std::find(flags.begin(), flags.end(), word) != flags.end()) {
      continue;
    }
    const auto close = close_names(word, flags);
    if (!close.empty()) {
      return {"unknown option '" + word + "' of " + command->get_name() + "; did you mean " +
              alternatives(close) + "?"};
    }
  }
  return {};
}

}  // namespace muon::cli
