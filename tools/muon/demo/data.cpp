#include "demo/data.h"

#include <cstdio>
#include <filesystem>
#include <memory>

#include "muon/error.h"
#include "muon/internal/read_file.h"
#include "system/memory.h"

namespace muon::cli {

std::string load_kjv() {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen("bible 'Gen1:1-Rev22:21' 2>/dev/null", "r"),
                                             pclose);
  check(pipe != nullptr, "data: could not start the `bible` program");
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe.get())) > 0) text.append(buffer, n);
  check(text.size() > 1000000,
        "data: `bible` printed no text; install Debian's bible-kjv package (apt-get install "
        "bible-kjv) or pass a text file as the data source");
  return text;
}

std::string load_text(const std::string& source) {
  if (source == "kjv") return load_kjv();
  // The text and its byte tokens are both held: twice the file, checked before reading it.
  std::error_code error;
  const auto size = std::filesystem::file_size(source, error);
  if (!error) {
    check_memory_need(2.0 * static_cast<double>(size), "data: '" + source + "'",
                      "the text and its tokens", "the text file");
  }
  return detail::read_file(source, "data", "; give \"kjv\" or a readable text file");
}

namespace {

at::Tensor to_tokens(const std::string& text, size_t begin, size_t end) {
  auto bytes = at::empty({static_cast<int64_t>(end - begin)}, at::kByte);
  std::copy(text.begin() + static_cast<std::ptrdiff_t>(begin),
            text.begin() + static_cast<std::ptrdiff_t>(end), bytes.data_ptr<uint8_t>());
  return bytes.to(at::kLong);
}

std::pair<at::Tensor, at::Tensor> windows(const at::Tensor& data, const at::Tensor& starts,
                                          int64_t seq_len) {
  const auto index = starts.unsqueeze(1) + at::arange(seq_len + 1, at::kLong).unsqueeze(0);
  const auto chunk = data.index_select(0, index.reshape({-1})).view({starts.size(0), seq_len + 1});
  return {chunk.narrow(1, 0, seq_len), chunk.narrow(1, 1, seq_len)};
}

}  // namespace

TextDataset::TextDataset(const std::string& text, double val_fraction) {
  check(val_fraction > 0 && val_fraction < 1, "data: val_fraction must be in (0, 1), got ",
        val_fraction);
  const auto split = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - val_fraction));
  train_ = to_tokens(text, 0, split);
  val_ = to_tokens(text, split, text.size());
}

void TextDataset::check_window(int64_t seq_len) const {
  for (const auto& [split, tokens] : {std::pair{"training", &train_}, {"validation", &val_}}) {
    check(tokens->numel() > seq_len + 1, "data: the ", split, " split (", tokens->numel(),
          " bytes) is shorter than one window of ", seq_len + 1, " bytes");
  }
}

std::pair<at::Tensor, at::Tensor> TextDataset::train_batch(int64_t batch, int64_t seq_len,
                                                           at::Generator& generator) const {
  check(train_.numel() > seq_len + 1, "data: the training split (", train_.numel(),
        " bytes) is shorter than one window of ", seq_len + 1, " bytes");
  const auto starts = at::randint(0, train_.numel() - seq_len - 1, {batch}, generator, at::kLong);
  return windows(train_, starts, seq_len);
}

std::pair<at::Tensor, at::Tensor> TextDataset::val_batch(int64_t index, int64_t batch,
                                                         int64_t seq_len, int64_t n_batches) const {
  check(val_.numel() > seq_len + 1, "data: the validation split (", val_.numel(),
        " bytes) is shorter than one window of ", seq_len + 1, " bytes");
  const auto last_start = val_.numel() - seq_len - 1;
  const auto total = batch * n_batches;
  const auto starts = (at::arange(index * batch, (index + 1) * batch, at::kDouble) *
                       (static_cast<double>(last_start) / static_cast<double>(total)))
                          .to(at::kLong);
  return windows(val_, starts, seq_len);
}

}  // namespace muon::cli
