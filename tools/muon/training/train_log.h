// What muon train prints and draws (train_log.cpp), beside train.h's printable() and LossMonitor.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "training/metrics.h"
#include "training/train.h"

namespace muon::cli {

// The SVG chart of the train and validation losses of `rows`.
std::string loss_chart(const std::vector<MetricsRow>& rows);

// One terminal line redrawn in place: [#####.....] step | loss | elapsed / ETA.
void draw_progress(std::ostream& log, int64_t done, int64_t last, double loss, double elapsed,
                   int64_t first_step);

// The log line of one metrics row: step, losses, each algorithm's rate (`others` names the
// algorithm of the non-Muon parameters: "adamw", "lion", ...), the gradient norm, throughput and
// time.
std::string progress_line(const MetricsRow& row, int64_t steps, int64_t steps_here,
                          double seconds_here, const std::string& others = "adamw");

}  // namespace muon::cli
