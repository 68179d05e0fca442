// Byte-level text data for the demo: the King James Bible (Debian's bible-kjv) or any text file.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>

namespace muon::cli {

// The whole KJV text, as `bible "Gen1:1-Rev22:21"` prints it (about 4.3 MB). Throws muon::Error
// naming the package if the `bible` program is missing.
std::string load_kjv();

// `source` is "kjv" or a path to a text file.
std::string load_text(const std::string& source);

class TextDataset {
 public:
  // The last `val_fraction` of the text is the validation split.
  TextDataset(const std::string& text, double val_fraction);

  // `batch` random windows of the training split: inputs and next-byte targets (batch, seq_len).
  std::pair<at::Tensor, at::Tensor> train_batch(int64_t batch, int64_t seq_len,
                                                at::Generator& generator) const;
  // The i-th of a fixed set of evenly spaced validation windows (same every call).
  std::pair<at::Tensor, at::Tensor> val_batch(int64_t index, int64_t batch, int64_t seq_len,
                                              int64_t n_batches) const;

  // Throws muon::Error unless both splits hold a window of seq_len + 1 bytes.
  void check_window(int64_t seq_len) const;
  int64_t train_bytes() const { return train_.numel(); }
  int64_t val_bytes() const { return val_.numel(); }

 private:
  at::Tensor train_, val_;  // int64 byte values
};

}  // namespace muon::cli
