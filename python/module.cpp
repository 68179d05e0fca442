// muon_cpp._core: the compiled half of the Python module. The classes Python code sees are
// torch.optim.Optimizer subclasses in muon_cpp/__init__.py; each owns an Engine (one of our C++
// optimizers) and pushes its param_groups' settings into it before every step.
//
// Errors: muon::Error from constructors and configs → ValueError (pybind11 maps
// std::invalid_argument), wrong Python types → TypeError, problems found while stepping (sparse
// gradients, bad settings assigned between steps) → RuntimeError, as torch.optim raises them.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "muon/adam.h"
#include "muon/config.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/muon.h"
#include "muon/orthogonalize.h"
#include "muon/param_state.h"

namespace py = pybind11;

namespace muon::python {
namespace {

// ---- Python values → C++ settings, with TypeErrors naming the key ----

[[noreturn]] void type_error(const std::string& key, const std::string& expected, py::handle v) {
  throw py::type_error(key + " must be " + expected + ", got " +
                       py::str(py::type::of(v).attr("__name__")).cast<std::string>() + " " +
                       py::repr(v).cast<std::string>());
}

double number(const std::string& key, py::handle v) {
  // bool is an int to Python but never a rate; a 0-d tensor or numpy scalar is fine.
  if (py::isinstance<py::bool_>(v) || py::isinstance<py::str>(v) || !PyNumber_Check(v.ptr())) {
    type_error(key, "a number", v);
  }
  return py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
}

int64_t integer(const std::string& key, py::handle v) {
  if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v)) type_error(key, "an int", v);
  return v.cast<int64_t>();
}

// A list or tuple of ints.
std::vector<int64_t> integers(const std::string& key, py::handle v) {
  if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v)) {
    type_error(key, "a list or tuple of ints", v);
  }
  std::vector<int64_t> values;
  for (const auto& item : py::reinterpret_borrow<py::sequence>(v)) {
    values.push_back(integer(key + " entry", item));
  }
  return values;
}

bool boolean(const std::string& key, py::handle v) {
  if (!py::isinstance<py::bool_>(v)) type_error(key, "True or False", v);
  return v.cast<bool>();
}

// None (unset) or a bool.
std::optional<bool> optional_boolean(const std::string& key, py::handle v) {
  if (v.is_none()) return std::nullopt;
  if (!py::isinstance<py::bool_>(v)) type_error(key, "None, True or False", v);
  return v.cast<bool>();
}

py::object optional_bool(const std::optional<bool>& v) {
  return v ? py::object(py::bool_(*v)) : py::object(py::none());
}

std::string text(const std::string& key, py::handle v) {
  if (!py::isinstance<py::str>(v)) type_error(key, "a str", v);
  return v.cast<std::string>();
}

at::ScalarType dtype(const std::string& key, py::handle v) {
  if (!THPDtype_Check(v.ptr())) type_error(key, "a torch.dtype", v);
  return reinterpret_cast<THPDtype*>(v.ptr())->scalar_type;
}

py::object dtype_object(at::ScalarType t) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
}

Betas betas(const std::string& key, py::handle v) {
  if (!(py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v)) || py::len(v) != 2) {
    type_error(key, "a pair (beta1, beta2)", v);
  }
  const auto s = py::reinterpret_borrow<py::sequence>(v);
  return {number(key + "[0]", s[0]), number(key + "[1]", s[1])};
}

// A table name or rows [[a, b, c], ...].
CoefficientTable coefficients(const std::string& key, py::handle v) {
  if (py::isinstance<py::str>(v)) return CoefficientTable::by_name(v.cast<std::string>());
  if (!py::isinstance<py::sequence>(v)) type_error(key, "a table name or [[a, b, c], ...]", v);
  std::vector<Coefficients> rows;
  for (const auto& row : py::reinterpret_borrow<py::sequence>(v)) {
    if (!py::isinstance<py::sequence>(row) || py::len(row) != 3) {
      type_error(key, "rows of three numbers [a, b, c]", row);
    }
    const auto r = py::reinterpret_borrow<py::sequence>(row);
    rows.push_back({number(key, r[0]), number(key, r[1]), number(key, r[2])});
  }
  return CoefficientTable::custom(std::move(rows));
}

py::object coefficients_object(const CoefficientTable& table) {
  if (table.name != "custom") return py::str(table.name);
  py::list rows;
  for (const auto& r : table.rows) rows.append(py::make_tuple(r[0], r[1], r[2]));
  return std::move(rows);
}

// Reads `key` from `d` when present (a missing key keeps the current setting).
template <class Fn>
void read(const py::dict& d, const char* key, Fn&& apply) {
  if (d.contains(key)) apply(std::string(key), d[key]);
}

// ---- options ↔ dicts: the keys of a param_groups entry ----

py::dict to_dict(const MuonOptions& o) {
  py::dict d;
  d["lr"] = o.lr();
  d["momentum"] = o.momentum();
  d["nesterov"] = o.nesterov();
  d["momentum_form"] = to_string(o.momentum_form());
  d["weight_decay"] = o.weight_decay();
  d["ns_steps"] = o.ns_steps();
  d["coefficients"] = coefficients_object(o.coefficients());
  d["ns_method"] = to_string(o.ns_method());
  d["ns_dtype"] = o.ns_dtype() ? dtype_object(*o.ns_dtype()) : py::none();
  d["gram_restarts"] = o.gram_restarts() ? py::object(py::tuple(py::cast(*o.gram_restarts())))
                                         : py::object(py::none());
  d["adjust_lr"] = to_string(o.adjust_lr());
  d["post_norm"] = to_string(o.post_norm());
  d["post_norm_eps"] = o.post_norm_eps();
  if (o.normuon()) {
    d["normuon"] = py::dict(py::arg("beta2") = o.normuon()->beta2,
                            py::arg("axis") = to_string(o.normuon()->axis));
  } else {
    d["normuon"] = py::none();
  }
  d["cautious_weight_decay"] = o.cautious_weight_decay();
  d["cautious"] = o.cautious();
  d["state_dtype"] = dtype_object(o.state_dtype());
  d["fused"] = optional_bool(o.fused());
  return d;
}

void update(MuonOptions& o, const py::dict& d) {
  using S = const std::string&;
  read(d, "lr", [&](S k, py::handle v) { o.lr(number(k, v)); });
  read(d, "momentum", [&](S k, py::handle v) { o.momentum(number(k, v)); });
  read(d, "nesterov", [&](S k, py::handle v) { o.nesterov(boolean(k, v)); });
  read(d, "momentum_form",
       [&](S k, py::handle v) { o.momentum_form(momentum_form_from_string(text(k, v))); });
  read(d, "weight_decay", [&](S k, py::handle v) { o.weight_decay(number(k, v)); });
  read(d, "ns_steps", [&](S k, py::handle v) { o.ns_steps(integer(k, v)); });
  read(d, "coefficients", [&](S k, py::handle v) { o.coefficients(coefficients(k, v)); });
  read(d, "ns_method", [&](S k, py::handle v) { o.ns_method(ns_method_from_string(text(k, v))); });
  read(d, "ns_dtype", [&](S k, py::handle v) {
    o.ns_dtype(v.is_none() ? std::nullopt : std::optional<at::ScalarType>(dtype(k, v)));
  });
  read(d, "gram_restarts", [&](S k, py::handle v) {
    o.gram_restarts(v.is_none() ? std::nullopt
                                : std::optional<std::vector<int64_t>>(integers(k, v)));
  });
  read(d, "adjust_lr", [&](S k, py::handle v) { o.adjust_lr(adjust_lr_from_string(text(k, v))); });
  read(d, "post_norm", [&](S k, py::handle v) { o.post_norm(post_norm_from_string(text(k, v))); });
  read(d, "post_norm_eps", [&](S k, py::handle v) { o.post_norm_eps(number(k, v)); });
  read(d, "normuon", [&](S k, py::handle v) {
    if (v.is_none()) return o.normuon(std::nullopt), void();
    if (!py::isinstance<py::dict>(v)) type_error(k, "None or a dict(beta2=..., axis=...)", v);
    const auto n = py::reinterpret_borrow<py::dict>(v);
    NorMuonOptions settings;
    for (const auto& item : n) {
      const auto name = text(k + " key", item.first);
      if (name == "beta2") {
        settings.beta2 = number(k + "['beta2']", item.second);
      } else if (name == "axis") {
        settings.axis = normuon_axis_from_string(text(k + "['axis']", item.second));
      } else {
        throw Error(k + ": unknown key '" + name + "'; valid keys are beta2, axis");
      }
    }
    o.normuon(settings);
  });
  read(d, "cautious_weight_decay",
       [&](S k, py::handle v) { o.cautious_weight_decay(boolean(k, v)); });
  read(d, "cautious", [&](S k, py::handle v) { o.cautious(boolean(k, v)); });
  read(d, "state_dtype", [&](S k, py::handle v) { o.state_dtype(dtype(k, v)); });
  read(d, "fused", [&](S k, py::handle v) { o.fused(optional_boolean(k, v)); });
}

// AdamW, Adam and Lamb share these keys; Lamb has no nesterov or cautious.
template <class Options>
py::dict to_dict(const Options& o) {
  py::dict d;
  d["lr"] = o.lr();
  d["betas"] = py::make_tuple(std::get<0>(o.betas()), std::get<1>(o.betas()));
  d["eps"] = o.eps();
  d["weight_decay"] = o.weight_decay();
  if constexpr (Options::rule != AdamRule::lamb) {
    d["nesterov"] = o.nesterov();
    d["cautious"] = o.cautious();
  }
  d["state_dtype"] = dtype_object(o.state_dtype());
  d["fused"] = optional_bool(o.fused());
  return d;
}

template <class Options>
void update(Options& o, const py::dict& d) {
  using S = const std::string&;
  read(d, "lr", [&](S k, py::handle v) { o.lr(number(k, v)); });
  read(d, "betas", [&](S k, py::handle v) { o.betas(betas(k, v)); });
  read(d, "eps", [&](S k, py::handle v) { o.eps(number(k, v)); });
  read(d, "weight_decay", [&](S k, py::handle v) { o.weight_decay(number(k, v)); });
  if constexpr (Options::rule != AdamRule::lamb) {
    read(d, "nesterov", [&](S k, py::handle v) { o.nesterov(boolean(k, v)); });
    read(d, "cautious", [&](S k, py::handle v) { o.cautious(boolean(k, v)); });
  }
  read(d, "state_dtype", [&](S k, py::handle v) { o.state_dtype(dtype(k, v)); });
  read(d, "fused", [&](S k, py::handle v) { o.fused(optional_boolean(k, v)); });
}

// Dispatch on the options' type (which is the algorithm tag).
py::dict options_to_dict(const torch::optim::OptimizerOptions& o) {
  if (const auto* m = dynamic_cast<const MuonOptions*>(&o)) return to_dict(*m);
  if (const auto* a = dynamic_cast<const AdamWOptions*>(&o)) return to_dict(*a);
  if (const auto* a = dynamic_cast<const AdamOptions*>(&o)) return to_dict(*a);
  return to_dict(dynamic_cast<const LambOptions&>(o));
}

void update_options(torch::optim::OptimizerOptions& o, const py::dict& d) {
  if (auto* m = dynamic_cast<MuonOptions*>(&o)) return update(*m, d);
  if (auto* a = dynamic_cast<AdamWOptions*>(&o)) return update(*a, d);
  if (auto* a = dynamic_cast<AdamOptions*>(&o)) return update(*a, d);
  update(dynamic_cast<LambOptions&>(o), d);
}

std::string algorithm_of(const torch::optim::OptimizerOptions& o) {
  if (dynamic_cast<const MuonOptions*>(&o) != nullptr) return "muon";
  if (dynamic_cast<const AdamWOptions*>(&o) != nullptr) return "adamw";
  if (dynamic_cast<const AdamOptions*>(&o) != nullptr) return "adam";
  return "lamb";
}

std::vector<at::Tensor> tensors(const std::string& key, py::handle v) {
  std::vector<at::Tensor> out;
  for (const auto& item : py::reinterpret_borrow<py::sequence>(v)) {
    if (!THPVariable_Check(item.ptr())) type_error(key, "a list of tensors", item);
    out.push_back(item.cast<at::Tensor>());
  }
  return out;
}

// ---- QK-clip from Python: a source object with the two methods of muon::QkClipSource ----

class PythonQkClipSource : public QkClipSource {
 public:
  explicit PythonQkClipSource(py::object source) : source_(std::move(source)) {}

  std::vector<QkClipTarget> qk_clip_targets() override {
    py::gil_scoped_acquire gil;
    std::vector<QkClipTarget> out;
    for (const auto& item : source_.attr("qk_clip_targets")()) {
      const auto d = py::reinterpret_borrow<py::dict>(item);
      QkClipTarget t;
      t.layer = text("layer", d["layer"]);
      const auto kind = d.contains("kind") ? text("kind", d["kind"]) : "grouped_query";
      check(kind == "grouped_query" || kind == "latent",
            "qk_clip_targets: kind must be "
            "grouped_query or latent, got '",
            kind, "'");
      t.kind = kind == "latent" ? AttentionKind::latent : AttentionKind::grouped_query;
      t.q_weight = d["q_weight"].cast<at::Tensor>();
      t.k_weight = d["k_weight"].cast<at::Tensor>();
      t.n_heads = integer("n_heads", d["n_heads"]);
      const auto get_int = [&](const char* key, int64_t& field) {
        if (d.contains(key)) field = integer(key, d[key]);
      };
      const auto get_bool = [&](const char* key, bool& field) {
        if (d.contains(key)) field = boolean(key, d[key]);
      };
      get_int("n_kv_heads", t.n_kv_heads);
      get_int("head_dim", t.head_dim);
      get_bool("gated_query", t.gated_query);
      get_bool("qk_norm", t.qk_norm);
      get_int("qk_nope_head_dim", t.qk_nope_head_dim);
      get_int("qk_rope_head_dim", t.qk_rope_head_dim);
      get_int("v_head_dim", t.v_head_dim);
      out.push_back(std::move(t));
    }
    return out;
  }

  std::map<std::string, at::Tensor> qk_max_logits() override {
    py::gil_scoped_acquire gil;
    return source_.attr("qk_max_logits")().cast<std::map<std::string, at::Tensor>>();
  }

 private:
  py::object source_;
};

// ---- the engine: one C++ optimizer behind a Python optimizer ----

class Engine {
 public:
  explicit Engine(std::unique_ptr<torch::optim::Optimizer> optimizer)
      : optimizer_(std::move(optimizer)),
        hybrid_(dynamic_cast<HybridOptimizer*>(optimizer_.get())) {}

  // groups: [(params, options dict)], options starting from `Options`' defaults.
  template <class Optim, class Options>
  static Engine make(const py::list& groups) {
    std::vector<torch::optim::OptimizerParamGroup> built;
    for (const auto& g : groups) {
      const auto pair = py::reinterpret_borrow<py::tuple>(g);
      auto options = std::make_unique<Options>();
      update(*options, py::reinterpret_borrow<py::dict>(pair[1]));
      built.emplace_back(tensors("params", pair[0]), std::move(options));
    }
    return Engine(std::make_unique<Optim>(std::move(built)));
  }

  static Engine from_config(const py::list& named, const std::string& yaml, int64_t total_steps) {
    std::vector<NamedParameter> parameters;
    for (const auto& item : named) {
      const auto t = py::reinterpret_borrow<py::tuple>(item);
      parameters.push_back(
          {t[0].cast<std::string>(), t[1].cast<at::Tensor>(), t[2].cast<std::string>()});
    }
    const auto config = OptimConfig::from_yaml(yaml);
    return Engine(build_optimizer(config, parameters, total_steps));
  }

  // Every group's parameters and settings, as param_groups shows them.
  py::list groups() const {
    std::map<std::string, std::string> group_of_name;
    if (hybrid_ != nullptr) {
      for (const auto& row : hybrid_->report()) group_of_name[row.name] = row.group;
    }
    std::map<const void*, std::string> name_of;
    if (hybrid_ != nullptr) {
      for (const auto& [name, p] : hybrid_->named_trainable()) {
        name_of[p.unsafeGetTensorImpl()] = name;
      }
    }
    py::list out;
    for (const auto& group : optimizer_->param_groups()) {
      auto d = options_to_dict(group.options());
      py::list params;
      for (const auto& p : group.params()) params.append(p);
      d["params"] = params;
      if (hybrid_ != nullptr) {
        d["algorithm"] = algorithm_of(group.options());
        d["group"] = group_of_name[name_of[group.params().front().unsafeGetTensorImpl()]];
      }
      out.append(d);
    }
    return out;
  }

  // Every group's settings, without the parameters.
  py::list settings() const {
    py::list out;
    for (const auto& group : optimizer_->param_groups())
      out.append(options_to_dict(group.options()));
    return out;
  }

  // Applies each group's settings (dicts in param_groups order; unknown keys are ignored).
  void set_options(const py::list& options) {
    auto& groups = optimizer_->param_groups();
    check(py::len(options) == groups.size(), "expected settings for ", groups.size(),
          " parameter groups, got ", py::len(options));
    // Convert all first: a TypeError in the last group leaves the first ones unchanged.
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> updated;
    for (size_t i = 0; i < groups.size(); ++i) {
      updated.push_back(groups[i].options().clone());
      update_options(*updated.back(), py::reinterpret_borrow<py::dict>(options[i]));
    }
    for (size_t i = 0; i < groups.size(); ++i) groups[i].set_options(std::move(updated[i]));
  }

  void step() {
    py::gil_scoped_release release;
    try {
      optimizer_->step();
    } catch (const Error& e) {
      throw std::runtime_error(e.what());
    }
  }

  // {'step': int, tensor name: tensor} or None before the parameter's first update.
  py::object state(const at::Tensor& param) {
    const auto entry = read_param_state(*optimizer_, param);
    if (!entry) return py::none();
    py::dict d;
    d["step"] = entry->step;
    for (const auto& [name, t] : entry->tensors) d[name.c_str()] = t;
    return std::move(d);
  }

  // Replaces every group's settings and all state. `states` pairs parameters with state dicts
  // ({'step': int or tensor, name: tensor}); parameters not listed start fresh. Everything is
  // checked before anything changes.
  void load(const py::list& options, const py::list& states) {
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> previous;
    for (const auto& g : optimizer_->param_groups()) previous.push_back(g.options().clone());
    set_options(options);
    std::vector<std::pair<at::Tensor, ParamStateEntry>> entries;
    try {
      for (const auto& item : states) {
        const auto pair = py::reinterpret_borrow<py::tuple>(item);
        const auto where = "state_dict['state'][" + py::str(pair[0]).cast<std::string>() + "]";
        const auto param = pair[1].cast<at::Tensor>();
        const auto d = py::reinterpret_borrow<py::dict>(pair[2]);
        ParamStateEntry entry;
        for (const auto& [key_object, value] : d) {
          const auto key = text(where + " key", key_object);
          if (key == "step") {
            entry.step = THPVariable_Check(value.ptr())
                             ? static_cast<int64_t>(value.cast<at::Tensor>().item<double>())
                             : integer(where + "['step']", value);
          } else {
            if (!THPVariable_Check(value.ptr()))
              type_error(where + "['" + key + "']", "a tensor", value);
            entry.tensors[key] = value.cast<at::Tensor>();
          }
        }
        check_param_state(*optimizer_, param, entry, where);
        entries.emplace_back(param, std::move(entry));
      }
    } catch (...) {
      restore_options(previous);
      throw;
    }
    optimizer_->state().clear();
    for (const auto& [param, entry] : entries) write_param_state(*optimizer_, param, entry);
  }

  HybridOptimizer& hybrid() {
    check(hybrid_ != nullptr, "not a HybridOptimizer");
    return *hybrid_;
  }

  // `source` (kept alive here) provides qk_clip_targets() and qk_max_logits(); None detaches.
  void set_qk_clip_source(py::object source) {
    if (source.is_none()) {
      hybrid().set_qk_clip_source(nullptr);
      qk_source_.reset();
      return;
    }
    for (const char* method : {"qk_clip_targets", "qk_max_logits"}) {
      if (!py::hasattr(source, method)) {
        type_error("the QK-clip source", "an object with qk_clip_targets() and qk_max_logits()",
                   source);
      }
    }
    qk_source_ = std::make_unique<PythonQkClipSource>(std::move(source));
    hybrid().set_qk_clip_source(qk_source_.get());
  }

 private:
  void restore_options(std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& previous) {
    auto& groups = optimizer_->param_groups();
    for (size_t i = 0; i < groups.size(); ++i) groups[i].set_options(std::move(previous[i]));
  }

  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  HybridOptimizer* hybrid_;
  std::unique_ptr<PythonQkClipSource> qk_source_;
};

py::list report_rows(const HybridOptimizer& opt) {
  py::list rows;
  for (const auto& r : opt.report()) {
    py::dict d;
    d["name"] = r.name;
    d["shape"] = py::tuple(py::cast(r.shape));
    d["dtype"] = dtype_object(r.dtype);
    d["role"] = to_string(r.role);
    d["reason"] = r.reason;
    d["group"] = r.group.empty() ? py::object(py::none()) : py::object(py::str(r.group));
    d["lr"] = r.lr;
    d["weight_decay"] = r.weight_decay;
    rows.append(d);
  }
  return rows;
}

py::dict last_step(const HybridOptimizer& opt) {
  const auto& s = opt.last_step();
  py::list clipped;
  for (const auto& q : s.qk_clip) {
    clipped.append(py::dict(py::arg("layer") = q.layer, py::arg("head") = q.head,
                            py::arg("factor") = q.factor));
  }
  return py::dict(py::arg("grad_norm") = s.grad_norm, py::arg("clip_factor") = s.clip_factor,
                  py::arg("skipped") = s.skipped, py::arg("skipped_steps") = s.skipped_steps,
                  py::arg("qk_clip") = clipped);
}

void bind_engine(py::module_& m) {
  py::class_<Engine>(m, "Engine")
      .def_static("muon", &Engine::make<Muon, MuonOptions>)
      .def_static("adamw", &Engine::make<AdamW, AdamWOptions>)
      .def_static("adam", &Engine::make<Adam, AdamOptions>)
      .def_static("lamb", &Engine::make<Lamb, LambOptions>)
      .def_static("hybrid", &Engine::from_config)
      .def("groups", &Engine::groups)
      .def("settings", &Engine::settings)
      .def("set_options", &Engine::set_options)
      .def("step", &Engine::step)
      .def("state", &Engine::state)
      .def("load", &Engine::load)
      .def("report", [](Engine& e) { return report_rows(e.hybrid()); })
      .def("report_text", [](Engine& e) { return e.hybrid().report_text(); })
      .def("last_step", [](Engine& e) { return last_step(e.hybrid()); })
      .def("counters",
           [](Engine& e) {
             return py::make_tuple(e.hybrid().step_count(), e.hybrid().last_step().skipped_steps);
           })
      .def("restore_counters",
           [](Engine& e, int64_t steps, int64_t skipped) {
             check(steps >= 0 && skipped >= 0, "step counters must be ≥ 0, got ", steps, " and ",
                   skipped);
             e.hybrid().restore_counters(steps, skipped);
           })
      .def("reset_state", [](Engine& e) { e.hybrid().reset_state(); })
      .def("set_qk_clip_source", &Engine::set_qk_clip_source);
}

at::Tensor orthogonalize_binding(const at::Tensor& x, py::object table, int64_t steps,
                                 const std::string& method, py::object dtype_or_none,
                                 py::handle gram_restarts) {
  OrthogonalizeOptions o;
  o.steps(steps).coefficients(coefficients("coefficients", table));
  o.method(ns_method_from_string(method));
  if (!gram_restarts.is_none()) o.gram_restarts(integers("gram_restarts", gram_restarts));
  if (!dtype_or_none.is_none()) o.dtype(dtype("dtype", dtype_or_none));
  py::gil_scoped_release release;
  return orthogonalize(x, o);
}

}  // namespace
}  // namespace muon::python

PYBIND11_MODULE(_core, m) {
  using namespace muon::python;
  m.doc() = "The compiled half of muon_cpp; use the classes in muon_cpp.";
  // LibTorch's own errors: their message without the C++ backtrace.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  bind_engine(m);
  m.def("orthogonalize", &orthogonalize_binding, py::arg("x"), py::arg("coefficients"),
        py::arg("steps"), py::arg("method"), py::arg("dtype"), py::arg("gram_restarts"));
  m.def("orthogonality_error", &muon::orthogonality_error, py::arg("x"));
}
