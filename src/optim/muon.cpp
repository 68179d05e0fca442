#include "muon/muon.h"

#include <algorithm>
#include <cmath>

#include "matrix_optimizer.h"
#include "muon/error.h"
#include "state_precision.h"

namespace muon {

double shape_factor(AdjustLr mode, int64_t rows, int64_t cols) {
  const auto r = static_cast<double>(rows);
  const auto c = static_cast<double>(cols);
  switch (mode) {
    case AdjustLr::original:
      return std::sqrt(std::max(1.0, r / c));
    case AdjustLr::match_rms_adamw:
      return 0.2 * std::sqrt(std::max(r, c));
    case AdjustLr::spectral:
      return std::sqrt(r / c);
    case AdjustLr::none:
      return 1.0;
  }
  throw Error("unknown adjust_lr mode");
}

void check_options(const MuonOptions& o) {
  check_ranges("Muon", o);
  detail::check_state_dtype("Muon", o.state_dtype());
  if (o.normuon()) {
    check(o.normuon()->beta2 >= 0 && o.normuon()->beta2 < 1,
          "Muon: normuon beta2 must be in [0, 1), got ", o.normuon()->beta2);
  }
  check(!(o.num_heads() && o.split_sizes()),
        "Muon: num_heads and split_sizes both split the rows; set one of them");
  if (o.split_sizes()) {
    const auto& sizes = *o.split_sizes();
    check(!sizes.empty() && std::all_of(sizes.begin(), sizes.end(), [](int64_t n) { return n > 0; }),
          "Muon: split_sizes must be row counts > 0, got ", at::IntArrayRef(sizes));
  }
  check(!(o.normuon() && (o.num_heads() || o.split_sizes())),
        "Muon: normuon keeps statistics of whole matrices; it cannot be combined with num_heads "
        "or split_sizes");
  check(!(o.cautious_weight_decay() && o.weight_decay_method() == WeightDecayMethod::l2),
        "Muon: cautious_weight_decay needs a multiplicative weight_decay_method (decoupled, "
        "independent or palm); l2 adds its decay to the gradient instead");
  check_options(orthogonalize_options(o, 1, 1), kMuonOrthogonalizeNames);
  if (const auto& gram = o.gram_coefficients()) {
    check(!gram->rows.empty() && gram->rows.size() <= 1000,
          "Muon: gram_coefficients must have 1 to 1000 rows [a, b, c] (one per iteration), got ",
          gram->rows.size());
    for (const auto& row : gram->rows) {
      check(std::isfinite(row[0]) && std::isfinite(row[1]) && std::isfinite(row[2]),
            "Muon: gram_coefficients has a non-finite coefficient");
    }
  }
}

void check_matrix_view(const at::Tensor& param, const std::vector<int64_t>& view,
                       const std::string& who) {
  check(view.size() >= 2, who, ": a view needs (batch..., rows, cols), got ",
        at::IntArrayRef(view));
  int64_t numel = 1;
  for (auto d : view) {
    check(d > 0, who, ": view ", at::IntArrayRef(view), " has a non-positive dim");
    numel *= d;
  }
  check(numel == param.numel(), who, ": view ", at::IntArrayRef(view), " holds ", numel,
        " elements, the parameter of shape ", param.sizes(), " ", param.numel());
}

void check_muon_param(const at::Tensor& p, const std::string& name, const char* who) {
  check(!p.is_complex(), who, ": ", name, " is complex (", p.scalar_type(), "); ", who,
        " supports real floating-point matrices only");
  check(p.is_floating_point(), who, ": ", name, " has dtype ", p.scalar_type(), "; ", who,
        " needs a floating-point matrix (float32, float64, bfloat16 or float16)");
  check(p.dim() >= 2, who, ": ", name, " has shape ", p.sizes(), "; ", who,
        " optimizes matrices (out, in), or stacks of them — give vectors and scalars to AdamW");
}

template class MatrixOptimizer<MuonOptions>;

}  // namespace muon
