// anyshape CPU runtime prelude: included at the top of every generated translation unit.
// C headers only (math comes from compiler builtins in vmath.h): the C++ standard library
// headers would triple the build time of a small graph.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <pthread.h>
#include <sys/mman.h>
#include <cblas.h>

// Element helpers the kernels call per element are always inlined: a kernel compiled with
// its own float options (host.py: float-sum kernels reassociate) does not inline a plain
// inline function that does float math, and the call stops the loop vectorizing (a sum
// over relu: 97 -> 1362 us).
#define AS_INLINE static inline __attribute__((always_inline))

// One translation unit, or several built in parallel (codegen/cpu/build.py splits a large
// one: AS_SPLIT_UNIT in each, AS_HOST_UNIT in the one holding anyshape_main). Split, the
// process-wide state below is defined once for all units (C++17 inline variables and
// functions, hidden from other libraries), kernels are called across units, and the C API
// is defined in the host unit only (AS_WITH_API).
#ifdef AS_SPLIT_UNIT
#define AS_SHARED inline __attribute__((visibility("hidden")))
#define AS_KERNEL __attribute__((visibility("hidden")))
#ifdef AS_HOST_UNIT
#define AS_WITH_API 1
#endif
#else
#define AS_SHARED static
#define AS_KERNEL static
#define AS_WITH_API 1
#endif
AS_INLINE int64_t as_max64(int64_t a, int64_t b) { return a > b ? a : b; }
AS_INLINE int64_t as_min64(int64_t a, int64_t b) { return a < b ? a : b; }
// Elements per thread's share of a row split over `parts` threads: whole cache lines.
static inline int64_t as_split_block(int64_t n, int64_t parts) {
  const int64_t b = ((n + parts - 1) / parts + 15) & ~INT64_C(15);
  return b > 0 ? b : 16;
}
template <class A, class B> struct as_same { static constexpr bool value = false; };
template <class A> struct as_same<A, A> { static constexpr bool value = true; };
template <class T> struct as_is_float {
  static constexpr bool value = as_same<T, float>::value || as_same<T, double>::value;
};

// The tensor descriptor of anyshape_main, declared once for the generated code, the C API
// and the fast-call extension (the build pastes the header's text in place of this line).
#include "anyshape_abi.h"
typedef anyshape_tensor AsTensor;

alignas(64) static const unsigned char as_zero_block[64] = {0};

static inline void* as_alloc(int64_t bytes) {
  size_t n = (size_t)((bytes + 63) / 64 * 64);
  if (n == 0) n = 64;
  return aligned_alloc(64, n);
}

static inline int64_t as_round64(int64_t bytes) { return bytes <= 0 ? 64 : (bytes + 63) / 64 * 64; }

// Per-thread arenas that only grow: steady-state calls neither allocate nor fault pages
// in, and threads never share one. The workspace holds a call's intermediate buffers;
// the scratch arena holds kernels' temporaries (convolution columns).
struct AsArena {
  void* data = nullptr;
  int64_t size = 0;
  ~AsArena() { free(data); }
  void* reserve(int64_t bytes) {
    if (bytes > size) {
      free(data);
      size = as_round64(bytes + bytes / 8);
      data = aligned_alloc(64, (size_t)size);
      if (!data) size = 0;
    }
    return data;
  }
};

// The workspace arena also remembers the needs of its last AS_WS_HISTORY calls. A call
// that needs more than twice their largest, and over AS_WS_OUTLIER bytes more, is an
// outlier (one long sequence among short ones): when it ends, the pages past the
// recent high-water mark go back to the OS (madvise(MADV_DONTNEED); they fault in
// again, zeroed, if a later call needs them), so its memory does not stay resident for
// the life of the process. Steady-state calls keep every page.
#define AS_WS_HISTORY 16
#define AS_WS_OUTLIER ((int64_t)64 << 20)
struct AsWorkspaceArena {
  AsArena arena;
  int64_t recent[AS_WS_HISTORY] = {0};  // the needs of the last calls, a ring
  int next = 0;
  int64_t keep = -1;  // bytes to keep resident once the current call ends; -1: all
  int64_t high_water() const {
    int64_t m = 0;
    for (int k = 0; k < AS_WS_HISTORY; ++k) m = recent[k] > m ? recent[k] : m;
    return m;
  }
  void* begin_call(int64_t bytes) {
    const int64_t hw = high_water();
    keep = bytes > 2 * hw && bytes - hw > AS_WS_OUTLIER ? hw : -1;
    recent[next] = bytes;
    next = (next + 1) % AS_WS_HISTORY;
    return arena.reserve(bytes);
  }
  void end_call() {
    if (keep < 0 || !arena.data) return;
    const uintptr_t page = 4096, start = (uintptr_t)arena.data;
    const uintptr_t from = (start + (uintptr_t)keep + page - 1) / page * page;
    const uintptr_t end = (start + (uintptr_t)arena.size) / page * page;
    if (end > from) madvise((void*)from, end - from, MADV_DONTNEED);
    keep = -1;
  }
};
AS_SHARED AsWorkspaceArena& as_workspace_arena() {
  static thread_local AsWorkspaceArena arena;
  return arena;
}
// A call's hold on the calling thread's workspace: taken at the start of the call,
// given back (an outlier's excess pages released) on every way out of it.
struct AsWorkspaceLease {
  void* data;
  explicit AsWorkspaceLease(int64_t bytes) : data(as_workspace_arena().begin_call(bytes)) {}
  ~AsWorkspaceLease() { as_workspace_arena().end_call(); }
};
AS_SHARED void* as_scratch(int64_t bytes) {
  static thread_local AsArena arena;
  return arena.reserve(bytes);
}

template <class T> AS_INLINE bool as_isnan(T x) {
  if constexpr (as_is_float<T>::value) return x != x; else return false;
}
template <class A, class B> AS_INLINE auto as_max(A a, B b) -> decltype(a + b) {
  using R = decltype(a + b);
  if (as_isnan(a)) return (R)a;
  if (as_isnan(b)) return (R)b;
  return a > b ? (R)a : (R)b;
}
template <class A, class B> AS_INLINE auto as_min(A a, B b) -> decltype(a + b) {
  using R = decltype(a + b);
  if (as_isnan(a)) return (R)a;
  if (as_isnan(b)) return (R)b;
  return a < b ? (R)a : (R)b;
}
template <class T> AS_INLINE T as_sign(T x) {
  if constexpr (as_is_float<T>::value) return x > 0 ? (T)1 : (x < 0 ? (T)-1 : x);
  else return (T)((x > 0) - (x < 0));
}
template <class A, class B> AS_INLINE auto as_pow(A a, B b) -> decltype(a + b) {
  using R = decltype(a + b);
  if constexpr (as_same<R, float>::value) return __builtin_powf(a, b);
  else if constexpr (as_same<R, double>::value) return __builtin_pow(a, b);
  else { R r = 1, base = a; int64_t e = (int64_t)b;
         if (e < 0) return a == 1 ? (R)1 : (a == -1 ? (R)((e & 1) ? -1 : 1) : (R)0);
         while (e) { if (e & 1) r *= base; base *= base; e >>= 1; } return r; }
}
/* A signed x / -1 is -x (wrapping under -fwrapv) and x % -1 is 0: the hardware's
   division of the type's lowest value by -1 traps (SIGFPE), so -1 never reaches it. */
template <class A, class B> AS_INLINE auto as_idiv(A a, B b, int* err) -> decltype(a + b) {
  typedef decltype(a + b) R;
  if (b == 0) { *err = 2; return 0; }
  if ((R)-1 < 0 && b == (B)-1) return (R)(0 - (R)a);
  return a / b;
}
template <class A, class B> AS_INLINE auto as_irem(A a, B b, int* err) -> decltype(a + b) {
  typedef decltype(a + b) R;
  if (b == 0) { *err = 2; return 0; }
  if ((R)-1 < 0 && b == (B)-1) return 0;
  return a % b;
}
AS_INLINE int64_t as_clamp(int64_t i, int64_t n) {
  return i < 0 ? 0 : (i >= n ? (n > 0 ? n - 1 : 0) : i);
}
AS_INLINE int64_t as_index(int64_t v, int64_t n, int* err) {
  if (v < 0) v += n;
  if (v < 0 || v >= n) { *err = 1; return 0; }
  return v;
}
// Sizes only: a zero divisor means an empty dim, whose extent the result never scales.
AS_INLINE int64_t as_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
AS_INLINE int64_t as_mod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static const char* as_kernel_error(int code) {
  return code == 1 ? "an index is out of range (gather/embedding/index/scatter)"
       : code == 2 ? "integer division by zero"
       : code == 3 ? "out of memory for kernel scratch space"
       : code == 4 ? "oneDNN failed on a convolution it had run on an earlier image of the batch"
       : code == 5 ? "Expected reduction dim to have non-zero size (argmax/argmin of an empty dim)"
       : code == 6 ? "input too small: an empty spatial dim, or a window larger than the padded input"
       : "kernel error";
}

// GEMM p of a batch over two dims (outer, inner), an operand's matrices `o` apart along
// the outer dim and `i` apart along the inner one (as_gemm_views, as_batch_sgemm).
template <class T>
AS_INLINE T* as_view(T* base, int64_t o, int64_t i, int64_t p, int64_t inner) {
  return base + (p / inner) * o + (p % inner) * i;
}

#ifdef ANYSHAPE_DNNL
// oneDNN (plugin mode, when installed): its sgemm for up to 8 rows runs near the GEMM peak
// where OpenBLAS does not (BERT's shapes, 2 threads, B in cache: 8-row blocks at 145-215
// GFLOP/s against OpenBLAS's 40-150 below 32 rows), so GEMMs of few rows go through it
// 8 rows at a time. Measured in docs/architecture.md.
extern "C" int dnnl_sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                          float beta, float* C, int64_t ldc);
extern "C" int dnnl_get_effective_cpu_isa(void);  // a dnnl_cpu_isa_t; ONEDNN_MAX_CPU_ISA caps it
// Whether oneDNN's kernels run AVX-512 here (bit 0x20 is set from avx512_core up), asked
// once: the routes between oneDNN and OpenBLAS are measured per ISA.
AS_SHARED bool as_dnnl_avx512() {
  static int isa = -1;
  int seen = __atomic_load_n(&isa, __ATOMIC_RELAXED);
  if (seen < 0) {
    seen = dnnl_get_effective_cpu_isa();
    __atomic_store_n(&isa, seen, __ATOMIC_RELAXED);
  }
  return (seen & 0x20) != 0;
}
// Each 8-row block reads all of B: more than one block only while B stays in half the
// L3 cache (AS_L3_BYTES, from sysfs at build time). GPT-2's 154 MB output projection,
// read from memory once per block, ran 2.8x slower. With AVX2 OpenBLAS catches up by 16
// rows and leads from 32 (181-225 GFLOP/s against 135-171 at 32-64 rows, BERT's and T5's
// weights, `python -m benchmarks.gemm_routes`); with AVX-512 the blocks lead to 64 rows.
static inline bool as_small_sgemm_fits(int64_t m, int64_t n, int64_t k) {
  const int64_t most_rows = as_dnnl_avx512() ? 64 : 16;
  return m <= 8 ||
         (m <= most_rows && n * k * (int64_t)sizeof(float) <= (int64_t)AS_L3_BYTES / 2);
}
static inline bool as_small_sgemm(CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                                  const float* a, int64_t lda, const float* b, int64_t ldb,
                                  float* c) {
  for (int64_t r = 0; r < m; r += 8) {
    const int64_t rows = m - r < 8 ? m - r : 8;
    if (dnnl_sgemm('N', tb == CblasTrans ? 'T' : 'N', rows, n, k, 1.0f, a + r * lda, lda, b,
                   ldb, 0.0f, c + r * n, n) != 0)
      return false;
  }
  return true;
}
// An operand read in place with rows a multiple of 2 KB apart (attention's heads in a
// [b, s, h, d] projection with h * d a multiple of 512 floats: T5's 8 x 64) gets a dense
// copy first, per GEMM, where the GEMM reads each of its rows 128 times or more: rows that
// far apart share few cache sets. T5-small at 4 x 256 tokens, `profile=True`, restricted
// to AVX2: probabilities x values 15.0-15.9 -> 10.0-11.5 ms; with AVX-512 the scores
// 13.0-13.5 -> 10.8-11.3 ms. (Rows 768 floats apart, BERT's and GPT-2's, measured level
// or slower copied.)
static inline bool as_far_rows(int64_t ld, int64_t cols, int64_t reads) {
  return ld > cols && ld % 512 == 0 && reads >= 128;
}
static inline void as_copy_rows(const float* src, int64_t lds, float* dst, int64_t rows,
                                int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * lds;
    float* d = dst + r * cols;
    #pragma omp simd
    for (int64_t c = 0; c < cols; ++c) d[c] = s[c];
  }
}
// Each thread's copies (a buffer of its own: a caller's as_scratch may be live).
AS_SHARED float* as_copy_scratch(int64_t floats) {
  static thread_local AsArena arena;
  return (float*)arena.reserve(floats * (int64_t)sizeof(float));
}
// Many GEMMs of one shape (attention's heads): whole GEMMs per thread, each through
// oneDNN's sgemm, which runs single-threaded inside the parallel loop. 180-220 GFLOP/s at
// BERT's attention shapes where OpenBLAS's batched call reached 115-170 (docs/architecture.md).
// False if any failed: the caller's OpenBLAS path then computes them all.
// The batch spans two dims (outer, inner): see as_view (a packed batch is inner = batch
// with strides m * k, k * n and m * n). C is packed (ldc = n).
static inline bool as_batch_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
                                  int64_t k, const float* a, int64_t lda, int64_t a_outer,
                                  int64_t a_inner, const float* b, int64_t ldb,
                                  int64_t b_outer, int64_t b_inner, float* c, int64_t ldc,
                                  int64_t c_outer, int64_t c_inner, int64_t outer,
                                  int64_t inner) {
  const char opa = ta == CblasTrans ? 'T' : 'N', opb = tb == CblasTrans ? 'T' : 'N';
  const int64_t a_rows = ta == CblasTrans ? k : m, a_cols = ta == CblasTrans ? m : k;
  const int64_t b_rows = tb == CblasTrans ? n : k, b_cols = tb == CblasTrans ? k : n;
  const bool copy_a = as_far_rows(lda, a_cols, n), copy_b = as_far_rows(ldb, b_cols, m);
  const int64_t a_floats = copy_a ? a_rows * a_cols : 0;
  const int64_t floats = a_floats + (copy_b ? b_rows * b_cols : 0);
  int failed = 0;
  #pragma omp parallel for schedule(static) reduction(|:failed)
  for (int64_t p = 0; p < outer * inner; ++p) {
    const float* ap = as_view(a, a_outer, a_inner, p, inner);
    const float* bp = as_view(b, b_outer, b_inner, p, inner);
    float* copies = floats ? as_copy_scratch(floats) : nullptr;
    if (floats && !copies) {
      failed = 1;
      continue;
    }
    if (copy_a) as_copy_rows(ap, lda, copies, a_rows, a_cols);
    if (copy_b) as_copy_rows(bp, ldb, copies + a_floats, b_rows, b_cols);
    failed |= dnnl_sgemm(opa, opb, m, n, k, 1.0f, copy_a ? copies : ap, copy_a ? a_cols : lda,
                         copy_b ? copies + a_floats : bp, copy_b ? b_cols : ldb, 0.0f,
                         as_view(c, c_outer, c_inner, p, inner), ldc) != 0;
  }
  return !failed;
}
#endif

// Row-major C[b] = op(A[b]) @ op(B[b]) over a packed batch. One big GEMM per batch entry
// uses OpenBLAS's threaded driver; many small ones go through its batched call, which
// spreads whole GEMMs across the threads.
template <class T>
static inline void as_gemm_batch(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
                                 int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
                                 T* c, int64_t batch) {
#ifdef ANYSHAPE_DNNL
  if constexpr (as_same<T, float>::value) {
    if (batch == 1 && ta == CblasNoTrans && as_small_sgemm_fits(m, n, k) &&
        as_small_sgemm(tb, m, n, k, a, lda, b, ldb, c))
      return;  // else (a oneDNN error) OpenBLAS computes it from scratch below
    if (batch >= 2 * omp_get_max_threads() &&
        as_batch_sgemm(ta, tb, m, n, k, a, lda, 0, m * k, b, ldb, 0, k * n, c, n, 0, m * n, 1,
                       batch))
      return;
  }
#endif
  const bool threaded_each = batch < 2 * omp_get_max_threads() || m * n * k >= (INT64_C(1) << 22);
  if (threaded_each) {
    for (int64_t p = 0; p < batch; ++p) {
      if constexpr (as_same<T, float>::value)
        scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                          a + p * m * k, (blasint)lda, b + p * k * n, (blasint)ldb, 0.0f,
                          c + p * m * n, (blasint)n);
      else
        scipy_cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0,
                          a + p * m * k, (blasint)lda, b + p * k * n, (blasint)ldb, 0.0,
                          c + p * m * n, (blasint)n);
    }
    return;
  }
  if constexpr (as_same<T, float>::value)
    scipy_cblas_sgemm_batch_strided(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k,
                                    1.0f, a, (blasint)lda, (blasint)(m * k), b, (blasint)ldb,
                                    (blasint)(k * n), 0.0f, c, (blasint)n, (blasint)(m * n),
                                    (blasint)batch);
  else
    scipy_cblas_dgemm_batch_strided(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k,
                                    1.0, a, (blasint)lda, (blasint)(m * k), b, (blasint)ldb,
                                    (blasint)(k * n), 0.0, c, (blasint)n, (blasint)(m * n),
                                    (blasint)batch);
}

// C[o, i] = op(A[o, i]) @ op(B[o, i]) over a batch of two dims (outer, inner), each
// operand's matrices at its own strides: attention reads its heads in place from the
// projections' [b, s, h, d] outputs (ld = h * d) instead of copying them to [b, h, s, d]
// first. C has leading dimension ldc. Many small GEMMs: whole GEMMs per thread through
// oneDNN's sgemm (as_batch_sgemm); otherwise one threaded BLAS call per GEMM.
template <class T>
static inline void as_gemm_views(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
                                 int64_t k, const T* a, int64_t lda, int64_t a_outer,
                                 int64_t a_inner, const T* b, int64_t ldb, int64_t b_outer,
                                 int64_t b_inner, T* c, int64_t ldc, int64_t c_outer,
                                 int64_t c_inner, int64_t outer, int64_t inner) {
  const int64_t batch = outer * inner;
  if (batch == 0) return;
#ifdef ANYSHAPE_DNNL
  if constexpr (as_same<T, float>::value) {
    if (batch >= 2 * omp_get_max_threads() &&
        as_batch_sgemm(ta, tb, m, n, k, a, lda, a_outer, a_inner, b, ldb, b_outer, b_inner, c,
                       ldc, c_outer, c_inner, outer, inner))
      return;
  }
#endif
  for (int64_t p = 0; p < batch; ++p) {
    if constexpr (as_same<T, float>::value)
      scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                        as_view(a, a_outer, a_inner, p, inner), (blasint)lda,
                        as_view(b, b_outer, b_inner, p, inner), (blasint)ldb, 0.0f,
                        as_view(c, c_outer, c_inner, p, inner), (blasint)ldc);
    else
      scipy_cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0,
                        as_view(a, a_outer, a_inner, p, inner), (blasint)lda,
                        as_view(b, b_outer, b_inner, p, inner), (blasint)ldb, 0.0,
                        as_view(c, c_outer, c_inner, p, inner), (blasint)ldc);
  }
}

#ifdef ANYSHAPE_DNNL
// A channels-last 1x1 convolution's epilogue in row blocks (conv_emit._fused_row_blocks):
// each thread's blocks of pixels, each block's GEMM and then its epilogue while the block
// is still in cache, instead of one GEMM and then a pass over the whole output. It pays
// once the output outgrows the caches: from 1 M floats with AVX-512 (the matmul whole
// runs at full speed below), from 512 K with AVX2, where the BLAS path it replaces is
// slower (docs/performance.md, "1x1 convolutions in row blocks").
static inline bool as_conv_rows_fused(int64_t rows, int64_t oc) {
  return rows * oc >= (as_dnnl_avx512() ? (INT64_C(1) << 20) : (INT64_C(1) << 19));
}
// Pixels per block: about 512 KB of output (at least 16 rows unless the threads
// outnumber the output's 16-row blocks), every thread the same number of blocks.
static inline int64_t as_conv_row_block(int64_t rows, int64_t oc) {
  const int64_t threads = omp_get_max_threads();
  const int64_t most = as_max64(16, (INT64_C(1) << 17) / oc);
  const int64_t per_thread = ((rows + most - 1) / most + threads - 1) / threads;
  return (rows + per_thread * threads - 1) / (per_thread * threads);
}
#endif

// A convolution's GEMM (weights x columns, both untransposed, one image). With oneDNN
// linked, its sgemm runs these 10-18 % faster than OpenBLAS at ResNet-50's 1x1 shapes
// (64-2048 rows, 196-3136 columns; docs/architecture.md, "Libraries"), but not below
// 128 columns.
template <class T>
static inline void as_conv_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                                const T* b, int64_t ldb, T* c) {
#ifdef ANYSHAPE_DNNL
  if constexpr (as_same<T, float>::value) {
    if (n >= 128 && dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n) == 0) return;
  }
#endif
  as_gemm_batch<T>(CblasNoTrans, CblasNoTrans, m, n, k, a, lda, b, ldb, c, 1);
}

// One image of a channels-last 2-D convolution without groups (x [h, wd, c], weights
// [o, c, kh, kw], y [oh, ow, o]) as im2col + one GEMM: what a kernel runs when oneDNN
// cannot run its convolution. One function for every such kernel, so a kernel compiles
// only its oneDNN call and its epilogue (ResNet-50's build: 1.49 -> 1.28 s). A 1x1 kernel
// with unit stride and no padding reads the image in place. False when out of memory.
template <class T>
static bool as_conv2d_nhwc(const T* x, const T* w, T* y, int64_t c, int64_t o, int64_t h,
                           int64_t wd, int64_t oh, int64_t ow, int64_t kh, int64_t kw,
                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                           int64_t dw) {
  const int64_t taps = kh * kw, rows = c * taps, positions = oh * ow;
  const T* a = x;
  if (!(taps == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0)) {
    T* col = (T*)as_scratch((int64_t)sizeof(T) * rows * positions);
    if (!col) return false;
    #pragma omp parallel for schedule(static) if(rows * positions > 32768)
    for (int64_t p = 0; p < positions; ++p) {
      T* d = col + p * rows;
      const int64_t o0 = p / ow, o1 = p % ow;
      for (int64_t k0 = 0; k0 < kh; ++k0) {
        const int64_t y0 = o0 * sh - ph + k0 * dh;
        for (int64_t k1 = 0; k1 < kw; ++k1) {
          const int64_t y1 = o1 * sw - pw + k1 * dw, tap = k0 * kw + k1;
          if (y0 >= 0 && y0 < h && y1 >= 0 && y1 < wd) {
            const T* s = x + (y0 * wd + y1) * c;
            for (int64_t ch = 0; ch < c; ++ch) d[ch * taps + tap] = s[ch];
          } else {
            for (int64_t ch = 0; ch < c; ++ch) d[ch * taps + tap] = (T)0;
          }
        }
      }
    }
    a = col;
  }
  as_gemm_batch<T>(CblasNoTrans, CblasTrans, positions, o, rows, a, rows, w, rows, y, 1);
  return true;
}

// A copy that transposes: dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (the
// kernel of a transpose that moves the last dim, e.g. attention keys [b, s, h, d] ->
// [b, h, d, s]). Element by element, each read strides a whole source row: T5-small's
// [2, 128, 8, 64] keys took 0.08 ms, 6.5 GB/s; 0.01 ms here. 8x8 tiles of 4-byte elements
// go through registers (the compiler's vector shuffles: no intrinsics header to parse,
// any ISA), the rest in 16x16 blocks.
typedef float as_v8f __attribute__((vector_size(32)));
typedef int32_t as_v8i __attribute__((vector_size(32)));
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define AS_SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
  __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#endif
#endif
#ifndef AS_SHUFFLE8  // (GCC before 12)
#define AS_SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
  __builtin_shuffle(a, b, (as_v8i){i0, i1, i2, i3, i4, i5, i6, i7})
#endif
AS_INLINE void as_transpose8x8(const char* src, int64_t lds, char* dst, int64_t ldd) {
  as_v8f r[8], t[8], u[8];
  for (int k = 0; k < 8; ++k) __builtin_memcpy(&r[k], src + k * lds, 32);
  for (int k = 0; k < 8; k += 2) {
    t[k] = AS_SHUFFLE8(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = AS_SHUFFLE8(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = AS_SHUFFLE8(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 1] = AS_SHUFFLE8(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[k + 2] = AS_SHUFFLE8(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 3] = AS_SHUFFLE8(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int k = 0; k < 4; ++k) {
    const as_v8f a = AS_SHUFFLE8(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const as_v8f b = AS_SHUFFLE8(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    __builtin_memcpy(dst + k * ldd, &a, 32);
    __builtin_memcpy(dst + (k + 4) * ldd, &b, 32);
  }
}
// rows [r0, r1) x cols [c0, c1) of as_transpose2d, element by element in 16x16 blocks.
template <class T>
static void as_transpose_blocks(const T* __restrict__ src, int64_t lds, T* __restrict__ dst,
                                int64_t ldd, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t rb = r0; rb < r1; rb += 16)
    for (int64_t cb = c0; cb < c1; cb += 16)
      for (int64_t c = cb; c < as_min64(c1, cb + 16); ++c)
        for (int64_t r = rb; r < as_min64(r1, rb + 16); ++r) dst[c * ldd + r] = src[r * lds + c];
}
template <class T>
static void as_transpose2d(const T* __restrict__ src, int64_t lds, T* __restrict__ dst,
                           int64_t ldd, int64_t rows, int64_t cols) {
  int64_t r8 = 0, c8 = 0;
  if constexpr (sizeof(T) == 4) {
    r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int64_t r = 0; r < r8; r += 8)
      for (int64_t c = 0; c < c8; c += 8)
        as_transpose8x8((const char*)(src + r * lds + c), lds * 4, (char*)(dst + c * ldd + r),
                        ldd * 4);
  }
  as_transpose_blocks(src, lds, dst, ldd, 0, r8, c8, cols);  // the tiles' right edge
  as_transpose_blocks(src, lds, dst, ldd, r8, rows, 0, cols);  // and the rows below them
}

// OpenBLAS runs its parallel work on anyshape's OpenMP pool: one thread pool in the process.
static void as_blas_threads(int sync, openblas_dojob_callback dojob, int numjobs,
                            size_t jobdata_elsize, void* jobdata, int dojob_data) {
  (void)sync;
  #pragma omp parallel for schedule(static)
  for (int i = 0; i < numjobs; ++i)
    dojob(i, (char*)jobdata + (size_t)i * jobdata_elsize, dojob_data);
}

// Threads per call. OpenMP's thread count is per calling thread, so every call sets it
// for the thread it runs on (a Python thread other than the loader's would get the default).
AS_SHARED int as_threads = 0;
static inline void as_enter_threads() {
  if (as_threads > 0 && omp_get_max_threads() != as_threads) omp_set_num_threads(as_threads);
}

#ifdef AS_WITH_API
extern "C" void anyshape_init(int num_threads) {
  as_threads = num_threads;
  if (num_threads > 0) omp_set_num_threads(num_threads);
  scipy_openblas_set_threads_callback_function(as_blas_threads);
  scipy_openblas_set_num_threads(num_threads > 0 ? num_threads : omp_get_max_threads());
}
#endif

// Output buffers: the caller owns them and frees them with anyshape_free. malloc serves
// large blocks from fresh mmap pages, so every call would fault in and zero its outputs
// anew (GPT-2's logits at 4x128 tokens, 103 MB). Freed blocks of AS_OUT_MIN bytes and more
// are kept instead (AS_OUT_KEEP blocks, AS_OUT_KEEP_BYTES in all; the smallest goes first)
// and an output takes the smallest kept block it fits in that is at most twice its size.
// Each block starts with a 64-byte header holding its size.
#define AS_OUT_MIN (INT64_C(1) << 20)
#define AS_OUT_KEEP 8
#define AS_OUT_KEEP_BYTES (INT64_C(1) << 30)
AS_SHARED pthread_mutex_t as_out_mu = PTHREAD_MUTEX_INITIALIZER;
AS_SHARED char* as_out_kept[AS_OUT_KEEP + 1];
AS_SHARED int as_out_nkept = 0;
AS_SHARED int64_t as_out_kept_bytes = 0;

static inline int64_t as_out_size(const char* base) { return *(const int64_t*)base; }

static void* as_out_alloc(int64_t bytes) {
  const int64_t n = as_round64(bytes);
  if (n >= AS_OUT_MIN) {
    pthread_mutex_lock(&as_out_mu);
    int best = -1;
    for (int k = 0; k < as_out_nkept; ++k)
      if (as_out_size(as_out_kept[k]) >= n && as_out_size(as_out_kept[k]) <= 2 * n &&
          (best < 0 || as_out_size(as_out_kept[k]) < as_out_size(as_out_kept[best])))
        best = k;
    char* hit = best >= 0 ? as_out_kept[best] : nullptr;
    if (hit) {
      as_out_kept_bytes -= as_out_size(hit);
      as_out_kept[best] = as_out_kept[--as_out_nkept];
    }
    pthread_mutex_unlock(&as_out_mu);
    if (hit) return hit + 64;
  }
  char* base = (char*)aligned_alloc(64, (size_t)(n + 64));
  if (!base) return nullptr;
  *(int64_t*)base = n;
  return base + 64;
}

// The same allocator for runtimes that copy an output (one that is an input or a weight):
// anyshape_free takes every output back.
#ifdef AS_WITH_API
extern "C" void* anyshape_alloc(int64_t bytes) { return as_out_alloc(bytes); }

extern "C" void anyshape_free(void* p) {
  if (!p) return;
  char* base = (char*)p - 64;
  const int64_t n = as_out_size(base);
  if (n < AS_OUT_MIN || n > AS_OUT_KEEP_BYTES) {
    free(base);
    return;
  }
  char* dropped[AS_OUT_KEEP + 1];
  int ndropped = 0;
  pthread_mutex_lock(&as_out_mu);
  as_out_kept[as_out_nkept++] = base;  // one spare entry: the array is AS_OUT_KEEP + 1
  as_out_kept_bytes += n;
  while (as_out_nkept > AS_OUT_KEEP || as_out_kept_bytes > AS_OUT_KEEP_BYTES) {
    // Over the limits: the smallest kept block goes (the new one, if it is the smallest).
    int small = 0;
    for (int k = 1; k < as_out_nkept; ++k)
      if (as_out_size(as_out_kept[k]) < as_out_size(as_out_kept[small])) small = k;
    dropped[ndropped++] = as_out_kept[small];
    as_out_kept_bytes -= as_out_size(as_out_kept[small]);
    as_out_kept[small] = as_out_kept[--as_out_nkept];
  }
  pthread_mutex_unlock(&as_out_mu);
  for (int k = 0; k < ndropped; ++k) free(dropped[k]);
}
#endif

// Per-call-site timing, off unless anyshape_profile_enable(1): one branch per kernel call.
AS_SHARED int as_prof_on = 0;
#ifdef AS_WITH_API
extern "C" void anyshape_profile_enable(int on) { as_prof_on = on; }
#endif
