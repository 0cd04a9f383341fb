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
// Whether rows `ld` floats apart, a multiple of 2 KB, share so few cache sets that a
// GEMM reading them in place runs slowly (restricted to AVX2: oneDNN's matmul on GPT-2-like
// [k, n] weights 1024 or 2048 wide at half speed, T5's attention heads 8 x 64 wide at 136
// GFLOP/s against 214 a cache line further apart); 768 floats apart measured fine.
AS_INLINE bool as_rows_alias(int64_t ld) { return ld % 512 == 0; }
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
#endif

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
