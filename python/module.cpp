// muon_cpp._core: the compiled half of the Python module. The classes Python code sees are
// torch.optim.Optimizer subclasses in muon_cpp/__init__.py; each owns an Engine (one of our C++
// optimizers) and pushes its param_groups' settings into it before every step. Over 400 lines on
// purpose: the Engine and the bindings that expose it read as one piece; the value conversions
// are values.cpp.
//
// Errors: muon::Error from constructors and configs → ValueError (pybind11 maps
// std::invalid_argument), wrong Python types → TypeError, problems found while stepping (sparse
// gradients, bad settings assigned between steps) → RuntimeError, as torch.optim raises them.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "muon/algorithms.h"
#include "muon/config.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/muon.h"
#include "muon/orthogonalize.h"
#include "muon/param_state.h"
#include "muon/quantize.h"
#include "muon/presets.h"
#include "muon/step_in_backward.h"
#include "muon/stochastic_rounding.h"
#include "values.h"

namespace py = pybind11;

namespace muon::python {
namespace {

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

// A state's step from PyTorch's layout (a float tensor): checked to be a whole number in range
// before it becomes an integer.
int64_t step_count(const std::string& key, const at::Tensor& t) {
  check(t.numel() == 1, key, " must be a one-element tensor, got shape ", t.sizes());
  const double v = t.item<double>();
  check(std::isfinite(v) && v >= 0 && v <= 9007199254740992.0 && std::floor(v) == v, key,
        " must be a whole number in [0, 2^53], got ", v);
  return static_cast<int64_t>(v);
}

// (name, tensor, module type) triples from Python.
std::vector<NamedParameter> named_parameters(const py::list& named) {
  std::vector<NamedParameter> parameters;
  for (const auto& item : named) {
    const auto t = py::reinterpret_borrow<py::tuple>(item);
    parameters.push_back(
        {t[0].cast<std::string>(), t[1].cast<at::Tensor>(), t[2].cast<std::string>()});
  }
  return parameters;
}

class Engine {
 public:
  explicit Engine(std::unique_ptr<torch::optim::Optimizer> optimizer)
      : optimizer_(std::move(optimizer)) {}
  explicit Engine(std::unique_ptr<HybridOptimizer> hybrid)
      : hybrid_(hybrid.get()), optimizer_(std::move(hybrid)) {}

  // groups: [(params, options dict)], options starting from `Options`' defaults.
  template <class Optim, class Options>
  static Engine make(const py::list& groups) {
    std::vector<torch::optim::OptimizerParamGroup> built;
    for (const auto& g : groups) {
      const auto pair = py::reinterpret_borrow<py::tuple>(g);
      auto options = std::make_unique<Options>();
      update_options(*options, py::reinterpret_borrow<py::dict>(pair[1]));
      built.emplace_back(tensors("params", pair[0]), std::move(options));
    }
    return Engine(std::make_unique<Optim>(std::move(built)));
  }

  // A hybrid over explicit groups, no routing: [(params, algorithm name, options dict)], each
  // group's options starting from its algorithm's defaults; `views`: (matrix parameter, view)
  // pairs for those orthogonalized in another view than their shape. Torch's semantics: no
  // clipping, no schedules, a non-finite gradient steps as any other.
  static Engine grouped(const py::list& groups, const py::list& views) {
    HybridOptions hybrid_options;
    hybrid_options.nonfinite = NonfinitePolicy::ignore;
    auto hybrid = std::make_unique<HybridOptimizer>(std::vector<RoutedParameter>{}, hybrid_options);
    for (const auto& g : groups) {
      const auto group = py::reinterpret_borrow<py::tuple>(g);
      auto options = default_options_of(group[1].cast<std::string>());
      update_options(*options, py::reinterpret_borrow<py::dict>(group[2]));
      hybrid->add_param_group(
          torch::optim::OptimizerParamGroup(tensors("params", group[0]), std::move(options)));
    }
    for (const auto& item : views) {
      const auto pair = py::reinterpret_borrow<py::tuple>(item);
      hybrid->set_matrix_view(pair[0].cast<at::Tensor>(), pair[1].cast<std::vector<int64_t>>());
    }
    return Engine(std::move(hybrid));
  }

  // Each group's parameters, from param_groups as they are now (HybridOptimizer::replace_params).
  void replace_params(const py::list& lists) {
    std::vector<std::vector<at::Tensor>> params;
    for (const auto& list : lists) params.push_back(tensors("params", list));
    hybrid().replace_params(params);
  }

  // `named`: (name, tensor, module type) triples. `held`: None, or per triple the tensor this
  // process updates in its place (routing reads the triples' tensors: stand-ins of the shapes).
  static Engine from_config(const py::list& named, const std::string& yaml, int64_t total_steps,
                            const py::object& held) {
    torch::PyWarningHandler warnings;  // routing's warning, as a Python UserWarning
    try {
      return from_config_warned(named, yaml, total_steps, held);
    } catch (...) {
      warnings.set_in_exception();
      throw;
    }
  }

 private:
  static Engine from_config_warned(const py::list& named, const std::string& yaml,
                                   int64_t total_steps, const py::object& held) {
    const auto parameters = named_parameters(named);
    const auto config = OptimConfig::from_yaml(yaml);
    auto routes = route(parameters, config.routing);
    if (!held.is_none()) {
      const auto tensors = held.cast<std::vector<at::Tensor>>();
      check(tensors.size() == parameters.size(), "Engine.hybrid: ", tensors.size(),
            " held tensors for ", parameters.size(), " parameters");
      std::map<const void*, at::Tensor> held_for;
      for (size_t i = 0; i < tensors.size(); ++i) {
        held_for[parameters[i].tensor.unsafeGetTensorImpl()] = tensors[i];
      }
      for (auto& r : routes) r.tensor = held_for.at(r.tensor.unsafeGetTensorImpl());
    }
    return Engine(build_optimizer(routes, config, total_steps));
  }

 public:
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

  // Throws (ValueError) for whatever would stop the next step(): settings, parameters and their
  // gradients, as step() checks them before its first write; changes nothing.
  void check_step() const {
    if (hybrid_ != nullptr) return hybrid_->check_step();
    for_each_algorithm([&](auto* tag) {
      using Owner = OwnerOf<std::remove_pointer_t<decltype(tag)>>;
      if (const auto* owner = dynamic_cast<const Owner*>(optimizer_.get())) owner->check_step();
    });
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
    return py::object(std::move(d));
  }

  // Replaces every group's settings and all state. `states` pairs parameters with state dicts
  // ({'step': int or tensor, name: tensor}); parameters not listed start fresh. Everything is
  // checked before anything changes. Returns the state tensors brought to this optimizer's
  // precision (state_dtype changed), one line each.
  std::vector<std::string> load(const py::list& options, const py::list& states) {
    std::vector<std::string> converted;
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
                             ? step_count(where + "['step']", value.cast<at::Tensor>())
                             : integer(where + "['step']", value);
          } else {
            if (!THPVariable_Check(value.ptr()))
              type_error(where + "['" + key + "']", "a tensor", value);
            entry.tensors[key] = value.cast<at::Tensor>();
          }
        }
        for (const auto& line : convert_state_precision(*optimizer_, param, entry, where)) {
          converted.push_back(where + ": " + line);
        }
        check_param_state(*optimizer_, param, entry, where, StateDtypes::stored_or_param);
        entries.emplace_back(param, std::move(entry));
      }
    } catch (...) {
      restore_options(previous);
      throw;
    }
    optimizer_->state().clear();
    for (const auto& [param, entry] : entries) write_param_state(*optimizer_, param, entry);
    return converted;
  }

  HybridOptimizer& hybrid() {
    check(hybrid_ != nullptr, "not a HybridOptimizer");
    return *hybrid_;
  }

  torch::optim::Optimizer& optimizer() { return *optimizer_; }

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

  HybridOptimizer* hybrid_ = nullptr;  // the optimizer, when it is the hybrid (set first)
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
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
    d["algorithm"] =
        r.algorithm.empty() ? py::object(py::none()) : py::object(py::str(r.algorithm));
    d["reason"] = r.reason;
    d["state"] = r.role == Role::frozen ? py::object(py::none())
                                        : py::object(py::str(opt.state_storage(r.name)));
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
  py::class_<Engine> engine(m, "Engine");
  // Engine.<name>(groups) for every registered algorithm: its standalone optimizer.
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    engine.def_static(Algorithm<Options>::name,
                      &Engine::make<OwnerOf<Options>, Options>);
  });
  engine
      .def_static("hybrid", &Engine::from_config, py::arg("named"), py::arg("yaml"),
                  py::arg("total_steps"), py::arg("held") = py::none())
      .def_static("grouped", &Engine::grouped, py::arg("groups"), py::arg("views"))
      .def("replace_params", &Engine::replace_params)
      .def("groups", &Engine::groups)
      .def("settings", &Engine::settings)
      .def("set_options", &Engine::set_options)
      .def("check_step", &Engine::check_step)
      .def("begin_parameter_steps",
           [](Engine& e) { dynamic_cast<ParameterSteps&>(e.optimizer()).begin_parameter_steps(); })
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
      .def("init_state", [](Engine& e) { e.hybrid().init_state(); })
      .def("set_qk_clip_source", &Engine::set_qk_clip_source)
      .def("set_process_group",
           [](Engine& e, const py::object& group, double timeout_s) {
             const auto process_group = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
             const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
             // Without the GIL, as step(): Gloo's worker thread may need it to free a tensor
             // that Python made while it holds the lock this broadcast waits for.
             py::gil_scoped_release release;
             e.hybrid().set_communicator(std::make_shared<Communicator>(process_group, timeout));
           })
      .def("set_partition",
           [](Engine& e, const py::object& group, double timeout_s,
              const std::vector<std::pair<at::Tensor, int>>& owners) {
             const auto process_group = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
             const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
             e.hybrid().set_partition(std::make_shared<Communicator>(process_group, timeout),
                                      owners);
           })
      .def("owns", [](Engine& e, const at::Tensor& param) { return e.hybrid().owns(param); });
}

// (name, role) of each parameter as the configuration's routing sends it, tied ones once.
py::list routed_roles(const py::list& named, const std::string& yaml) {
  torch::PyWarningHandler warnings;  // routing's warning, as a Python UserWarning
  py::list out;
  for (const auto& r : route(named_parameters(named), OptimConfig::from_yaml(yaml).routing)) {
    out.append(py::make_tuple(r.name, to_string(r.role)));
  }
  return out;
}

// A Python callable as a C++ callback of the step inside backward, which runs on autograd's thread
// without the GIL: it takes the GIL to call and to let go of the callable.
std::function<void()> python_callback(py::object f) {
  if (f.is_none()) return nullptr;
  std::shared_ptr<py::object> held(new py::object(std::move(f)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [held] {
    py::gil_scoped_acquire gil;
    (*held)();
  };
}

void bind_step_in_backward(py::module_& m) {
  py::class_<StepInBackward>(m, "StepInBackward")
      .def(py::init([](Engine& engine, int64_t every, py::object before, py::object after) {
             return std::make_unique<StepInBackward>(engine.optimizer(), every,
                                                     python_callback(std::move(before)),
                                                     python_callback(std::move(after)));
           }),
           py::arg("engine"), py::arg("every"), py::arg("before"), py::arg("after"),
           py::keep_alive<1, 2>())  // the engine lives as long as its hooks
      .def("remove", &StepInBackward::remove)
      .def_property_readonly("steps", &StepInBackward::steps)
      .def_property_readonly("seconds", &StepInBackward::seconds);
}

// The collectives of the Python optimizers' data parallelism (muon_cpp/_distributed.py and
// _sharded.py), run here rather than through torch.distributed so that the backend never holds a
// tensor Python made (muon::Communicator says why). Each waits for the group's own timeout without
// the GIL; a failure is a RuntimeError with the backend's reason, which the Python side words.
template <class Collective>
void run_collective(Collective&& collective) {
  py::gil_scoped_release release;
  try {
    collective();
  } catch (const DistributedError& e) {
    throw std::runtime_error(e.reason());
  }
}

void bind_collectives(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Collectives")
      .def(py::init([](const py::object& group) {
        return std::make_shared<Communicator>(group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>(),
                                              Communicator::Duration(0));
      }))
      // The group Communicator makes itself from torchrun's variables (NCCL on a CUDA build with a
      // GPU), as `muon train --nproc` does: scripts/gpu_check.sh runs it on one GPU.
      .def_static("from_environment",
                  [] { return Communicator::from_environment(Communicator::Duration(60000)); })
      .def("all_reduce_sum", [](Communicator& c, at::Tensor tensor) {
        run_collective([&] { c.all_reduce(tensor, ReduceOp::sum); });
      })
      .def_property_readonly("device", [](const Communicator& c) { return py::cast(c.device()); })
      .def("broadcast", [](Communicator& c, at::Tensor tensor,
                           int root) { run_collective([&] { c.broadcast(tensor, root); }); })
      .def("all_gather",
           [](Communicator& c, const at::Tensor& shard, at::Tensor flat) {
             run_collective([&] { c.all_gather(shard, flat).wait(); });
           })
      .def("gather", [](Communicator& c, const at::Tensor& sent, std::vector<at::Tensor> parts,
                        int root) { run_collective([&] { c.gather(sent, parts, root); }); })
      .def("scatter", [](Communicator& c, at::Tensor received, std::vector<at::Tensor> parts,
                         int root) { run_collective([&] { c.scatter(received, parts, root); }); });
}

at::Tensor orthogonalize_binding(const at::Tensor& x, py::object table, py::handle steps,
                                 const std::string& method, py::object dtype_or_none,
                                 py::handle gram_restarts) {
  OrthogonalizeOptions o;
  o.steps(integer("steps", steps)).coefficients(coefficients("coefficients", table));
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
  bind_step_in_backward(m);
  bind_collectives(m);
  m.def("orthogonalize", &orthogonalize_binding, py::arg("x"), py::arg("coefficients"),
        py::arg("steps"), py::arg("method"), py::arg("dtype"), py::arg("gram_restarts"));
  m.def("orthogonality_error", &muon::orthogonality_error, py::arg("x"));
  m.def(
      "stochastic_round_bf16",
      [](const at::Tensor& x, uint32_t seed, bool generic) {
        return generic ? muon::sr::round_to_bf16_generic(x, seed) : muon::sr::round_to_bf16(x, seed);
      },
      py::arg("x"), py::arg("seed"), py::arg("generic") = false,
      "fp32 → bfloat16 by the bf16 state's stochastic rounding (muon/stochastic_rounding.h): the "
      "device's own path, or (generic) the ATen-only form other devices run. For tests.");
  m.def("takes_int8_state", [](const std::vector<int64_t>& shape) { return muon::q8::quantizes(shape); },
        "Whether a parameter of this shape keeps int8 state when its group asks for it.");
  m.def("blas_backend", &muon::blas_backend,
        "What the CPU float32 Newton–Schulz products run on, and why.");
  m.def("bf16_products", &muon::bf16_products,
        "Where the CPU bfloat16 Newton–Schulz products run (LibTorch's oneDNN or the linked one).");
  m.def("routed_roles", &routed_roles, py::arg("named"), py::arg("yaml"));
  m.def("optimizer_keys", &muon::optimizer_keys,
        "Every key of a configuration's optimizer section, sorted (HybridOptimizer's keywords).");
  m.def("with_optimizer_keys", &muon::with_optimizer_keys, py::arg("yaml"), py::arg("keys"),
        "The configuration with the mapping `keys` (YAML or JSON) merged into its optimizer "
        "section; a key set both ways is an error.");
  m.def(
      "coefficient_table",
      [](py::handle table) {
        const auto t = coefficients("coefficients", table);
        py::list rows;
        for (const auto& r : t.rows) rows.append(py::make_tuple(r[0], r[1], r[2]));
        return py::dict(py::arg("name") = t.name, py::arg("rows") = rows,
                        py::arg("safety") = t.safety, py::arg("eps") = t.eps);
      },
      py::arg("coefficients"),
      "A coefficient table (a name or rows [[a, b, c], ...]) as a dict: name, rows, safety, eps.");
  m.def("coefficient_table_names", &muon::CoefficientTable::names,
        "The names of the coefficient tables, comma-separated, in the docs' order.");
  m.def(
      "owner_plan",
      [](const std::vector<std::pair<std::vector<int64_t>, bool>>& tensors, int world) {
        std::vector<muon::OwnedTensor> items;
        for (const auto& [shape, matrix] : tensors) items.push_back({shape, matrix});
        return muon::owner_plan(items, world);
      },
      py::arg("tensors"), py::arg("world"),
      "The rank that owns each (shape, is_matrix) among `world` ranks (muon/distributed.h): the "
      "plan of the hybrid's data parallelism.");
  m.def(
      "muon_presets",
      [] {
        py::list out;
        for (const auto& p : muon::muon_presets()) {
          out.append(py::make_tuple(p.name, p.origin, muon::algorithm_name(*p.options),
                                    options_to_dict(*p.options)));
        }
        return out;
      },
      "The presets of the matrices' settings (muon/presets.h): (name, origin, algorithm, settings "
      "as a param group holds them) tuples, in the table's order.");
  m.def(
      "algorithms",
      [] {
        py::list out;
        muon::for_each_algorithm([&](auto* tag) {
          using Options = std::remove_pointer_t<decltype(tag)>;
          using Entry = muon::Algorithm<Options>;
          out.append(py::make_tuple(Entry::name, Entry::kind == muon::ParamKind::matrices));
        });
        return out;
      },
      "The registered algorithms (muon/algorithms.h), in order: (name, updates matrices only).");
  m.def("option_schema", &option_schema, py::arg("algorithm"),
        "The options of a registered algorithm, by name (muon, adamw, ...): (name, default, doc, "
        "range) tuples.");
  m.def(
      "config_schema",
      [](const std::string& section) {
        py::list rows;
        for (const auto& r : muon::config_schema(section)) {
          rows.append(py::make_tuple(r.key, r.alias, r.default_yaml, r.doc, r.range, r.kinds));
        }
        return rows;
      },
      py::arg("section"),
      "The keys of a YAML config section (optimizer, shorthand, an algorithm's: muon, adamw, "
      "lion, ..., schedule, schedule.tail, momentum_schedule, param_group): (key, alias, default "
      "as YAML, doc, range, kinds) tuples.");
}
