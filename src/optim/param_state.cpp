#include "muon/param_state.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "muon/algorithms.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/quantize.h"

namespace muon {
namespace {

const torch::optim::OptimizerOptions& group_options(const torch::optim::Optimizer& optimizer,
                                                    const at::Tensor& param) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.is_same(param)) return group.options();
    }
  }
  throw Error("the parameter is not one of this optimizer's");
}

const torch::optim::OptimizerParamState* find_state(const torch::optim::Optimizer& optimizer,
                                                    const at::Tensor& param) {
  const auto it = optimizer.state().find(compat::param_state_key(param));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::string kCodes = "_codes";
const std::string kAbsmax = "_absmax";

// The map a state tensor named `name` is coded in: second moments (exp_avg_sq) are ≥ 0.
q8::CodeMap map_of(const std::string& name) {
  return ends_with(name, "_sq") ? q8::CodeMap::unsigned_e5m3 : q8::CodeMap::signed_e4m3;
}

// Throws, naming `where`, unless `absmax` holds finite scales ≥ 0, one per block of `codes`.
void check_absmax(const at::Tensor& codes, const at::Tensor& absmax, const std::string& where,
                  const std::string& name) {
  const auto shape = q8::absmax_shape(codes.sizes());
  check(absmax.sizes() == at::IntArrayRef(shape), where, ".", name, " has shape ", absmax.sizes(),
        "; codes of shape ", codes.sizes(), " have ", at::IntArrayRef(shape),
        " scales (one per block of ", q8::kBlock, " elements of a row)");
  check(absmax.is_floating_point(), where, ".", name, " has dtype ", absmax.scalar_type(),
        "; scales are float32");
  check(at::isfinite(absmax).all().item<bool>(), where, ".", name, " holds NaN or Inf");
  check((absmax >= 0).all().item<bool>(), where, ".", name,
        " holds a negative scale; a block's scale is its largest |x|");
}

// Throws unless `codes` are byte codes: uint8, or (after torch's load_state_dict cast them to
// the parameter's dtype) whole numbers 0–255.
void check_codes(const at::Tensor& codes, const std::string& where, const std::string& name) {
  if (codes.scalar_type() == at::kByte) return;
  check(codes.is_floating_point() &&
            (codes == codes.round()).logical_and(codes >= 0).logical_and(codes <= 255).all().item<bool>(),
        where, ".", name, " has dtype ", codes.scalar_type(),
        " and values that are not codes; 8-bit codes are uint8 (0–255)");
}

}  // namespace

std::vector<std::string> fit_state_precision(std::map<std::string, at::Tensor>& tensors,
                                             const std::vector<StateSlot>& slots,
                                             const std::string& where) {
  const auto has = [&](const std::string& name) {
    const auto it = tensors.find(name);
    return it != tensors.end() && it->second.defined();
  };
  std::vector<std::string> converted;
  for (const auto& slot : slots) {
    if (has(slot.name)) continue;
    if (ends_with(slot.name, kCodes)) {  // kept 8-bit, given as X: quantize
      const auto base = slot.name.substr(0, slot.name.size() - kCodes.size());
      if (!has(base)) continue;
      const auto& x = tensors[base];
      check(x.sizes() == at::IntArrayRef(slot.shape) && x.is_floating_point(), where, ".", base,
            " has shape ", x.sizes(), " and dtype ", x.scalar_type(), "; expected floating point of shape ",
            at::IntArrayRef(slot.shape));
      check(at::isfinite(x).all().item<bool>(), where, ".", base, " holds NaN or Inf");
      auto codes = at::zeros(x.sizes(), x.options().dtype(at::kByte));
      auto absmax = at::zeros(q8::absmax_shape(x.sizes()), x.options().dtype(at::kFloat));
      q8::quantize(x.contiguous(), codes, absmax, map_of(base));
      tensors.erase(base);
      tensors[slot.name] = codes;
      tensors[base + kAbsmax] = absmax;
      converted.push_back(base + " → " + slot.name + ", " + base + kAbsmax);
    } else if (!ends_with(slot.name, kAbsmax) && has(slot.name + kCodes) &&
               has(slot.name + kAbsmax)) {  // kept in full or bf16 precision, given 8-bit
      const auto codes = tensors[slot.name + kCodes];
      const auto absmax = tensors[slot.name + kAbsmax];
      check(codes.sizes() == at::IntArrayRef(slot.shape), where, ".", slot.name, kCodes,
            " has shape ", codes.sizes(), ", this optimizer needs ", at::IntArrayRef(slot.shape));
      check_codes(codes, where, slot.name + kCodes);
      check_absmax(codes, absmax, where, slot.name + kAbsmax);
      const auto x = q8::dequantize(codes.to(at::kByte).contiguous(),
                                    absmax.to(at::kFloat).contiguous(), map_of(slot.name));
      tensors.erase(slot.name + kCodes);
      tensors.erase(slot.name + kAbsmax);
      tensors[slot.name] = x.to(slot.dtype);
      converted.push_back(slot.name + kCodes + ", " + slot.name + kAbsmax + " → " + slot.name);
    }
  }
  return converted;
}

std::vector<std::string> convert_state_precision(const torch::optim::Optimizer& optimizer,
                                                 const at::Tensor& param, ParamStateEntry& entry,
                                                 const std::string& where) {
  return fit_state_precision(entry.tensors, expected_state_slots(optimizer, param), where);
}

std::vector<StateSlot> expected_state_slots(const torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param) {
  const auto* views = dynamic_cast<const MatrixViews*>(&optimizer);
  const auto view = views != nullptr ? views->matrix_view(param) : param.sizes().vec();
  return with_context("optimizer state", [&] {
    return visit_algorithm(group_options(optimizer, param), [&](const auto& o) {
      return state_slots(o, param, view);
    });
  });
}

std::string state_storage_text(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  std::string text = "float32";
  for (const auto& slot : expected_state_slots(optimizer, param)) {
    if (slot.dtype == at::kByte) return "int8";
    if (slot.dtype == at::kBFloat16) text = "bfloat16";
    if (slot.dtype == at::kDouble && text == "float32") text = "float64";
  }
  const auto asked = get_option<at::ScalarType>(group_options(optimizer, param), "state_dtype");
  if (asked == at::kChar) text += " (int8 needs 4096+ elements in 2+ dims)";
  return text;
}

std::optional<ParamStateEntry> read_param_state(const torch::optim::Optimizer& optimizer,
                                                const at::Tensor& param) {
  const auto* state = find_state(optimizer, param);
  if (state == nullptr) return std::nullopt;
  std::set<std::string> kept;
  for (const auto& slot : expected_state_slots(optimizer, param)) kept.insert(slot.name);
  ParamStateEntry entry;
  visit_algorithm(group_options(optimizer, param), [&](const auto& o) {
    using Entry = Algorithm<std::decay_t<decltype(o)>>;
    const auto* kept_state = dynamic_cast<const typename Entry::State*>(state);
    check(kept_state != nullptr, "optimizer state: the state kept for a ", Entry::name,
          " parameter is another algorithm's");
    auto& s = const_cast<typename Entry::State&>(*kept_state);  // the visit only reads here
    entry.step = s.step();
    Entry::State::visit(s, [&](const char* name, at::Tensor& t) {
      if (t.defined() && kept.count(name) != 0) entry.tensors[name] = t;
    });
  });
  return entry;
}

void check_param_state(const torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamStateEntry& entry, const std::string& where,
                       StateDtypes accepted) {
  check(entry.step >= 0, where, ".step is ", entry.step, "; a step count is ≥ 0");
  std::set<std::string> expected;
  for (const auto& slot : expected_state_slots(optimizer, param)) {
    expected.insert(slot.name);
    const auto it = entry.tensors.find(slot.name);
    check(it != entry.tensors.end(), where, " lacks '", slot.name, "'");
    const auto& t = it->second;
    check(t.defined(), where, ".", slot.name, " is not a tensor");
    check(t.sizes() == at::IntArrayRef(slot.shape), where, ".", slot.name, " has shape ", t.sizes(),
          ", this optimizer needs ", at::IntArrayRef(slot.shape));
    const bool also = accepted == StateDtypes::stored_or_param && param.scalar_type() != slot.dtype;
    check(t.scalar_type() == slot.dtype || (also && t.scalar_type() == param.scalar_type()), where,
          ".", slot.name, " has dtype ", t.scalar_type(), ", this optimizer stores ", slot.dtype,
          also ? detail::concat(" (and takes the parameter's ", param.scalar_type(), ")") : "");
    check(t.layout() == at::kStrided, where, ".", slot.name, " is sparse; state is dense");
    if (ends_with(slot.name, kCodes)) check_codes(t, where, slot.name);
    if (ends_with(slot.name, kAbsmax)) {
      check_absmax(entry.tensors.at(slot.name.substr(0, slot.name.size() - kAbsmax.size()) + kCodes),
                   t, where, slot.name);
    }
    check(at::isfinite(t).all().item<bool>(), where, ".", slot.name, " holds NaN or Inf");
  }
  std::string valid;
  for (const auto& e : expected) valid += (valid.empty() ? "" : ", ") + e;
  for (const auto& [name, t] : entry.tensors) {
    check(expected.count(name) != 0, where, " has '", name,
          "', which this optimizer does not keep (it keeps ", valid, ")");
  }
}

void write_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamStateEntry& entry) {
  std::map<std::string, at::ScalarType> stored;
  for (const auto& slot : expected_state_slots(optimizer, param)) stored[slot.name] = slot.dtype;
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  visit_algorithm(group_options(optimizer, param), [&](const auto& o) {
    using Entry = Algorithm<std::decay_t<decltype(o)>>;
    auto s = std::make_unique<typename Entry::State>();
    s->step(entry.step);
    Entry::State::visit(*s, [&](const char* name, at::Tensor& t) {
      const auto it = entry.tensors.find(name);
      if (it == entry.tensors.end()) return;
      const auto slot = stored.find(name);
      const auto dtype = slot != stored.end() ? slot->second : it->second.scalar_type();
      t = it->second.to(param.device(), dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    });
    state = std::move(s);
  });
  optimizer.state()[compat::param_state_key(param)] = std::move(state);
}

namespace {

constexpr int64_t kArchiveVersion = 1;

void check_settings(const torch::optim::OptimizerOptions& options, size_t g) {
  with_context(detail::concat("optimizer archive: param group ", g),
               [&] { check_group_options(options); });
}

std::string group_key(size_t g) {
  return detail::concat("param_groups/", g, "/");
}

std::string state_key(size_t g, size_t i) {
  return detail::concat("state/", g, "/", i, "/");
}

c10::IValue read_value(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  check(archive.try_read(key, value), "optimizer archive: '", key,
        "' is missing; it was not written by this optimizer's save()");
  return value;
}

}  // namespace

void save_optimizer_state(const torch::optim::Optimizer& optimizer,
                          torch::serialize::OutputArchive& archive) {
  archive.write("muon_optimizer_archive", c10::IValue(kArchiveVersion));
  const auto& groups = optimizer.param_groups();
  archive.write("param_groups/count", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    archive.write(group_key(g) + "size", c10::IValue(static_cast<int64_t>(params.size())));
    for (const auto& [name, value] : group_settings(groups[g].options())) {
      archive.write(group_key(g) + name, c10::IValue(value));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const auto entry = read_param_state(optimizer, params[i]);
      if (!entry) continue;
      archive.write(state_key(g, i) + "step", c10::IValue(entry->step));
      for (const auto& [name, t] : entry->tensors) archive.write(state_key(g, i) + name, t);
    }
  }
}

void load_optimizer_state(torch::optim::Optimizer& optimizer,
                          torch::serialize::InputArchive& archive) {
  c10::IValue version;
  check(archive.try_read("muon_optimizer_archive", version) && version.isInt() &&
            version.toInt() == kArchiveVersion,
        "optimizer archive: not written by a muon-cpp optimizer's save() (format ", kArchiveVersion,
        ")");
  auto& groups = optimizer.param_groups();
  const auto count = read_value(archive, "param_groups/count").toInt();
  check(count == static_cast<int64_t>(groups.size()), "optimizer archive: it has ", count,
        " param groups, this optimizer ", groups.size());
  // Everything is read and checked before anything is written.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<std::pair<at::Tensor, ParamStateEntry>> states;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    const auto size = read_value(archive, group_key(g) + "size").toInt();
    check(size == static_cast<int64_t>(params.size()), "optimizer archive: param group ", g,
          " has ", size, " parameters, this optimizer's ", params.size());
    auto values = group_settings(groups[g].options());
    for (auto& [name, value] : values) value = read_value(archive, group_key(g) + name).toDouble();
    options.push_back(groups[g].options().clone());
    set_group_settings(*options.back(), values);
    check_settings(*options.back(), g);
    for (size_t i = 0; i < params.size(); ++i) {
      c10::IValue step;
      if (!archive.try_read(state_key(g, i) + "step", step)) continue;
      ParamStateEntry entry;
      entry.step = step.toInt();
      for (const auto& slot : expected_state_slots(optimizer, params[i])) {
        // The slot, or what it is in another precision (converted below).
        std::vector<std::string> names{slot.name, slot.name + kCodes, slot.name + kAbsmax};
        if (ends_with(slot.name, kCodes)) {
          names.push_back(slot.name.substr(0, slot.name.size() - kCodes.size()));
        }
        for (const auto& name : names) {
          at::Tensor t;
          if (archive.try_read(state_key(g, i) + name, t)) entry.tensors[name] = t;
        }
      }
      const auto where = detail::concat("parameter ", i, " of param group ", g);
      convert_state_precision(optimizer, params[i], entry, where);
      check_param_state(optimizer, params[i], entry, where);
      states.emplace_back(params[i], std::move(entry));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(options[g]));
  optimizer.state().clear();
  for (const auto& [param, entry] : states) write_param_state(optimizer, param, entry);
}

}  // namespace muon
