// `muon bench`: the report as JSON, and the comparison of two runs' OpenBLAS environments.
#include <cstdio>
#include <sstream>
#include <string>

#include "bench/bench.h"

namespace muon::cli {

namespace {

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The number after `"key": ` at or after `from` in JSON this file wrote (0 when absent).
double number_after(const std::string& json, const std::string& key, size_t from = 0) {
  const auto at = json.find("\"" + key + "\": ", from);
  return at == std::string::npos ? 0.0 : std::atof(json.c_str() + at + key.size() + 4);
}

}  // namespace

std::string BenchReport::to_json() const {
  std::ostringstream out;
  out.precision(6);
  out << "{\n  \"threads\": " << threads << ",\n  \"cpu\": " << quoted(cpu)
      << ",\n  \"openblas_env\": " << quoted(openblas_env)
      << ",\n  \"products\": " << quoted(products)
      << ",\n  \"bf16_products\": " << quoted(bf16_products) << ",\n  \"gemms\": [";
  for (size_t i = 0; i < gemms.size(); ++i) {
    out << (i ? ", " : "") << "{\"name\": " << quoted(gemms[i].name)
        << ", \"kernels\": " << quoted(gemms[i].kernels)
        << ", \"bf16\": " << (gemms[i].bf16 ? "true" : "false")
        << ", \"gflops\": " << gemms[i].gflops << "}";
  }
  out << "],\n  \"gemm_gflops\": " << gemm_gflops << ",\n  \"bf16_gflops\": " << bf16_gflops
      << ",\n  \"copy_gbs\": " << copy_gbs << ",\n  \"update_gbs\": " << update_gbs
      << ",\n  \"orthogonalization\": [";
  for (size_t i = 0; i < orthogonalization.size(); ++i) {
    const auto& r = orthogonalization[i];
    out << (i ? "," : "") << "\n    {\"rows\": " << r.rows << ", \"cols\": " << r.cols
        << ", \"method\": \"" << r.method << "\", \"ms\": " << r.ms << ", \"gflops\": " << r.gflops
        << ", \"gemm_gflops\": " << r.gemm_gflops << ", \"of_gemm\": " << r.of_gemm
        << ", \"of_bf16_gemm\": " << r.of_bf16_gemm
        << ", \"orth_err\": " << r.orth_err << ", \"vs_plain\": " << r.vs_plain << "}";
  }
  out << "\n  ],\n  \"muon_step\": {\"matrices\": " << muon_step.matrices
      << ", \"parameters\": " << muon_step.parameters << ", \"plain_ms\": " << muon_step.plain_ms
      << ", \"ours_ms\": " << muon_step.ours_ms << ", \"speedup\": " << muon_step.speedup
      << ", \"max_rel_diff\": " << muon_step.max_rel_diff << ", \"bf16_ms\": " << muon_step.bf16_ms
      << ", \"bf16_speedup\": " << muon_step.bf16_speedup
      << ", \"bf16_max_rel_diff\": " << muon_step.bf16_max_rel_diff
      << ", \"dion_ms\": " << muon_step.dion_ms
      << ", \"dion_quarter_ms\": " << muon_step.dion_quarter_ms
      << "},\n  \"adamw_parameters\": " << adamw_parameters
      << ",\n  \"adamw_stream_gbs\": " << adamw_stream_gbs << ",\n  \"adamw\": [";
  for (size_t i = 0; i < adamw.size(); ++i) {
    const auto& r = adamw[i];
    out << (i ? "," : "") << "\n    {\"name\": \"" << r.name << "\", \"ms\": " << r.ms
        << ", \"speedup\": " << r.speedup << ", \"gbs\": " << r.gbs
        << ", \"of_bandwidth\": " << r.of_bandwidth
        << ", \"state_bytes_per_param\": " << r.state_bytes_per_param
        << ", \"peak_extra_mib\": " << r.peak_extra_mib << "}";
  }
  const auto& d = distributed;
  out << "\n  ],\n  \"distributed\": {\"parameters\": " << d.parameters
      << ", \"one_rank_ms\": " << d.one_rank_ms << ", \"per_rank_ms\": " << d.per_rank_ms
      << ", \"speedup\": " << d.speedup << ", \"bytes_per_step\": " << d.bytes_per_step
      << ", \"minimum_bytes\": " << d.minimum_bytes << ", \"bytes_ratio\": " << d.bytes_ratio
      << ", \"max_rel_diff\": " << d.max_rel_diff << "},\n  \"load\": {\"steps\": " << load.steps
      << ", \"quiet_median_ms\": " << load.quiet_median_ms
      << ", \"quiet_max_ms\": " << load.quiet_max_ms
      << ", \"loaded_median_ms\": " << load.loaded_median_ms
      << ", \"loaded_max_ms\": " << load.loaded_max_ms
      << ", \"bf16_quiet_median_ms\": " << load.bf16_quiet_median_ms
      << ", \"bf16_quiet_max_ms\": " << load.bf16_quiet_max_ms
      << ", \"bf16_loaded_median_ms\": " << load.bf16_loaded_median_ms
      << ", \"bf16_loaded_max_ms\": " << load.bf16_loaded_max_ms
      << ", \"plain_loaded_median_ms\": " << load.plain_loaded_median_ms
      << ", \"plain_loaded_max_ms\": " << load.plain_loaded_max_ms << "}\n}\n";
  return out.str();
}

void compare_openblas_settings(const BenchReport& as_set, const std::string& unset_json,
                               std::ostream& log) {
  log << "\n## OpenBLAS as this environment sets it (" << as_set.openblas_env
      << ") and at its own choice (unset)\n\n| figure | as set | unset |\n|---|---|---|\n";
  char line[256];
  std::snprintf(line, sizeof line, "| best fp32 GEMM, GFLOP/s | %.1f | %.1f |\n",
                as_set.gemm_gflops, number_after(unset_json, "gemm_gflops"));
  log << line;
  for (const auto& g : as_set.gemms) {
    const auto at = unset_json.find("\"name\": " + quoted(g.name));
    std::snprintf(line, sizeof line, "| %s GEMM, GFLOP/s | %.1f | %.1f |\n", g.name.c_str(),
                  g.gflops, at == std::string::npos ? 0.0 : number_after(unset_json, "gflops", at));
    log << line;
  }
  // Rows in the same order in both runs.
  size_t at = unset_json.find("\"orthogonalization\"");
  for (const auto& r : as_set.orthogonalization) {
    at = unset_json.find("\"of_gemm\": ", at);
    if (at == std::string::npos) break;
    std::snprintf(line, sizeof line, "| %lldx%lld %s, of the best GEMM rate | %.2f | %.2f |\n",
                  static_cast<long long>(r.rows), static_cast<long long>(r.cols), r.method.c_str(),
                  r.of_gemm, number_after(unset_json, "of_gemm", at));
    log << line;
    ++at;
  }
  if (as_set.muon_step.ours_ms > 0) {
    const double plain_unset = number_after(unset_json, "plain_ms");
    const double ours_unset = number_after(unset_json, "ours_ms");
    const double plain_best = plain_unset > 0 ? std::min(as_set.muon_step.plain_ms, plain_unset)
                                              : as_set.muon_step.plain_ms;
    std::snprintf(
        line, sizeof line,
        "| Muon step, ms: ours / plain ATen | %.0f / %.0f | %.0f / %.0f |\n"
        "| Muon step speed-up against plain ATen at its best (%.0f ms) | %.2fx | %.2fx |\n",
        as_set.muon_step.ours_ms, as_set.muon_step.plain_ms, ours_unset, plain_unset, plain_best,
        plain_best / as_set.muon_step.ours_ms, ours_unset > 0 ? plain_best / ours_unset : 0.0);
    log << line;
  }
  log << std::flush;
}

}  // namespace muon::cli
