#include "muon/internal/dnnl.h"

#include "muon/error.h"

#if MUON_HAVE_DNNL

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace muon::detail::dnnl {
namespace {

using ::dnnl::memory;

const ::dnnl::engine& engine() {
  static const ::dnnl::engine cpu(::dnnl::engine::kind::cpu, 0);
  return cpu;
}

memory::data_type data_type(Type t) {
  return t == Type::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

memory::desc descriptor(int64_t rows, int64_t cols, Type t, int64_t rs, int64_t cs) {
  return memory::desc({rows, cols}, data_type(t), {rs, cs});
}

// A product's primitive, made once per shape, layout and types (oneDNN generates code for it).
struct Product {
  std::unique_ptr<::dnnl::matmul::primitive_desc> pd;
  std::unique_ptr<::dnnl::matmul> primitive;
};

using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, float>;

// beta ≠ 0 adds beta·C to the product through a sum post-op, in the kernel's own pass over C.
// Every call brings its own scratchpad (scratchpad_mode::user), so that threads may run products
// at once, the same primitive included: oneDNN's own would be shared.
::dnnl::matmul::primitive_desc make_pd(const memory::desc& a, const memory::desc& b,
                                       const memory::desc& c, float beta) {
  ::dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(::dnnl::scratchpad_mode::user);
  if (beta != 0.0f) {
    ::dnnl::post_ops post;
    post.append_sum(beta);
    attr.set_post_ops(post);
  }
#if DNNL_VERSION_MAJOR >= 3
  return ::dnnl::matmul::primitive_desc(engine(), a, b, c, attr);
#else
  return ::dnnl::matmul::primitive_desc(::dnnl::matmul::desc(a, b, c), attr, engine());
#endif
}

const Product& product(const Key& key, const memory::desc& a, const memory::desc& b,
                       const memory::desc& c, float beta) {
  static std::mutex mutex;
  static std::map<Key, Product> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    Product p;
    try {
      p.pd = std::make_unique<::dnnl::matmul::primitive_desc>(make_pd(a, b, c, beta));
    } catch (const ::dnnl::error& e) {
      throw Error(std::string("oneDNN has no matrix-product kernel for these types on this CPU (") +
                  e.what() + ")");
    }
    p.primitive = std::make_unique<::dnnl::matmul>(*p.pd);
    it = cache.emplace(key, std::move(p)).first;
  }
  return it->second;
}

// This thread's scratchpad of at least `bytes`, 64-byte aligned; it only grows, so the same
// products allocate nothing after their first call.
void* scratchpad(size_t bytes) {
  constexpr size_t kAlign = 64;
  thread_local std::vector<unsigned char> buffer;
  if (buffer.size() < bytes + kAlign) buffer.resize(bytes + kAlign);
  void* p = buffer.data();
  size_t space = buffer.size();
  return std::align(kAlign, bytes, p, space);
}

}  // namespace

bool available() {
  return true;
}

std::string version() {
  const auto* v = ::dnnl::version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

void matmul(int64_t m, int64_t n, int64_t k, Type in, Operand a, Operand b, Type out, void* c,
            int64_t rsc, int64_t csc, float beta) {
  const auto a_md = descriptor(m, k, in, a.rs, a.cs);
  const auto b_md = descriptor(k, n, in, b.rs, b.cs);
  const auto c_md = descriptor(m, n, out, rsc, csc);
  const Key key{
      m,   n,   k,         static_cast<int>(in), static_cast<int>(out), a.rs, a.cs, b.rs, b.cs,
      rsc, csc, beta};
  const auto& p = product(key, a_md, b_md, c_md, beta);
  memory a_mem(a_md, engine(), const_cast<void*>(a.data));
  memory b_mem(b_md, engine(), const_cast<void*>(b.data));
  memory c_mem(c_md, engine(), c);
  const auto scratch_md = p.pd->scratchpad_desc();
  memory scratch_mem(scratch_md, engine(), scratchpad(scratch_md.get_size()));
  ::dnnl::stream stream(engine());
  p.primitive->execute(stream, {{DNNL_ARG_SRC, a_mem},
                                {DNNL_ARG_WEIGHTS, b_mem},
                                {DNNL_ARG_DST, c_mem},
                                {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  stream.wait();
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc) {
  const auto status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                 0.0f, c, ldc);
  if (status != dnnl_success) {
    throw Error("oneDNN's sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                ") on a " + std::to_string(m) + "x" + std::to_string(k) + " by " +
                std::to_string(k) + "x" + std::to_string(n) + " product");
  }
}

std::string kernel(Type in, Type out, int64_t n) {
  try {
    return make_pd(descriptor(n, n, in, n, 1), descriptor(n, n, in, n, 1),
                   descriptor(n, n, out, n, 1), 0.0f)
        .impl_info_str();
  } catch (const ::dnnl::error&) {
    return "";
  }
}

}  // namespace muon::detail::dnnl

#else  // built without oneDNN

namespace muon::detail::dnnl {

bool available() {
  return false;
}
std::string version() {
  return "none (oneDNN's headers, libdnnl-dev, were not found at build time)";
}
void matmul(int64_t, int64_t, int64_t, Type, Operand, Operand, Type, void*, int64_t, int64_t,
            float) {
  throw Error("matrix products through oneDNN: this build has no oneDNN");
}
void sgemm(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
           float*, int64_t) {
  throw Error("matrix products through oneDNN: this build has no oneDNN");
}
std::string kernel(Type, Type, int64_t) {
  return "";
}

}  // namespace muon::detail::dnnl

#endif
