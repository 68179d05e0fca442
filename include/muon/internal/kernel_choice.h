// Internal: what this CPU can run, read from its feature bits (CPUID and the register state the
// OS saves, XGETBV) — never from a table of CPU models, which falls behind every new generation —
// and the kernels the CPU Newton–Schulz products use because of them. The choices are pure
// functions of the bits, so tests run every branch with injected bits on any machine.
#pragma once

#include <array>
#include <string>

namespace muon::detail {

struct CpuFeatures {
  bool x86_64 = false;
  bool avx2 = false, fma = false;  // with the OS saving the YMM registers
  bool avx512f = false, avx512dq = false, avx512bw = false, avx512vl = false;  // and ZMM state
  bool avx512_bf16 = false;  // VDPBF16PS: bf16 dot products into fp32
  bool amx_bf16 = false;     // AMX tiles with bf16 (and the OS saving tile state)
  std::string vendor;        // CPUID's vendor string: "GenuineIntel", "AuthenticAMD", ...
  std::string model;         // the brand string, for reports only
  std::string ceiling;       // "ONEDNN_MAX_CPU_ISA=AVX2" where that took features away, else ""

  // The present features as a space-separated list ("avx2 fma avx512f ...").
  std::string flags() const;
};

// `features` without those above the instruction-set ceiling `max_isa` names — oneDNN's
// ONEDNN_MAX_CPU_ISA values (AVX2, AVX512_CORE, AVX512_CORE_BF16, AVX512_CORE_AMX, ..., case
// ignored), which oneDNN and LibTorch's kernels obey too — so that one variable makes this CPU
// run what a CPU of that class runs: AVX2 gives the products of an AMD Zen 3 (BLIS 'haswell',
// bf16 emulated), AVX512_CORE those of a CPU without bf16 dot products. Empty, ALL, DEFAULT or a
// name oneDNN does not have: no ceiling.
CpuFeatures below_ceiling(CpuFeatures features, const std::string& max_isa);

// This CPU's features below ONEDNN_MAX_CPU_ISA's ceiling, read once.
const CpuFeatures& cpu_features();

// The widest fp32 vector kernels the features allow: AVX-512 (F, DQ, BW and VL), AVX2 with FMA,
// or none (reference code; every non-x86 CPU here, where the libraries detect for themselves).
enum class VectorFamily { none, avx2, avx512 };
VectorFamily fp32_family(const CpuFeatures& features);
std::string to_string(VectorFamily family);

// BLIS's configuration for a CPU: `blis_own` — what BLIS's own detection picked, which knows the
// CPU models of its release and falls back to "generic" on later ones — when its kernels are
// exactly as wide as `allowed`, else BLIS's configuration for `allowed` ("skx" for AVX-512,
// "haswell" for AVX2, "generic" for none). Returns the configuration and why.
struct BlisChoice {
  std::string config;
  std::string reason;
};
BlisChoice choose_blis_config(const std::string& blis_own, VectorFamily allowed);
// The vector family of a BLIS configuration's kernels (none for generic and unknown ones).
VectorFamily blis_config_family(const std::string& config);

// (major, minor, patch) of the first "N.N.N" in a version text ("oneDNN 2.6.3", "Intel(R)
// MKL-DNN v3.13.3 (Git Hash …)"); zeros where there is none (a LibTorch without oneDNN).
std::array<int, 3> release_of(const std::string& text);

// Where the fp32 Newton–Schulz products run: on the BLAS library (BLIS or a CBLAS, which has
// triangular products), or on an sgemm that ran them faster on AVX-512 CPUs, a symmetric
// product's upper triangle as row blocks of it (docs/algorithms.md, "fp32 on oneDNN's or MKL's
// sgemm").
enum class Fp32Gemm { library, onednn_sgemm, libtorch_mkl };
// What the choice depends on besides the CPU: the oneDNN release this build links, the one
// LibTorch runs on, and the MKL LibTorch's BLAS is, where its library exports MKL's sgemm
// (version texts; "" where there is none).
struct Fp32GemmContext {
  std::string onednn_linked, onednn_libtorch, libtorch_mkl;
};
struct Fp32GemmChoice {
  Fp32Gemm gemm;
  std::string reason;  // where the products run, or why not elsewhere than the library
};
Fp32GemmChoice choose_fp32_gemm(const CpuFeatures& features, const Fp32GemmContext& context);

// Whether the features include bf16 dot products (AVX512_BF16 or AMX-BF16): what makes bf16
// matrix products faster than fp32 ones.
bool has_bf16_products(const CpuFeatures& features);

}  // namespace muon::detail
