// anyshape CPU runtime prelude: included at the top of every generated translation unit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <omp.h>
#include <cblas.h>

struct AsTensor {
  void* data;
  int64_t ndim;
  int64_t shape[8];
  int64_t dtype;
};

alignas(64) static const unsigned char as_zero_block[64] = {0};

static inline void* as_alloc(int64_t bytes) {
  size_t n = (size_t)((bytes + 63) / 64 * 64);
  if (n == 0) n = 64;
  return std::aligned_alloc(64, n);
}

template <class T> static inline bool as_isnan(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x; else return false;
}
template <class A, class B> static inline auto as_max(A a, B b) -> decltype(a + b) {
  using R = decltype(a + b);
  if (as_isnan(a)) return (R)a;
  if (as_isnan(b)) return (R)b;
  return a > b ? (R)a : (R)b;
}
template <class A, class B> static inline auto as_min(A a, B b) -> decltype(a + b) {
  using R = decltype(a + b);
  if (as_isnan(a)) return (R)a;
  if (as_isnan(b)) return (R)b;
  return a < b ? (R)a : (R)b;
}
template <class T> static inline T as_sign(T x) {
  if constexpr (std::is_floating_point_v<T>) return x > 0 ? (T)1 : (x < 0 ? (T)-1 : x);
  else return (T)((x > 0) - (x < 0));
}
template <class A, class B> static inline auto as_pow(A a, B b) -> decltype(a + b) {
  using R = decltype(a + b);
  if constexpr (std::is_floating_point_v<R>) return std::pow((R)a, (R)b);
  else { R r = 1, base = a; int64_t e = (int64_t)b;
         if (e < 0) return a == 1 ? (R)1 : (a == -1 ? (R)((e & 1) ? -1 : 1) : (R)0);
         while (e) { if (e & 1) r *= base; base *= base; e >>= 1; } return r; }
}
template <class A, class B> static inline auto as_idiv(A a, B b, int* err) -> decltype(a + b) {
  if (b == 0) { *err = 2; return 0; }
  return a / b;
}
template <class A, class B> static inline auto as_irem(A a, B b, int* err) -> decltype(a + b) {
  if (b == 0) { *err = 2; return 0; }
  return a % b;
}
static inline int64_t as_clamp(int64_t i, int64_t n) {
  return i < 0 ? 0 : (i >= n ? (n > 0 ? n - 1 : 0) : i);
}
static inline int64_t as_index(int64_t v, int64_t n, int* err) {
  if (v < 0) v += n;
  if (v < 0 || v >= n) { *err = 1; return 0; }
  return v;
}
// Sizes only: a zero divisor means an empty dim, whose extent the result never scales.
static inline int64_t as_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t as_mod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static const char* as_kernel_error(int code) {
  return code == 1 ? "an index is out of range (gather/embedding/index)"
       : code == 2 ? "integer division by zero" : "kernel error";
}

// OpenBLAS runs its parallel work on anyshape's OpenMP pool: one thread pool in the process.
static void as_blas_threads(int sync, openblas_dojob_callback dojob, int numjobs,
                            size_t jobdata_elsize, void* jobdata, int dojob_data) {
  (void)sync;
  #pragma omp parallel for schedule(static)
  for (int i = 0; i < numjobs; ++i)
    dojob(i, (char*)jobdata + (size_t)i * jobdata_elsize, dojob_data);
}

extern "C" void anyshape_init(int num_threads) {
  if (num_threads > 0) omp_set_num_threads(num_threads);
  scipy_openblas_set_threads_callback_function(as_blas_threads);
  scipy_openblas_set_num_threads(num_threads > 0 ? num_threads : omp_get_max_threads());
}

extern "C" void anyshape_free(void* p) { std::free(p); }
