// A minimal training loop on the installed library: a two-layer MLP fits y = sin(x·w) with Muon on
// its hidden matrix and AdamW on the rest, routed automatically.
#include <muon/hybrid.h>
#include <muon/routing.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear embed{nullptr}, hidden{nullptr}, head{nullptr};
  MlpImpl() {
    embed = register_module("embed", torch::nn::Linear(8, 64));
    hidden = register_module("hidden", torch::nn::Linear(64, 64));
    head = register_module("head", torch::nn::Linear(64, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    namespace F = torch::nn::functional;
    return head(F::relu(hidden(F::relu(embed(x)))));
  }
};
TORCH_MODULE(Mlp);

int main() {
  std::printf("built as C++ %ld\n", static_cast<long>(__cplusplus));  // the standard muon::muon asked for
  at::manual_seed(0);
  Mlp model;
  const auto routes = muon::route(*model);
  std::printf("%s", muon::format_routing_report(routes).c_str());
  muon::HybridOptimizer opt(routes, muon::MuonOptions(0.02), muon::AdamWOptions(3e-3));

  const auto x = at::randn({256, 8});
  const auto y = at::sin(x.sum(1, true));
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    auto loss = (model->forward(x) - y).square().mean();
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::printf("mse %.4f -> %.4f\n", first, last);
  return last < 0.5 * first ? 0 : 1;
}
