#include "values.h"

#include "muon/dtypes.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include "muon/adam.h"
#include "muon/algorithms.h"
#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/muon.h"
#include "muon/normalization.h"

namespace muon::python {

namespace {

// repr(v), shortened: an int of 400 digits is named by its length.
std::string short_repr(py::handle v) {
  const auto text = py::repr(v).cast<std::string>();
  if (text.size() <= 40) return text;
  return text.substr(0, 12) + "... (" + std::to_string(text.size()) + " characters)";
}

}  // namespace

[[noreturn]] void type_error(const std::string& key, const std::string& expected, py::handle v) {
  throw py::type_error(key + " must be " + expected + ", got " +
                       py::str(py::type::of(v).attr("__name__")).cast<std::string>() + " " +
                       short_repr(v));
}

double number(const std::string& key, py::handle v) {
  // bool is an int to Python but never a rate; a 0-d tensor or numpy scalar is fine.
  if (py::isinstance<py::bool_>(v) || py::isinstance<py::str>(v) || !PyNumber_Check(v.ptr())) {
    type_error(key, "a number", v);
  }
  PyObject* as_float = PyNumber_Float(v.ptr());
  if (as_float == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw py::error_already_set();
    PyErr_Clear();  // an int beyond a double's range: named as the setting's error
    throw py::value_error(key + " must be a number a float holds (|x| < 1.8e308), got " +
                          short_repr(v));
  }
  const double value = PyFloat_AsDouble(as_float);
  Py_DECREF(as_float);
  return value;
}

int64_t integer(const std::string& key, py::handle v) {
  if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v)) type_error(key, "an int", v);
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0) {
    throw py::value_error(key + " must be an int that fits 64 bits, got " + short_repr(v));
  }
  return value;
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
  if (py::isinstance<py::str>(v)) {  // a state dtype by name: "float32", "bfloat16", "int8"
    const auto named = state_dtype_named(v.cast<std::string>());
    if (!named) {
      throw py::value_error(key + ": expected " + kStateDtypeChoices + " (or a torch.dtype), got '" +
                            v.cast<std::string>() + "'");
    }
    return *named;
  }
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
  return py::object(std::move(rows));  // explicit: a list converts implicitly by move only in C++20
}

// ---- one Python form per option type: to_python(value) and from_python(key, object, value) ----

template <class E>
using has_enum_names = decltype(EnumNames<E>::table);

py::object to_python(double v) {
  return py::float_(v);
}
py::object to_python(bool v) {
  return py::bool_(v);
}
py::object to_python(int64_t v) {
  return py::int_(v);
}
py::object to_python(const CoefficientTable& v) {
  return coefficients_object(v);
}
py::object to_python(at::ScalarType v) {
  return dtype_object(v);
}
py::object to_python(const Betas& v) {
  return py::make_tuple(std::get<0>(v), std::get<1>(v));
}
py::object to_python(const std::vector<int64_t>& v) {
  return py::tuple(py::cast(v));
}
py::object to_python(const NorMuonOptions& v) {
  return py::dict(py::arg("beta2") = v.beta2, py::arg("axis") = to_string(v.axis));
}
template <class E, class = has_enum_names<E>>
py::object to_python(E v) {
  return py::str(enum_name(v));
}
template <class T>
py::object to_python(const std::optional<T>& v) {
  return v ? to_python(*v) : py::object(py::none());
}

void from_python(const std::string& k, py::handle v, double& out) {
  out = number(k, v);
}
void from_python(const std::string& k, py::handle v, bool& out) {
  out = boolean(k, v);
}
void from_python(const std::string& k, py::handle v, int64_t& out) {
  out = integer(k, v);
}
void from_python(const std::string& k, py::handle v, CoefficientTable& out) {
  out = coefficients(k, v);
}
void from_python(const std::string& k, py::handle v, at::ScalarType& out) {
  out = dtype(k, v);
}
void from_python(const std::string& k, py::handle v, Betas& out) {
  out = betas(k, v);
}
void from_python(const std::string& k, py::handle v, std::vector<int64_t>& out) {
  out = integers(k, v);
}
void from_python(const std::string& k, py::handle v, NorMuonOptions& out) {
  if (!py::isinstance<py::dict>(v)) type_error(k, "None or a dict(beta2=..., axis=...)", v);
  out = NorMuonOptions{};
  for (const auto& item : py::reinterpret_borrow<py::dict>(v)) {
    const auto name = text(k + " key", item.first);
    if (name == "beta2") {
      out.beta2 = number(k + "['beta2']", item.second);
    } else if (name == "axis") {
      out.axis = normuon_axis_from_string(text(k + "['axis']", item.second));
    } else {
      throw Error(k + ": unknown key '" + name + "'; valid keys are beta2, axis");
    }
  }
}
template <class E, class = has_enum_names<E>>
void from_python(const std::string& k, py::handle v, E& out) {
  out = enum_from_name<E>(text(k, v));
}
void from_python(const std::string& k, py::handle v, std::optional<bool>& out) {
  out = optional_boolean(k, v);
}
template <class T>
void from_python(const std::string& k, py::handle v, std::optional<T>& out) {
  if (v.is_none()) {
    out = std::nullopt;
    return;
  }
  T value{};
  if (out) value = *out;
  from_python(k, v, value);
  out = std::move(value);
}

// ---- options ↔ dicts: the keys of a param_groups entry are the schema's option names ----

template <class Options>
py::dict to_dict(const Options& o) {
  py::dict d;
  visit_options(
      o, [&](const OptionInfo& info, const auto& value) { d[info.name] = to_python(value); });
  return d;
}

// A missing key keeps the current setting; a value of the wrong type is a TypeError naming it, a
// value out of its domain (an unknown table or mode) a ValueError naming it.
template <class Options>
void update(Options& o, const py::dict& d) {
  visit_options(o, [&](const OptionInfo& info, auto& value) {
    if (!d.contains(info.name)) return;
    try {
      from_python(info.name, d[info.name], value);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind(info.name, 0) == 0) throw;
      throw Error(std::string(info.name) + ": " + what);
    }
  });
}

template <class Options>
py::list schema_of() {
  py::list out;
  const Options defaults;
  visit_options(defaults, [&](const OptionInfo& info, const auto& value) {
    out.append(py::make_tuple(info.name, to_python(value), info.doc, range_text(info.range)));
  });
  return out;
}

// Dispatch on the options' type (which is the algorithm tag): the registry's one dispatch.
py::dict options_to_dict(const torch::optim::OptimizerOptions& o) {
  return visit_algorithm(o, [](const auto& options) { return to_dict(options); });
}

void update_options(torch::optim::OptimizerOptions& o, const py::dict& d) {
  visit_algorithm(o, [&](auto& options) { update(options, d); });
}

std::string algorithm_of(const torch::optim::OptimizerOptions& o) {
  return algorithm_name(o);
}

std::vector<at::Tensor> tensors(const std::string& key, py::handle v) {
  std::vector<at::Tensor> out;
  for (const auto& item : py::reinterpret_borrow<py::sequence>(v)) {
    if (!THPVariable_Check(item.ptr())) type_error(key, "a list of tensors", item);
    out.push_back(item.cast<at::Tensor>());
  }
  return out;
}

py::list option_schema(const std::string& algorithm) {
  py::list out;
  bool found = false;
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    if (algorithm != Algorithm<Options>::name) return;
    out = schema_of<Options>();
    found = true;
  });
  check(found, "option_schema: unknown algorithm '", algorithm, "'; valid algorithms are ",
        algorithm_names_text());
  return out;
}

}  // namespace muon::python
