// The coefficient tables of the Newton–Schulz iteration: each named table's rows (with where they
// come from), the one list of names, and the lookup by name (docs/algorithms.md §Orthogonalization).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "muon/error.h"
#include "muon/orthogonalize.h"

namespace muon {

CoefficientTable CoefficientTable::quintic() {
  // Keller Jordan, "Muon: An optimizer for hidden layers" (2024): one quintic reused every step.
  return {"quintic", {{3.4445, -4.7750, 2.0315}}, 1.0, 0.0, /*gram_restart_interval=*/3};
}

CoefficientTable CoefficientTable::polar_express() {
  // Amsel, Persson, Musco, Gower, "The Polar Express" (arXiv 2505.16932), rows as nanochat uses
  // them; the 1.01 safety pairs with the rows' own 2e-2 safety margin.
  return {"polar_express",
          {{8.156554524902461, -22.48329292557795, 15.878769915207462},
           {4.042929935166739, -2.808917465908714, 0.5000178451051316},
           {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
           {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
           {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}},
          1.01,
          0.0};
}

CoefficientTable CoefficientTable::dion() {
  // Ahn et al., "Dion" (arXiv 2504.05295); optax's `dion` preset.
  return {"dion",
          {{4.0848, -6.8946, 2.9270},
           {3.9505, -6.3029, 2.6377},
           {3.7418, -5.5913, 2.3037},
           {2.8769, -3.1427, 1.2046},
           {2.8366, -3.0525, 1.2012}},
          1.0,
          0.0};
}

// The next four are the tables NVIDIA's Emerging-Optimizers offers beyond these
// (orthogonalized_optimizers/muon_utils.py), normalized as it does: x / ‖x‖_F, no safety factor.
CoefficientTable CoefficientTable::cans() {
  // Grishina et al., "Accelerating Newton–Schulz iterations for orthogonalization via
  // Chebyshev-type polynomials" (CANS, arXiv 2506.10935).
  return {"cans",
          {{8.4703, -25.1081, 18.6293},
           {4.1828, -3.1087, 0.5806},
           {3.9619, -2.9541, 0.5630},
           {3.2866, -2.4647, 0.5074},
           {2.2737, -1.6447, 0.4162}},
          1.0,
          0.0};
}

CoefficientTable CoefficientTable::aol() {
  // The 4 rows of thib-s/flash-newton-schulz tuned for its AOL-rescaled input (arXiv 2208.03160);
  // Emerging-Optimizers uses them after plain Frobenius normalization, as here.
  return {"aol",
          {{4.0098, -7.0585, 2.4635},
           {3.4585, -5.5479, 2.5959},
           {2.7573, -3.2939, 1.4254},
           {2.7215, -3.0494, 1.3169}},
          1.0,
          0.0};
}

CoefficientTable CoefficientTable::cubic5() {
  // Five cubic steps (c = 0), tuned for a smallest singular value of 7e-3 (arXiv 2606.00371).
  return {"cubic5",
          {{3.3656576, -3.3420992, 0.0},
           {2.5744352, -1.4957376, 0.0},
           {2.5368962, -1.4312570, 0.0},
           {2.4418906, -1.2764040, 0.0},
           {2.2230472, -0.9630650, 0.0}},
          1.0,
          0.0};
}

CoefficientTable CoefficientTable::deepseekv4() {
  // DeepSeek-V4's 10 iterations: the quintic 8 times, then 2 steps of (2, −1.5, 0.5), whose fixed
  // point at 1 is stable, to settle the singular values there.
  std::vector<Coefficients> rows(8, {3.4445, -4.7750, 2.0315});
  rows.insert(rows.end(), 2, {2.0, -1.5, 0.5});
  return {"deepseekv4", std::move(rows), 1.0, 0.0};
}

CoefficientTable CoefficientTable::custom(std::vector<Coefficients> rows, double safety,
                                          double eps) {
  return {"custom", std::move(rows), safety, eps};
}

namespace {

// The named tables, in the order docs/algorithms.md lists them: the one list that by_name, names()
// and through them the errors, the option's documentation and Python read.
const std::vector<CoefficientTable>& named_tables() {
  static const std::vector<CoefficientTable> tables{
      CoefficientTable::quintic(),   CoefficientTable::polar_express(), CoefficientTable::dion(),
      CoefficientTable::cans(),      CoefficientTable::aol(),           CoefficientTable::cubic5(),
      CoefficientTable::deepseekv4()};
  return tables;
}

}  // namespace

const std::string& CoefficientTable::names() {
  static const std::string names = [] {
    std::string out;
    for (const auto& table : named_tables()) out += (out.empty() ? "" : ", ") + table.name;
    return out;
  }();
  return names;
}

CoefficientTable CoefficientTable::by_name(const std::string& name) {
  for (const auto& table : named_tables()) {
    if (table.name == name) return table;
  }
  throw Error("unknown coefficient table '" + name + "'; valid tables are " + names() +
              " (or a list of [a, b, c] rows)");
}

const char* coefficients_option_doc() {
  static const std::string doc =
      "the iterations' polynomial: " + CoefficientTable::names() + " or rows [a, b, c]";
  return doc.c_str();
}

const Coefficients& CoefficientTable::row(int64_t k) const {
  const auto last = static_cast<int64_t>(rows.size()) - 1;
  return rows.at(static_cast<size_t>(std::min(k, last)));
}

bool operator==(const CoefficientTable& a, const CoefficientTable& b) {
  return a.name == b.name && a.rows == b.rows && a.safety == b.safety && a.eps == b.eps &&
         a.gram_restart_interval == b.gram_restart_interval;
}

}  // namespace muon
