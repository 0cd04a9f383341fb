// The runtime's GEMM glue (pasted after prelude.h, codegen/cpu/host.py): the routes
// between oneDNN's sgemm and OpenBLAS for the dot kernels (gemm_emit: as_gemm_batch,
// as_gemm_views) and the convolutions' GEMMs (conv_emit: as_conv_gemm, as_conv2d_nhwc,
// the row blocks of a 1x1 convolution). oneDNN's own call sites (its matmul and
// convolution primitives) are dnnl.h, dnnl_conv.h and dnnl_matmul.h.

// GEMM p of a batch over two dims (outer, inner), an operand's matrices `o` apart along
// the outer dim and `i` apart along the inner one (as_gemm_views, as_batch_sgemm).
template <class T>
AS_INLINE T* as_view(T* base, int64_t o, int64_t i, int64_t p, int64_t inner) {
  return base + (p / inner) * o + (p % inner) * i;
}

// Each thread's operand copies (as_batch_sgemm) or attention blocks (attention_emit): a
// buffer of its own, as a caller's as_scratch may be live (a softmax's row buffer).
AS_SHARED float* as_copy_scratch(int64_t floats) {
  static thread_local AsArena arena;
  return (float*)arena.reserve(floats * (int64_t)sizeof(float));
}

#ifdef ANYSHAPE_DNNL
// Each 8-row block reads all of B: more than one block only while B stays in a core's L2
// cache (AS_L2_BYTES, from sysfs at build time). A model's weights stream from memory or
// the L3, and from there each block pays the whole read again: distinct layers all reading
// one input (`python -m benchmarks.gemm_routes --chain`, Intel Xeon, 2 MB L2, GFLOP/s
// blocks / OpenBLAS) with AVX-512 at 32 rows 48-61 / 80-123 for BERT's and GPT-2's 768 x
// 2304 to 3072 x 768 and 59-61 / 88-80 for T5's 512 x 2048, at 51-64 rows 58-82 / 103-168;
// the 1 MB 512 x 512 at 16-51 rows 112-139 / 69-118, level at 64. (Judged on one weight
// called again and again, which stays in cache, the bound was half the L3: on a 260 MB L3
// every weight but a vocabulary head passed it.) With AVX2 OpenBLAS catches up by 16
// rows and leads from 32 (181-225 GFLOP/s against 135-171 at 32-64 rows, BERT's and T5's
// weights, `python -m benchmarks.gemm_routes`); with AVX-512 the blocks lead to 64 rows
// on a weight in cache. Which weights take this route: those nobody watches (training,
// `dynamo_weights=False`) and a watched weight's first use in a layout
// (`as_packed_weights`), from 9 rows up.
static inline bool as_small_sgemm_fits(int64_t m, int64_t n, int64_t k) {
  const int64_t most_rows = as_dnnl_avx512() ? 64 : 16;
  return m <= 8 ||
         (m <= most_rows && n * k * (int64_t)sizeof(float) <= (int64_t)AS_L2_BYTES);
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
// An operand read in place with rows `as_rows_alias` apart (attention's heads in a
// [b, s, h, d] projection with h * d a multiple of 512 floats: T5's 8 x 64) gets a dense
// copy first, per GEMM, where the GEMM reads each of its rows 128 times or more: rows that
// far apart share few cache sets. T5-small at 4 x 256 tokens, `profile=True`, restricted
// to AVX2: probabilities x values 15.0-15.9 -> 10.0-11.5 ms; with AVX-512 the scores
// 13.0-13.5 -> 10.8-11.3 ms. (Rows 768 floats apart, BERT's and GPT-2's, measured level
// or slower copied.)
static inline bool as_far_rows(int64_t ld, int64_t cols, int64_t reads) {
  return ld > cols && as_rows_alias(ld) && reads >= 128;
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

// Fused attention (attention_emit): per batch entry and block of query rows, on one thread,
// the scores into a buffer of the thread's, the softmax rows into a second one, then the
// values GEMM into the output rows; the score matrix never reaches memory. BERT-base with
// AVX-512 at 4 x 502 tokens, one layer's attention: 24.2 -> 14.3 ms (docs/performance.md).
// Rows per block: both buffers (2 x rows x n floats) within 256 KB of the core's L2, 8 to
// 64 rows (each GEMM then has rows enough to run at its speed).
static inline int64_t as_attention_rows(int64_t n) {
  const int64_t rows = INT64_C(32768) / as_max64(n, 1);
  return rows >= 64 ? 64 : rows < 8 ? 8 : rows / 8 * 8;
}
// One GEMM of a block, row-major, on the calling thread: oneDNN's sgemm runs single-threaded
// inside the parallel region; OpenBLAS (a build without oneDNN, or a oneDNN error) hands its
// jobs to the OpenMP pool (as_blas_threads), whose nested region runs them on this thread.
// k == 0 writes zeros, as a GEMM over an empty sum does.
static inline void as_block_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
                                  int64_t k, const float* a, int64_t lda, const float* b,
                                  int64_t ldb, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = 0;
    return;
  }
#ifdef ANYSHAPE_DNNL
  if (dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', m, n, k, 1.0f, a,
                 lda, b, ldb, 0.0f, c, ldc) == 0)
    return;
#endif
  scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0f, a,
                    (blasint)lda, b, (blasint)ldb, 0.0f, c, (blasint)ldc);
}

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
// A channels-last 1x1 convolution's epilogue in row blocks (conv_emit._row_blocks):
// each thread's blocks of pixels, each block's GEMM and then its epilogue while the block
// is still in cache, instead of one GEMM and then a pass over the whole output. It pays
// once the output outgrows the caches: from 1 M floats with AVX-512 (the matmul whole
// runs at full speed below), from 512 K with AVX2, where the BLAS path it replaces is
// slower (docs/performance.md, "1x1 convolutions in row blocks").
static inline bool as_conv_rows_fused(int64_t rows, int64_t oc) {
  return rows * oc >= (as_dnnl_avx512() ? (INT64_C(1) << 20) : (INT64_C(1) << 19));
}
#endif
// Pixels per block: about 512 KB of output (at least 16 rows unless the threads
// outnumber the output's 16-row blocks), every thread the same number of blocks.
static inline int64_t as_conv_row_block(int64_t rows, int64_t oc) {
  const int64_t threads = omp_get_max_threads();
  const int64_t most = as_max64(16, (INT64_C(1) << 17) / as_max64(oc, 1));
  const int64_t per_thread = ((rows + most - 1) / most + threads - 1) / threads;
  return (rows + per_thread * threads - 1) / (per_thread * threads);
}

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
