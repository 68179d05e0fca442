#include "muon/internal/kernel_choice.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace muon::detail {
namespace {

#if defined(__x86_64__)

struct Registers {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Registers cpuid(uint32_t leaf, uint32_t subleaf = 0) {
  Registers r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return {};
  return r;
}

bool bit(uint32_t value, int index) {
  return ((value >> index) & 1u) != 0;
}

// The register state the OS saves on a context switch (XCR0): a vector unit is usable only if
// its registers are in it (a VM may hide AVX-512 state from the guest).
uint64_t saved_state() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string vendor() {
  const auto r = cpuid(0);
  char text[13] = {};
  std::memcpy(text, &r.ebx, 4);
  std::memcpy(text + 4, &r.edx, 4);
  std::memcpy(text + 8, &r.ecx, 4);
  return text;
}

std::string brand() {
  if (cpuid(0x80000000).eax < 0x80000004) return "";
  char text[49] = {};
  for (uint32_t i = 0; i < 3; ++i) {
    const auto r = cpuid(0x80000002 + i);
    std::memcpy(text + 16 * i, &r.eax, 4);
    std::memcpy(text + 16 * i + 4, &r.ebx, 4);
    std::memcpy(text + 16 * i + 8, &r.ecx, 4);
    std::memcpy(text + 16 * i + 12, &r.edx, 4);
  }
  std::string s(text);
  const auto first = s.find_first_not_of(' ');
  const auto last = s.find_last_not_of(' ');
  return first == std::string::npos ? "" : s.substr(first, last - first + 1);
}

CpuFeatures detect() {
  CpuFeatures f;
  f.x86_64 = true;
  f.vendor = vendor();
  f.model = brand();
  const auto leaf1 = cpuid(1);
  if (!bit(leaf1.ecx, 27)) return f;  // no OSXSAVE: no AVX state either
  const uint64_t xcr0 = saved_state();
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xE0) == 0xE0;   // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  const bool max7 = cpuid(0).eax >= 7;
  const auto leaf7 = max7 ? cpuid(7, 0) : Registers{};
  const auto leaf7_1 = max7 ? cpuid(7, 1) : Registers{};
  f.fma = ymm && bit(leaf1.ecx, 12);
  f.avx2 = ymm && bit(leaf1.ecx, 28) && bit(leaf7.ebx, 5);
  f.avx512f = zmm && bit(leaf7.ebx, 16);
  f.avx512dq = zmm && bit(leaf7.ebx, 17);
  f.avx512bw = zmm && bit(leaf7.ebx, 30);
  f.avx512vl = zmm && bit(leaf7.ebx, 31);
  f.avx512_bf16 = f.avx512f && bit(leaf7_1.eax, 5);
  f.amx_bf16 = tiles && bit(leaf7.edx, 22) && bit(leaf7.edx, 24);
  return f;
}

#else  // other architectures: no x86 vector families; libraries detect their own

CpuFeatures detect() {
  return {};
}

#endif

}  // namespace

std::string CpuFeatures::flags() const {
  std::string out;
  const auto add = [&](bool present, const char* name) {
    if (present) out += (out.empty() ? "" : " ") + std::string(name);
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512dq, "avx512dq");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512_bf16, "avx512_bf16");
  add(amx_bf16, "amx_bf16");
  return out.empty() ? "none of avx2/fma/avx512/amx" : out;
}

CpuFeatures below_ceiling(CpuFeatures f, const std::string& max_isa) {
  std::string isa;
  for (const char c : max_isa) isa += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  // What each ceiling keeps: vector width (0: no AVX2, 1: AVX2, 2: AVX-512), bf16 dot products,
  // AMX.
  struct Ceiling {
    const char* name;
    int width;
    bool bf16, amx;
  };
  static const Ceiling ceilings[] = {
      {"SSE41", 0, false, false},           {"AVX", 0, false, false},
      {"AVX2", 1, false, false},            {"AVX2_VNNI", 1, false, false},
      {"AVX2_VNNI_2", 1, false, false},     {"AVX512_CORE", 2, false, false},
      {"AVX512_CORE_VNNI", 2, false, false}, {"AVX512_CORE_BF16", 2, true, false},
      {"AVX512_CORE_FP16", 2, true, false}, {"AVX10_1_512", 2, true, false},
  };
  for (const auto& c : ceilings) {
    if (isa != c.name) continue;
    const CpuFeatures before = f;
    if (c.width < 1) f.avx2 = f.fma = false;
    if (c.width < 2) f.avx512f = f.avx512dq = f.avx512bw = f.avx512vl = false;
    if (!c.bf16 || c.width < 2) f.avx512_bf16 = false;
    if (!c.amx) f.amx_bf16 = false;
    if (f.flags() != before.flags()) f.ceiling = "ONEDNN_MAX_CPU_ISA=" + isa;
  }
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    const char* max_isa = std::getenv("ONEDNN_MAX_CPU_ISA");
    return below_ceiling(detect(), max_isa != nullptr ? max_isa : "");
  }();
  return features;
}

VectorFamily fp32_family(const CpuFeatures& f) {
  if (f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl) return VectorFamily::avx512;
  if (f.avx2 && f.fma) return VectorFamily::avx2;
  return VectorFamily::none;
}

std::string to_string(VectorFamily family) {
  switch (family) {
    case VectorFamily::avx512:
      return "avx512";
    case VectorFamily::avx2:
      return "avx2";
    case VectorFamily::none:
      return "none";
  }
  return "?";
}

VectorFamily blis_config_family(const std::string& config) {
  // BLIS's x86-64 configurations by the instructions their kernels use.
  for (const char* name : {"skx", "knl"}) {
    if (config == name) return VectorFamily::avx512;
  }
  for (const char* name : {"haswell", "zen", "zen2", "zen3", "zen4", "zen5"}) {
    if (config == name) return VectorFamily::avx2;
  }
  return VectorFamily::none;
}

BlisChoice choose_blis_config(const std::string& blis_own, VectorFamily allowed) {
  if (blis_config_family(blis_own) == allowed) {
    return {blis_own, "BLIS's own choice for this CPU, as wide as its features allow (" +
                          to_string(allowed) + ")"};
  }
  // Narrower than the features allow (a CPU newer than BLIS's tables), or wider than what the OS
  // saves (a VM that hides AVX-512 state): the family's own configuration.
  const std::string config = allowed == VectorFamily::avx512 ? "skx"
                             : allowed == VectorFamily::avx2 ? "haswell"
                                                             : "generic";
  return {config, "chosen from the CPU's feature bits (" + to_string(allowed) +
                      "); BLIS's own detection picked '" + blis_own + "'"};
}

std::array<int, 3> release_of(const std::string& text) {
  std::array<int, 3> release{0, 0, 0};
  const auto digit =
      std::find_if(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  if (digit != text.end() &&
      std::sscanf(&*digit, "%d.%d.%d", &release[0], &release[1], &release[2]) != 3) {
    release = {0, 0, 0};
  }
  return release;
}

Fp32GemmChoice choose_fp32_gemm(const CpuFeatures& f, const Fp32GemmContext& context) {
  if (fp32_family(f) != VectorFamily::avx512) {
    return {Fp32Gemm::library, "oneDNN's and MKL's sgemm outran BLIS on AVX-512 CPUs only"};
  }
  const auto& ours = context.onednn_linked;
  const auto& theirs = context.onednn_libtorch;
  // Beside a LibTorch on another oneDNN release (PyPI's bundles its own), that copy's exported
  // weak symbols — the one-time set-up of the sgemm kernels among them — take the place of the
  // linked library's, and its sgemm fails.
  const auto release = release_of(theirs);
  if (!ours.empty() && release != std::array<int, 3>{0, 0, 0} && release_of(ours) == release) {
    return {Fp32Gemm::onednn_sgemm, ours + "'s sgemm (LibTorch's oneDNN too)"};
  }
  const std::string libtorch_onednn = release == std::array<int, 3>{0, 0, 0}
                                          ? theirs
                                          : std::to_string(release[0]) + "." +
                                                std::to_string(release[1]) + "." +
                                                std::to_string(release[2]);
  const std::string no_onednn =
      ours.empty() ? "no oneDNN in this build"
                   : "LibTorch's oneDNN is " + libtorch_onednn + ", not " + ours +
                         ", and its symbols would take the place of the linked library's";
  // MKL's sgemm was measured against BLIS on Intel CPUs only (MKL picks its kernels by vendor).
  const auto& mkl = context.libtorch_mkl;
  if (!mkl.empty() && f.vendor == "GenuineIntel") {
    return {Fp32Gemm::libtorch_mkl,
            "LibTorch's " + mkl + " sgemm (not oneDNN's: " + no_onednn + ")"};
  }
  return {Fp32Gemm::library,
          no_onednn + (mkl.empty() ? "" : "; LibTorch's MKL was measured on Intel CPUs only")};
}

bool has_bf16_products(const CpuFeatures& f) {
  return f.avx512_bf16 || f.amx_bf16;
}

}  // namespace muon::detail
