#include "training/metrics.h"

#include <cmath>
#include <sstream>

#include "muon/error.h"
#include "muon/internal/number_text.h"

namespace muon::cli {

const char* const kMetricsHeader =
    "step,train_loss,val_loss,muon_lr,adamw_lr,grad_norm,clip_factor,tokens_per_s,elapsed_s";

namespace {

namespace fs = std::filesystem;

std::string cell(double v) {  // exact; NaN (none) is empty
  return std::isnan(v) ? "" : detail::shortest_text(v);
}
std::string json_number(double v) {
  return std::isfinite(v) ? detail::shortest_text(v) : "null";
}

std::string csv_line(const MetricsRow& r) {
  std::ostringstream out;
  out << r.step << ',' << cell(r.train_loss) << ',' << cell(r.val_loss.value_or(NAN)) << ','
      << cell(r.muon_lr) << ',' << cell(r.adamw_lr) << ',' << cell(r.grad_norm) << ','
      << cell(r.clip_factor) << ',' << cell(r.tokens_per_s) << ',' << cell(r.elapsed_s) << '\n';
  return out.str();
}

std::string json_line(const MetricsRow& r) {
  std::ostringstream out;
  out << "{\"step\": " << r.step << ", \"train_loss\": " << json_number(r.train_loss)
      << ", \"val_loss\": " << json_number(r.val_loss.value_or(NAN))
      << ", \"muon_lr\": " << json_number(r.muon_lr)
      << ", \"adamw_lr\": " << json_number(r.adamw_lr)
      << ", \"grad_norm\": " << json_number(r.grad_norm)
      << ", \"clip_factor\": " << json_number(r.clip_factor)
      << ", \"tokens_per_s\": " << json_number(r.tokens_per_s)
      << ", \"elapsed_s\": " << json_number(r.elapsed_s) << "}\n";
  return out.str();
}

double parse_cell(const std::string& text, const std::string& where) {
  if (text.empty()) return NAN;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  check(end != nullptr && *end == '\0', where, ": '", text, "' is not a number");
  return v;
}

// The rows of `path` (a metrics.csv this program wrote) up to step `upto`.
std::vector<MetricsRow> read_rows(const fs::path& path, int64_t upto) {
  std::ifstream file(path);
  check(file.good(), "train: cannot read '", path.string(), "' to continue it");
  std::string line;
  std::getline(file, line);
  check(line == kMetricsHeader, "train: '", path.string(),
        "' is not a metrics file of this version (header '", line, "')");
  std::vector<MetricsRow> rows;
  for (int number = 2; std::getline(file, line); ++number) {
    const auto where = path.string() + " line " + std::to_string(number);
    std::vector<std::string> cells;
    std::stringstream split(line);
    for (std::string c; std::getline(split, c, ',');) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    check(cells.size() == 9, where, ": expected 9 cells, got ", cells.size());
    MetricsRow r;
    r.step = static_cast<int64_t>(parse_cell(cells[0], where));
    if (r.step > upto) break;
    r.train_loss = parse_cell(cells[1], where);
    const double val = parse_cell(cells[2], where);
    if (!std::isnan(val)) r.val_loss = val;
    r.muon_lr = parse_cell(cells[3], where);
    r.adamw_lr = parse_cell(cells[4], where);
    r.grad_norm = parse_cell(cells[5], where);
    r.clip_factor = parse_cell(cells[6], where);
    r.tokens_per_s = parse_cell(cells[7], where);
    r.elapsed_s = parse_cell(cells[8], where);
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

void write_atomically(const fs::path& path, const std::string& content) {
  const auto temporary = fs::path(path.string() + ".tmp");
  {
    std::ofstream file(temporary);
    file << content;
    check(file.good(), "cannot write '", temporary.string(), "'");
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    const auto why = error.message();
    fs::remove(temporary, error);
    throw Error("cannot write '" + path.string() + "': " + why);
  }
}

MetricsLog::MetricsLog(fs::path dir, const std::optional<fs::path>& from, int64_t upto)
    : dir_(std::move(dir)) {
  if (from) rows_ = read_rows(*from / "metrics.csv", upto);
}

void MetricsLog::open() {
  std::string csv = std::string(kMetricsHeader) + "\n", jsonl;
  for (const auto& r : rows_) {
    csv += csv_line(r);
    jsonl += json_line(r);
  }
  write_atomically(dir_ / "metrics.csv", csv);
  write_atomically(dir_ / "metrics.jsonl", jsonl);
  csv_.open(dir_ / "metrics.csv", std::ios::app);
  jsonl_.open(dir_ / "metrics.jsonl", std::ios::app);
  check(csv_.good() && jsonl_.good(), "train: cannot append to the metrics in '", dir_.string(),
        "'");
}

void MetricsLog::append(const MetricsRow& row) {
  rows_.push_back(row);
  csv_ << csv_line(row) << std::flush;
  jsonl_ << json_line(row) << std::flush;
}

}  // namespace muon::cli
