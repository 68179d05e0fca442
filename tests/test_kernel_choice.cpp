// Which kernels the CPU Newton–Schulz products run: chosen from the CPU's feature bits (injected
// here, so every branch runs on any machine), and on this machine never reference code where the
// bits allow vector kernels.
#include <gtest/gtest.h>

#include <array>
#include <set>

#include "muon/internal/blas.h"
#include "muon/internal/kernel_choice.h"
#include "muon/orthogonalize.h"
#include "needs.h"

namespace muon::detail {
namespace {

using testing::proc_cpuinfo;

CpuFeatures avx2_cpu() {
  CpuFeatures f;
  f.x86_64 = f.avx2 = f.fma = true;
  return f;
}

CpuFeatures avx512_cpu() {
  auto f = avx2_cpu();
  f.avx512f = f.avx512dq = f.avx512bw = f.avx512vl = true;
  return f;
}

TEST(KernelChoice, VectorFamilyFollowsTheFeatureBits) {
  EXPECT_EQ(fp32_family(CpuFeatures{}), VectorFamily::none);
  EXPECT_EQ(fp32_family(avx2_cpu()), VectorFamily::avx2);
  EXPECT_EQ(fp32_family(avx512_cpu()), VectorFamily::avx512);
  auto no_fma = avx2_cpu();
  no_fma.fma = false;
  EXPECT_EQ(fp32_family(no_fma), VectorFamily::none);  // AVX2 kernels are FMA kernels
  auto partial = avx512_cpu();
  partial.avx512bw = false;  // AVX-512 F without BW (Knights Landing): the AVX2 kernels
  EXPECT_EQ(fp32_family(partial), VectorFamily::avx2);
  EXPECT_FALSE(has_bf16_products(avx512_cpu()));
  auto bf16 = avx512_cpu();
  bf16.avx512_bf16 = true;
  EXPECT_TRUE(has_bf16_products(bf16));
  auto amx = avx2_cpu();
  amx.amx_bf16 = true;
  EXPECT_TRUE(has_bf16_products(amx));
}

// ONEDNN_MAX_CPU_ISA's ceiling, as oneDNN names its instruction sets: each leaves the features of
// its class and records itself where it took one away.
TEST(KernelChoice, OneDnnsCeilingLeavesTheFeaturesOfItsClass) {
  auto amx = avx512_cpu();
  amx.avx512_bf16 = amx.amx_bf16 = true;
  const auto avx2 = below_ceiling(amx, "avx2");  // case ignored
  EXPECT_EQ(fp32_family(avx2), VectorFamily::avx2);
  EXPECT_FALSE(has_bf16_products(avx2));
  EXPECT_EQ(avx2.ceiling, "ONEDNN_MAX_CPU_ISA=AVX2");
  const auto core = below_ceiling(amx, "AVX512_CORE");
  EXPECT_EQ(fp32_family(core), VectorFamily::avx512);
  EXPECT_FALSE(has_bf16_products(core));
  const auto bf16 = below_ceiling(amx, "AVX512_CORE_BF16");
  EXPECT_TRUE(bf16.avx512_bf16);
  EXPECT_FALSE(bf16.amx_bf16);
  EXPECT_EQ(fp32_family(below_ceiling(amx, "SSE41")), VectorFamily::none);
  for (const char* none : {"", "ALL", "DEFAULT", "AVX512_CORE_AMX", "NONSENSE"}) {
    const auto same = below_ceiling(amx, none);
    EXPECT_EQ(same.flags(), amx.flags()) << none;
    EXPECT_EQ(same.ceiling, "") << none;
  }
  // A ceiling above what the CPU has takes nothing away and is not named.
  EXPECT_EQ(below_ceiling(avx2_cpu(), "AVX512_CORE").ceiling, "");
}

TEST(KernelChoice, BlisConfigurationFromTheFeatureBitsNotACpuModelTable) {
  // A CPU newer than BLIS's model table: BLIS picks "generic" (reference code); the bits decide.
  EXPECT_EQ(choose_blis_config("generic", VectorFamily::avx512).config, "skx");
  EXPECT_EQ(choose_blis_config("generic", VectorFamily::avx2).config, "haswell");
  EXPECT_NE(choose_blis_config("generic", VectorFamily::avx512)
                .reason.find("BLIS's own detection picked 'generic'"),
            std::string::npos);
  // BLIS's own choice stands when its kernels are exactly as wide as the bits allow.
  const auto zen3 = choose_blis_config("zen3", VectorFamily::avx2);
  EXPECT_EQ(zen3.config, "zen3");
  EXPECT_NE(zen3.reason.find("BLIS's own choice"), std::string::npos);
  EXPECT_EQ(choose_blis_config("skx", VectorFamily::avx512).config, "skx");
  // Narrower than allowed (an AVX-512 CPU BLIS takes for an older model) or wider than the OS
  // saves (a VM without ZMM state): the family's own configuration.
  EXPECT_EQ(choose_blis_config("zen3", VectorFamily::avx512).config, "skx");
  EXPECT_EQ(choose_blis_config("sandybridge", VectorFamily::avx2).config, "haswell");
  EXPECT_EQ(choose_blis_config("skx", VectorFamily::avx2).config, "haswell");
  EXPECT_EQ(choose_blis_config("generic", VectorFamily::none).config, "generic");
  EXPECT_EQ(blis_config_family("knl"), VectorFamily::avx512);
  EXPECT_EQ(blis_config_family("zen2"), VectorFamily::avx2);
  EXPECT_EQ(blis_config_family("penryn"), VectorFamily::none);
}

// oneDNN's and MKL's releases, as their version texts give them.
TEST(KernelChoice, ReleasesAreReadFromVersionTexts) {
  using Release = std::array<int, 3>;
  EXPECT_EQ(release_of("oneDNN 2.6.3"), (Release{2, 6, 3}));
  EXPECT_EQ(
      release_of("Intel(R) MKL-DNN v3.13.3 (Git Hash b38f97eb6f2173513112f15a0481750b8a66e901)"),
      (Release{3, 13, 3}));
  EXPECT_EQ(release_of("MKLDNN not found"), (Release{0, 0, 0}));
  EXPECT_EQ(release_of("oneDNN 3.4"), (Release{0, 0, 0}));
  EXPECT_EQ(release_of(""), (Release{0, 0, 0}));
  EXPECT_GT(release_of("v3.13.3"), release_of("oneDNN 3.9.1"));
}

TEST(KernelChoice, Fp32ProductsLeaveTheLibraryOnlyForAnSgemmThatIsSafeHere) {
  auto intel = avx512_cpu(), amd = avx512_cpu();
  intel.vendor = "GenuineIntel";
  amd.vendor = "AuthenticAMD";
  const std::string debian = "oneDNN 2.6.3", pypi = "Intel(R) MKL-DNN v3.13.3 (Git Hash b38f97e)";
  const std::string mkl = "MKL 2024.2";
  const auto choose = [](const CpuFeatures& f, Fp32GemmContext context) {
    return choose_fp32_gemm(f, context);
  };

  // LibTorch on the linked oneDNN release (Debian's): its sgemm, on any AVX-512 CPU.
  for (const auto& cpu : {intel, amd}) {
    const auto same = choose(cpu, {debian, "oneDNN v2.6.3 (Git Hash 0)", ""});
    EXPECT_EQ(same.gemm, Fp32Gemm::onednn_sgemm);
    EXPECT_EQ(same.reason, "oneDNN 2.6.3's sgemm (LibTorch's oneDNN too)");
  }
  // PyPI's torch: another oneDNN, whose symbols would break the linked one's sgemm; its MKL on
  // Intel CPUs, the library elsewhere.
  const auto pypi_intel = choose(intel, {debian, pypi, mkl});
  EXPECT_EQ(pypi_intel.gemm, Fp32Gemm::libtorch_mkl);
  EXPECT_EQ(pypi_intel.reason,
            "LibTorch's MKL 2024.2 sgemm (not oneDNN's: LibTorch's oneDNN is 3.13.3, not oneDNN "
            "2.6.3, and its symbols would take the place of the linked library's)");
  const auto pypi_amd = choose(amd, {debian, pypi, mkl});
  EXPECT_EQ(pypi_amd.gemm, Fp32Gemm::library);
  EXPECT_EQ(pypi_amd.reason,
            "LibTorch's oneDNN is 3.13.3, not oneDNN 2.6.3, and its symbols would take the place "
            "of the linked library's; LibTorch's MKL was measured on Intel CPUs only");
  EXPECT_EQ(choose(intel, {debian, pypi, ""}).gemm, Fp32Gemm::library);  // no MKL exported
  // A build without oneDNN, or a LibTorch without one (its version text has no release).
  const auto no_onednn = choose(intel, {"", pypi, mkl});
  EXPECT_EQ(no_onednn.gemm, Fp32Gemm::libtorch_mkl);
  EXPECT_EQ(no_onednn.reason,
            "LibTorch's MKL 2024.2 sgemm (not oneDNN's: no oneDNN in this build)");
  const auto without = choose(intel, {debian, "MKLDNN not found", ""});
  EXPECT_EQ(without.gemm, Fp32Gemm::library);
  EXPECT_EQ(without.reason,
            "LibTorch's oneDNN is MKLDNN not found, not oneDNN 2.6.3, and its "
            "symbols would take the place of the linked library's");
  // Two version texts without a release are no evidence of one library.
  EXPECT_EQ(choose(intel, {"oneDNN", "MKLDNN not found", ""}).gemm, Fp32Gemm::library);
  // Below AVX-512 BLIS's own kernels were the fastest measured, whatever the rest.
  const auto avx2 = choose(avx2_cpu(), {debian, "oneDNN v2.6.3", mkl});
  EXPECT_EQ(avx2.gemm, Fp32Gemm::library);
  EXPECT_EQ(avx2.reason, "oneDNN's and MKL's sgemm outran BLIS on AVX-512 CPUs only");
}

TEST(KernelChoice, DetectedFeaturesAgreeWithTheKernel) {
  const auto flags = proc_cpuinfo("flags");
  if (flags.empty()) GTEST_SKIP() << "needs software: /proc/cpuinfo with flags (Linux on x86-64)";
  const auto& f = cpu_features();
  EXPECT_EQ(proc_cpuinfo("vendor_id"), std::set<std::string>{f.vendor});
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1) << f.flags();
  EXPECT_EQ(f.fma, flags.count("fma") == 1) << f.flags();
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1) << f.flags();
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1) << f.flags();
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1) << f.flags();
  EXPECT_EQ(f.amx_bf16, flags.count("amx_bf16") == 1) << f.flags();
}

TEST(KernelChoice, TheProductsRunVectorKernelsWhereverTheCpuAllowsThem) {
  const auto allowed = fp32_family(cpu_features());
  const auto report = blas_backend();
  SCOPED_TRACE(report + " on " + cpu_features().flags());
  if (report.rfind("BLIS", 0) == 0) {
    // BLIS runs exactly the family the bits allow, whatever its own model table says.
    EXPECT_EQ(blas::kernel_family(), to_string(allowed));
    EXPECT_NE(report.find("configuration '"), std::string::npos);
    EXPECT_NE(report.find(to_string(allowed) + " kernels"), std::string::npos);
  } else if (report.rfind("CBLAS", 0) == 0 && allowed != VectorFamily::none) {
    // OpenBLAS picks for itself (OPENBLAS_CORETYPE may hold it to AVX2): never reference code.
    EXPECT_NE(blas::kernel_family(), "none");
  }
  // The report says where fp32 products run: on the library or on an sgemm, and that only on
  // AVX-512 CPUs.
  if (!blas::available()) return;
  const bool elsewhere = report.find("; fp32 products on ") != std::string::npos;
  EXPECT_EQ(elsewhere, blas::fp32_on_sgemm());
  EXPECT_NE(elsewhere, report.find("; fp32 too (") != std::string::npos);
  if (elsewhere) EXPECT_EQ(allowed, VectorFamily::avx512);
}

}  // namespace
}  // namespace muon::detail
