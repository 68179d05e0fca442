// A run's metrics.csv and metrics.jsonl: one row per log interval, appended and flushed as it is
// logged, so an interrupted run keeps every row it printed.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace muon::cli {

// Set by name: a default-made row is the one before any update (no loss, rate or norm yet).
struct MetricsRow {
  int64_t step = 0;         // updates done (0: the validation loss before training)
  double train_loss = NAN;  // mean over the steps since the last row (NaN at step 0)
  std::optional<double> val_loss;
  double muon_lr = NAN;      // the first Muon group's rate at this step (NaN without Muon)
  double adamw_lr = NAN;     // the first non-Muon group's: AdamW's or the others' (NaN without one)
  double grad_norm = NAN;    // the last step's global gradient norm, before clipping (NaN at step 0)
  double clip_factor = 1.0;  // what clipping multiplied the gradients by (1: none)
  double tokens_per_s = 0.0;
  double elapsed_s = 0.0;
};

// The CSV header: step,train_loss,val_loss,muon_lr,adamw_lr,grad_norm,clip_factor,tokens_per_s,
// elapsed_s (an empty cell: none).
extern const char* const kMetricsHeader;

// Writes `path` through a temporary file and a rename: a reader (or a second Ctrl-C) never sees
// half a file.
void write_atomically(const std::filesystem::path& path, const std::string& content);

class MetricsLog {
 public:
  // The files in `dir`: fresh (a header only), or continuing the run in `from` (its rows up to
  // step `upto` kept, copied over when `from` is another directory). Nothing is written here.
  MetricsLog(std::filesystem::path dir, const std::optional<std::filesystem::path>& from,
             int64_t upto);
  // Writes the kept rows (through a temporary file and a rename) and opens both files for append.
  void open();
  void append(const MetricsRow& row);  // to both files, flushed
  const std::vector<MetricsRow>& rows() const { return rows_; }

 private:
  std::filesystem::path dir_;
  std::vector<MetricsRow> rows_;
  std::ofstream csv_, jsonl_;
};

}  // namespace muon::cli
