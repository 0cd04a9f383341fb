// anyshape CPU runtime: GEMMs against a model weight through oneDNN's matmul (plugin mode,
// when installed). Pasted after dnnl.h into translation units that hold such a GEMM.
//
// A linear layer multiplies activations of any row count by a weight of fixed shape. With
// the weight reordered once into the layout oneDNN's matmul picks for it, that matmul ran
// BERT's and GPT-2's linear layers at 220-231 GFLOP/s from 8 to 2048 rows on the 2-core
// Zen 4 machine, where OpenBLAS (which packs the weight again on every call) reached
// 80-215 and oneDNN's sgemm 40-220 (docs/architecture.md, "Libraries"). oneDNN's run-time
// dimensions let one primitive per call site serve every row count: it is made on the
// site's first call (0.03-1.5 ms) and never again.

// One call site: the weight's static shape, the primitive and its layers' packed weights.
struct AsMatmulSite {
  // (The geometry first, then the weights: as_site_for matches and copies the geometry,
  // and a static site is initialized as {geometry, {mutex}}, gemm_emit.dnnl_site.)
  int64_t k, n;
  int64_t transposed;  // the model holds the weight as [n, k] (nn.Linear), else [k, n]
  int64_t mode;        // AS_MATMUL_AUTO, AS_MATMUL_ALWAYS or AS_MATMUL_NO_FEW (routes.py)
  AsWeightsCache weights;
  int64_t panels;      // the GEMM as this many matmuls over column panels (as_matmul_panels)
  dnnl_primitive_t matmul;
  dnnl_memory_desc_t plain, packed, scratch;
  int64_t scratch_bytes;
  bool made, broken;  // broken: oneDNN refused it, the caller's GEMM runs instead
  bool in_place;      // the primitive reads the weight as the model holds it: no copy
  bool transposes;    // its packed layout is the [n, k] weight's panel transposed, row-major
  int64_t ld;         // a packed panel's rows this many floats apart (as_packed_ld)
  dnnl_memory_desc_t few;   // the layout of as_few_rows_gemm's panels (made on first use)
  dnnl_memory_desc_t rows;  // the layout of as_rows_gemm's panels (made on first use)
};

// A site's mode (Route.site_mode in routes.py): up to AS_FEW_ROWS rows on as_few_rows_gemm,
// more on oneDNN's matmul where as_matmul_pays; every row count on the matmul; the matmul
// where it pays (option few_rows_gemm=False: no copy of the weight for few rows).
enum { AS_MATMUL_AUTO = 0, AS_MATMUL_ALWAYS = 1, AS_MATMUL_NO_FEW = 2 };

// c[m, n] = a[m, k] @ w, or false (below); the site of a kernel for a [k, n] weight.
AS_GLUE_ENTRY bool as_dnnl_matmul(AsMatmulSite* s, const float* a, const float* w, float* c,
                                  int64_t m);
AS_GLUE_ENTRY AsMatmulSite* as_matmul_site(AsSiteTable* t, int64_t k, int64_t n,
                                           int64_t transposed, int64_t mode);
// The site's weight in as_rows_gemm's panels (packed on its second use), or null: the
// caller's routes run (a weight nobody watches, its first use, out of memory).
AS_GLUE_ENTRY const float* as_rows_panels(AsMatmulSite* s, const float* w);
// c[m, n] (rows n apart) = a[m, k] @ a weight in as_rows_gemm's `panels`, on the calling
// thread.
AS_GLUE_ENTRY void as_rows_gemm(int64_t m, int64_t n, int64_t k, const float* a,
                                const float* panels, float* c);

// A convolution with few input channels (an image network's stem: 3 channels, 7 x 7
// taps): its OIHW weight [n, c, taps] read as a [k = taps x c, n] one, rows in the order of
// a channels-last window (tap, then channel), which as_rows_gemm multiplies by the windows
// of a row of output pixels (conv_emit._conv_taps).
struct AsTapsSite {
  int64_t k, n, c;  // (the geometry first, as AsMatmulSite's)
  AsWeightsCache weights;
  dnnl_memory_desc_t rows;  // the layout of the panels (made on first use)
  bool broken;              // no site could be made (as_site_for): the caller's path runs
};
AS_GLUE_ENTRY AsTapsSite* as_taps_site(AsSiteTable* t, int64_t k, int64_t n, int64_t c);
// The site's weight in as_rows_gemm's panels (packed on its second use), or null.
AS_GLUE_ENTRY const float* as_taps_panels(AsTapsSite* s, const float* w);

#ifdef AS_DNNL_GLUE_OBJECT

#define AS_DNNL_RUNTIME_DIM INT64_MIN

// Whether oneDNN's matmul beats the BLAS path (as_gemm_batch: oneDNN's sgemm 8 rows at a
// time for few rows, else OpenBLAS) for m rows against a [k, n] weight, on the ISA oneDNN
// runs. Measured with `python -m benchmarks.gemm_routes` on the 2-core Zen 4, with AVX-512
// and restricted to AVX2 (docs/architecture.md, "GEMM routes per ISA"):
// - below 4 rows the sgemm path wins on both (AVX-512: 156-259 GFLOP/s against 85-260 at
//   2-3 rows);
// - with AVX-512 the matmul wins from 4 rows up (390-515 against 215-290 at 64-1024 rows);
// - with AVX2 it wins from 4 rows up on weights at most 3x wider than deep (BERT's, T5's
//   attention and down projections: 180-270 against 90-225 to 127 rows) and loses on
//   wider ones (512x2048, 768x3072: 100-165 against 150-230), which therefore run as
//   panels of such a shape (as_matmul_panels: `n` here is a panel's width). With the
//   packed panels' rows a cache line apart (as_packed_ld) it also leads from 512 rows in
//   whole models, whose weights stream from memory (interleaved in one process, ms, BLAS
//   -> matmul: T5-small 4 x 128 157 -> 152, 3 x 200 210 -> 189, 8 x 256 767 -> 756;
//   BERT-base 4 x 128 531 -> 493, 3 x 200 643 -> 590, 8 x 256 2480 -> 2399, 4 x 512 2362
//   -> 2259; GPT-2 small 4 x 128 757 -> 720, 8 x 128 1593 -> 1533, 8 x 256 2787 -> 2639;
//   level: BERT-base 8 x 128, 16 x 128 and 8 x 512 (4656 / 4505 in one run, 4741 / 4908
//   in the next), T5-small 16 x 128 and 8 x 512, GPT-2 small 8 x 512, ResNet-50's 1x1
//   convolutions). One cached weight called again and again (`benchmarks.gemm_routes`)
//   had the two level or BLAS ahead from 512 rows; distinct weights all reading one
//   input (`--chain`) have the matmul ahead at 512 rows (149-178 against 126-176
//   GFLOP/s), mixed at 1024 and behind at 2048 (157-183 against 168-203), where that
//   input stays in cache and each layer writes an output of its own, as a model's
//   layers do not.
// - with AVX-512 and a weight stored [n, k] (nn.Linear), the sgemm path, reading the
//   weight in place, wins again at 4-8 rows in a model whose weights stream from memory
//   (whole models, `profile`-free, interleaved: BERT-base at 1 x 8 tokens 25.0 -> 20.1 ms,
//   1 x 4 19.8 -> 18.1, T5-small at 1 x 8 11.4 -> 10.7; level at 16 rows, behind from 32;
//   with AVX2 level or behind, and for GPT-2's [k, n] weights behind).
// - a vocabulary head (a weight over 3x wider than deep that no panel cut fits, streaming
//   from memory: over half the L3) runs the matmul whole, also with AVX2: 768 x 50257
//   (GPT-2's, tied to its embedding) and 512 x 32128, `benchmarks.gemm_routes`, matmul
//   against the BLAS path, restricted to AVX2, 83-93 / 55 GFLOP/s at 16 rows, 176-184 /
//   119-123 at 64, level from 512 (199 / 198 at 512, 211 / 203 at 1024). (Up to
//   AS_FEW_ROWS rows a watched weight runs as_few_rows_gemm before any of this.)
static inline bool as_matmul_pays(int64_t m, int64_t k, int64_t n, bool transposed) {
  if (n > 3 * k && n * k * (int64_t)sizeof(float) > (int64_t)AS_L3_BYTES / 2) return m >= 4;
  if (m < 4) return false;
  if (as_dnnl_avx512()) return !(transposed && m <= 8);
  return n <= 3 * k;
}

// Column panels a [k, n] weight's matmul runs as: with AVX2, oneDNN's matmul on a weight
// over 3x wider than deep ran at 100-165 GFLOP/s where its square panels run at 200-250
// (768 x 3072 against four 768 x 768 at 16-96 rows: 141-157 against 201-250; the BLAS
// path 157-229; `python -m benchmarks.gemm_routes`, Zen 5 restricted to AVX2, one thread
// 76 against 124): so such a weight is cut into the fewest equal panels at most as wide
// as deep, a multiple of 8 columns each, one matmul per panel writing its columns of the
// output. Panels stay at least 256 columns wide and at most 16: each costs a primitive
// execution (a few us), and thinner ones lost to BLAS (128 x 512 as four panels of 128,
// 24 % slower at 16 rows; 64 x 256, 2x; 16 x 1024 as 64 panels, 6x). 1 (no cut) with
// AVX-512, for weights at most 3x wider, or when no cut fits (a vocabulary head).
static inline int64_t as_matmul_panels(int64_t k, int64_t n) {
  if (as_dnnl_avx512() || n <= 3 * k) return 1;
  const int64_t most = n / 256 < 16 ? n / 256 : 16;
  for (int64_t p = (n + k - 1) / k; p <= most; ++p)
    if (n % p == 0 && (n / p) % 8 == 0) return p;
  return 1;
}

// GEMMs oneDNN ran, for tests and diagnostics (as_few_rows_gemm or BLAS runs the others).
AS_SHARED int64_t as_dnnl_matmul_runs = 0;
extern "C" int64_t anyshape_dnnl_matmul_runs() {
  return __atomic_load_n(&as_dnnl_matmul_runs, __ATOMIC_RELAXED);
}

// Row-major [m, cols] with m left to run time (AS_DNNL_RUNTIME_DIM) or given, rows `ld`
// apart (default: cols).
static dnnl_memory_desc_t as_rows_md(int64_t m, int64_t cols, int64_t ld = 0) {
  dnnl_dims_t dims = {m, cols}, strides = {ld ? ld : cols, 1};
  dnnl_memory_desc_t md = nullptr;
  return dnnl_memory_desc_create_with_strides(&md, 2, dims, AS_DNNL_F32, strides) == 0 ? md
                                                                                        : nullptr;
}

// Row stride of a packed [k, np] panel that oneDNN reads row-major (its gemm:jit): np
// rounded up to 16 floats and one cache line more, never a multiple of 1 KB. With rows a
// power of two or a multiple of 1 KB apart, the rows a kernel reads together share few
// cache sets: on a 2-core AMD EPYC (Zen 4) restricted to AVX2 (`python -m
// benchmarks.avx2_only -- python -m benchmarks.gemm_routes`), T5-small's 512 x 512 at 64
// rows ran at 124 GFLOP/s rows 512 apart and 201 rows 528 apart, 2048 x 512 125 -> 214,
// 3072 x 3072 at 32 rows 78 -> 173, BERT's 768 x 768 168 -> 200, 768 x 1008 with rows
// 1024 apart 98 against 196-210 at 1040; with AVX-512 level or a few percent faster.
static inline int64_t as_packed_ld(int64_t np) {
  const int64_t ld = (np + 15) / 16 * 16 + 16;
  return ld % 256 == 0 ? ld + 16 : ld;
}

// The matmul of one panel against weights laid out as `weights` (or AS_DNNL_TAG_ANY: the
// layout oneDNN picks), into s->matmul, s->packed and s->scratch.
AS_SETUP static bool as_matmul_with(AsMatmulSite* s, const_dnnl_memory_desc_t weights) {
  const int64_t np = s->n / s->panels;
  dnnl_memory_desc_t src = as_rows_md(AS_DNNL_RUNTIME_DIM, s->k);
  dnnl_memory_desc_t dst = as_rows_md(AS_DNNL_RUNTIME_DIM, np, s->n);
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  bool ok =
      src && dst && dnnl_primitive_attr_create(&attr) == 0 &&
      dnnl_primitive_attr_set_scratchpad_mode(attr, AS_DNNL_SCRATCHPAD_USER) == 0 &&
      dnnl_matmul_primitive_desc_create(&pd, as_dnnl_engine(), src, weights, nullptr, dst, attr) == 0 &&
      dnnl_primitive_create(&s->matmul, pd) == 0 &&
      dnnl_memory_desc_clone(&s->packed, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_WEIGHTS_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&s->scratch, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_SCRATCHPAD_MD, 0)) == 0;
  dnnl_memory_desc_t described[] = {src, dst};
  as_dnnl_release(pd, attr, described, 2);
  if (ok) s->scratch_bytes = as_round64((int64_t)dnnl_memory_desc_get_size(s->scratch));
  return ok;
}

// What as_matmul_with made (or the part it made before failing), released.
AS_SETUP static void as_matmul_forget(AsMatmulSite* s) {
  if (s->matmul) dnnl_primitive_destroy(s->matmul);
  if (s->packed) dnnl_memory_desc_destroy(s->packed);
  if (s->scratch) dnnl_memory_desc_destroy(s->scratch);
  s->matmul = nullptr;
  s->packed = s->scratch = nullptr;
}

// The matmul of one panel (all of the weight without panels): weights [k, n / panels] read
// with the whole weight's strides, the output's rows n apart. Where oneDNN reads a packed
// panel row-major (its gemm:jit), the panel's rows are copied `as_packed_ld` apart (a
// weight it reads in place, [k, n] as the model holds it and not cut, keeps its rows
// unless they are `as_rows_alias` apart: GPT-2's 768 and 2304 wide read in place).
AS_SETUP static bool as_matmul_make(AsMatmulSite* s) {
  const int64_t np = s->n / s->panels;
  dnnl_dims_t wdims = {s->k, np};
  dnnl_dims_t wstrides = {s->transposed ? 1 : s->n, s->transposed ? s->k : 1};
  dnnl_memory_desc_t any = nullptr;
  bool ok =
      dnnl_memory_desc_create_with_strides(&s->plain, 2, wdims, AS_DNNL_F32, wstrides) == 0 &&
      dnnl_memory_desc_create_with_tag(&any, 2, wdims, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0 &&
      as_matmul_with(s, any);
  if (ok) s->in_place = dnnl_memory_desc_equal(s->plain, s->packed) && !as_rows_alias(s->n);
  s->ld = np;
  if (ok && !s->in_place) {
    dnnl_memory_desc_t rows = as_rows_md(s->k, np);
    const bool row_major = rows && dnnl_memory_desc_equal(rows, s->packed);
    if (rows) dnnl_memory_desc_destroy(rows);
    s->transposes = row_major && s->transposed;
    dnnl_memory_desc_t padded = row_major ? as_rows_md(s->k, np, as_packed_ld(np)) : nullptr;
    if (padded) {
      as_matmul_forget(s);
      s->ld = as_packed_ld(np);
      if (!as_matmul_with(s, padded)) {  // (refused: the layout oneDNN picked, rows np apart)
        as_matmul_forget(s);
        s->ld = np;
        ok = as_matmul_with(s, any);
      }
      dnnl_memory_desc_destroy(padded);
    }
  }
  if (any) dnnl_memory_desc_destroy(any);
  return ok;
}

// Few rows (decoding, short requests): the GEMM streams the weight from memory once, and
// oneDNN's matmul reads its row-major packed copy at 10-17 GB/s at 1-16 rows, where the
// machine streams 25-36. as_few_rows_gemm reads its own copy, column panels of AS_FEW_NB
// each stored [k][AS_FEW_NB] (zero past n), so every thread streams a contiguous run;
// per panel AS_FEW_MR rows at a time keep 3 x AS_FEW_MR vector accumulators in registers
// (12 of AVX2's 16, 24 of AVX-512's 32). A chain of 96 distinct 512 x 512 weights (100 MB,
// 2-core AMD EPYC, Zen 4), ms per chain, this kernel against the routes it replaces: restricted
// to AVX2, 1 row 2.95-3.7 / 7.7, 8 rows 4.5-5.1 / 8.8, 16 rows 6.7 / 9.0, 32 rows 10.7-10.8
// / 10.2-11.2, 48 rows 15.9 / 15.5 (hence AS_FEW_ROWS); with AVX-512, 8 rows 4.6 / 6.9,
// 32 rows 10.2 / 11.4, 48 rows 14.6 / 13.9 (docs/architecture.md, "GEMM routes per ISA").
// The copy is the weight's size again, made for the sites that meet a row count this
// small a second time; a weight nobody watches is not copied (as_packed_weights) and takes
// the routes below, as a watched one does the first time.
#define AS_FEW_ROWS 32

// Tiles of a GEMM by a weight in column panels (the few-rows kernel's and as_rows_gemm's):
// AS_VEC_V floats a vector, a panel NV vectors wide, stored [k][NV x AS_VEC_V] (zero past n).
#ifdef __AVX512F__
#define AS_VEC_V 16
#else
#define AS_VEC_V 8
#endif
typedef float AsPanelVec __attribute__((vector_size(AS_VEC_V * 4)));
typedef float AsPanelLoad __attribute__((vector_size(AS_VEC_V * 4), aligned(4)));

// c[R, cols] = a[R, k] (rows k apart) @ one panel w [k][NV x AS_VEC_V] (cols of it kept;
// rows ldc apart). With Prefetch, the next tile's rows a line at a time, two lines ahead:
// for many rows fresh from memory, whose R streams the hardware's prefetcher follows at one
// float a step too late (as_rows_gemm: AVX-512 3.1-3.4 -> 2.6-2.8 ms, AVX2 5.4-5.6 -> 4.3-4.4
// ms in its measurement below).
template <int R, int NV, bool Prefetch>
static inline void as_panel_tile(const float* __restrict__ a, const float* __restrict__ w,
                                 int64_t k, float* __restrict__ c, int64_t ldc, int64_t cols) {
  constexpr int64_t nb = NV * AS_VEC_V;
  AsPanelVec acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = AsPanelVec{};
  for (int64_t kk = 0; kk < k; ++kk) {
    if (Prefetch && (kk & 15) == 0)
      for (int r = 0; r < R; ++r) __builtin_prefetch(a + (R + r) * k + kk + 32);
    const float* wk = w + kk * nb;
    AsPanelVec wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = *(const AsPanelLoad*)(wk + j * AS_VEC_V);
    for (int r = 0; r < R; ++r) {
      const float x = a[r * k + kk];
      for (int j = 0; j < NV; ++j) acc[r][j] += x * wv[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    if (cols == nb) {
      for (int j = 0; j < NV; ++j) *(AsPanelLoad*)(c + r * ldc + j * AS_VEC_V) = acc[r][j];
    } else {
      float row[nb];
      memcpy(row, acc[r], sizeof(row));
      memcpy(c + r * ldc, row, sizeof(float) * cols);
    }
  }
}

// The last `left` (< R + 1) rows of as_panel_rows, as one tile of that many.
template <int R, int NV, bool Prefetch>
static inline void as_panel_rest(int64_t left, const float* a, const float* w, int64_t k,
                                 float* c, int64_t ldc, int64_t cols) {
  if constexpr (R > 0) {
    if (left == R)
      as_panel_tile<R, NV, Prefetch>(a, w, k, c, ldc, cols);
    else
      as_panel_rest<R - 1, NV, Prefetch>(left, a, w, k, c, ldc, cols);
  }
}

// c[m, cols] = a[m, k] @ one panel: MR rows a tile, then the rest as one smaller tile.
template <int MR, int NV, bool Prefetch>
static inline void as_panel_rows(int64_t m, const float* a, const float* w, int64_t k,
                                 float* c, int64_t ldc, int64_t cols) {
  int64_t r = 0;
  for (; r + MR <= m; r += MR)
    as_panel_tile<MR, NV, Prefetch>(a + r * k, w, k, c + r * ldc, ldc, cols);
  as_panel_rest<MR - 1, NV, Prefetch>(m - r, a + r * k, w, k, c + r * ldc, ldc, cols);
}

// A [k, n] weight into column panels of nb, one panel per task over the threads. The model
// holds it as [n, k] (transposed: rows transposed in 8x8 tiles, as_transpose2d), as [k, n]
// (rows copied), or (channels > 0) as a convolution's [n, channels, k / channels], whose
// row kk of the [k, n] weight is tap kk / channels of channel kk % channels. The last
// panel's columns past n are zeroed.
static void as_panels_pack(int64_t k, int64_t n, int64_t nb, bool transposed,
                           int64_t channels, const float* w, float* to) {
  const int64_t count = (n + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t p = 0; p < count; ++p) {
    const int64_t c0 = p * nb, cols = as_min64(nb, n - c0);
    float* panel = to + p * k * nb;
    if (channels > 0) {
      const int64_t taps = k / channels;
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < cols; ++j)
          panel[kk * nb + j] = w[(c0 + j) * k + (kk % channels) * taps + kk / channels];
    } else if (transposed) {
      as_transpose2d<float>(w + c0 * k, k, panel, nb, cols, k);
    } else {
      for (int64_t kk = 0; kk < k; ++kk)
        memcpy(panel + kk * nb, w + kk * n + c0, sizeof(float) * cols);
    }
    if (cols < nb)
      for (int64_t kk = 0; kk < k; ++kk)
        memset(panel + kk * nb + cols, 0, sizeof(float) * (nb - cols));
  }
}

#ifdef __AVX512F__
#define AS_FEW_MR 8
#else
#define AS_FEW_MR 4
#endif
#define AS_FEW_NB (3 * AS_VEC_V)

// c[m, n] (rows ldc apart) = a[m, k] @ the weight in as_few_pack's panels; m <= AS_FEW_ROWS.
static void as_few_rows_gemm(int64_t m, int64_t n, int64_t k, const float* a,
                             const float* packed, float* c, int64_t ldc) {
  const int64_t count = (n + AS_FEW_NB - 1) / AS_FEW_NB;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 15))
  for (int64_t p = 0; p < count; ++p) {
    const int64_t cols = as_min64(AS_FEW_NB, n - p * AS_FEW_NB);
    as_panel_rows<AS_FEW_MR, 3, false>(m, a, packed + p * k * AS_FEW_NB, k,
                                       c + p * AS_FEW_NB, ldc, cols);
  }
}

// The site's weight (as the model holds it) into as_few_rows_gemm's panels.
static void as_few_pack(const AsMatmulSite* s, const float* w, float* to) {
  as_panels_pack(s->k, s->n, AS_FEW_NB, s->transposed, 0, w, to);
}

// GEMMs as_few_rows_gemm ran, for tests and diagnostics.
AS_SHARED int64_t as_few_rows_runs = 0;
extern "C" int64_t anyshape_few_rows_runs() {
  return __atomic_load_n(&as_few_rows_runs, __ATOMIC_RELAXED);
}

// c[m, n] = a[m, k] @ w through as_few_rows_gemm: 1; 0 where the caller's routes run (a
// weight nobody watches, out of memory); -1 on the weight's first use here
// (as_packed_weights' `deferred`): BLAS runs it on the weight as the model holds it.
static int as_few_rows_matmul(AsMatmulSite* s, const float* a, const float* w, float* c,
                               int64_t m) {
  pthread_mutex_lock(&s->weights.mu);
  as_cache_list(&s->weights);
  if (!s->few) {
    const int64_t count = (s->n + AS_FEW_NB - 1) / AS_FEW_NB;
    dnnl_dims_t dims = {count, s->k, AS_FEW_NB}, strides = {s->k * AS_FEW_NB, AS_FEW_NB, 1};
    if (dnnl_memory_desc_create_with_strides(&s->few, 3, dims, AS_DNNL_F32, strides))
      s->few = nullptr;
  }
  const float* packed = nullptr;
  bool first_use = false;
  if (s->few) {
    const AsPacker pack = {[](const void* site, const float* plain, float* to) {
                             as_few_pack((const AsMatmulSite*)site, plain, to);
                           }, s};
    packed = as_packed_weights(&s->weights, w, nullptr, s->few, 1, 0, &pack, &first_use);
  }
  pthread_mutex_unlock(&s->weights.mu);
  if (first_use) return -1;
  if (!packed || packed == w) return 0;  // (nobody watches w: the routes below)
  as_few_rows_gemm(m, s->n, s->k, a, packed, c, s->n);
  __atomic_add_fetch(&as_few_rows_runs, 1, __ATOMIC_RELAXED);
  return 1;
}

// Many rows by a narrow weight, one block of rows per thread: the 1x1 convolutions of a
// residual network's early stages (256 -> 64 channels at 4 x 80 x 80 pixels: 25 600 rows)
// run as GEMMs over blocks of pixels, each block's epilogue right after its GEMM while the
// block is in cache (conv_emit._row_blocks). oneDNN's sgemm and matmul ran those blocks at
// 150-210 GFLOP/s, where ONNX Runtime's direct convolution ran 254. as_rows_gemm keeps
// AS_ROWS_MR rows x AS_ROWS_NV vectors of output in registers over the whole depth (24
// accumulators of AVX-512's 32, 12 of AVX2's 16), reads the weight from column panels of
// AS_ROWS_NB (as_panel_tile) and prefetches the next tile's rows. Measured alone over
// 96-row blocks on two threads, the input fresh from memory (256 -> 64 at 25 600 rows):
// AVX-512 2.6-2.8 ms against oneDNN's sgemm per block 3.4-3.7, AVX2 4.3-4.4 against 5.8-6.1
// (docs/performance.md, "2026-12-07, eighth").
#ifdef __AVX512F__
#define AS_ROWS_MR 6
#else
#define AS_ROWS_MR 3
#endif
#define AS_ROWS_NV 4
#define AS_ROWS_NB (AS_ROWS_NV * AS_VEC_V)

AS_GLUE_ENTRY void as_rows_gemm(int64_t m, int64_t n, int64_t k, const float* a,
                                const float* panels, float* c) {
  const int64_t count = (n + AS_ROWS_NB - 1) / AS_ROWS_NB;
  for (int64_t p = 0; p < count; ++p) {
    const int64_t cols = as_min64(AS_ROWS_NB, n - p * AS_ROWS_NB);
    as_panel_rows<AS_ROWS_MR, AS_ROWS_NV, true>(m, a, panels + p * k * AS_ROWS_NB, k,
                                                c + p * AS_ROWS_NB, n, cols);
  }
}

// GEMMs as_rows_gemm's panels were handed out for, for tests and diagnostics.
AS_SHARED int64_t as_rows_runs = 0;
extern "C" int64_t anyshape_rows_gemm_runs() {
  return __atomic_load_n(&as_rows_runs, __ATOMIC_RELAXED);
}

// A weight in as_rows_gemm's panels (layout *md, made on first use, under c->mu), packed
// by `pack` on its second use; null on its first, for weights nobody watches, out of
// memory. Counts a hand-out on `runs` (when given).
static const float* as_rows_packed(AsWeightsCache* c, dnnl_memory_desc_t* md, int64_t k,
                                   int64_t n, const float* w, const AsPacker& pack,
                                   int64_t* runs) {
  pthread_mutex_lock(&c->mu);
  as_cache_list(c);
  if (!*md) {
    const int64_t count = (n + AS_ROWS_NB - 1) / AS_ROWS_NB;
    dnnl_dims_t dims = {count, k, AS_ROWS_NB}, strides = {k * AS_ROWS_NB, AS_ROWS_NB, 1};
    if (dnnl_memory_desc_create_with_strides(md, 3, dims, AS_DNNL_F32, strides)) *md = nullptr;
  }
  bool first_use = false;
  const float* packed =
      *md ? as_packed_weights(c, w, nullptr, *md, 1, 0, &pack, &first_use) : nullptr;
  pthread_mutex_unlock(&c->mu);
  if (first_use || packed == w) return nullptr;
  if (packed && runs) __atomic_add_fetch(runs, 1, __ATOMIC_RELAXED);
  return packed;
}

// Up to this many output columns a 1x1 convolution's row blocks run as_rows_gemm: wider
// ones ran level or slower than oneDNN's (ResNet-50's 512 -> 2048 at 4 x 10 x 10 pixels,
// 3.4 against 3.0 ms), narrower ones faster in the whole model.
#define AS_ROWS_WIDEST 128

AS_GLUE_ENTRY const float* as_rows_panels(AsMatmulSite* s, const float* w) {
  // (Not for a site as_site_for could not make, whose k and n are 0; not where the options
  // ask for oneDNN's matmul at every row count, or for no extra copy of a weight.)
  if (s->broken || !as_dnnl_engine() || s->n > AS_ROWS_WIDEST || s->mode != AS_MATMUL_AUTO)
    return nullptr;
  const AsPacker pack = {[](const void* site, const float* plain, float* to) {
                           const AsMatmulSite* t = (const AsMatmulSite*)site;
                           as_panels_pack(t->k, t->n, AS_ROWS_NB, t->transposed, 0, plain, to);
                         }, s};
  return as_rows_packed(&s->weights, &s->rows, s->k, s->n, w, pack, &as_rows_runs);
}

AS_GLUE_ENTRY const float* as_taps_panels(AsTapsSite* s, const float* w) {
  if (s->broken || !as_dnnl_engine()) return nullptr;
  const AsPacker pack = {[](const void* site, const float* plain, float* to) {
                           const AsTapsSite* t = (const AsTapsSite*)site;
                           as_panels_pack(t->k, t->n, AS_ROWS_NB, false, t->c, plain, to);
                         }, s};
  return as_rows_packed(&s->weights, &s->rows, s->k, s->n, w, pack, &as_rows_runs);
}

// The site of a family's kernel for one few-channel convolution's weight (as_site_for).
__attribute__((noipa)) AS_GLUE_ENTRY AsTapsSite* as_taps_site(AsSiteTable* t, int64_t k,
                                                            int64_t n, int64_t c) {
  const int64_t geometry[3] = {k, n, c};
  return as_site_for<AsTapsSite>(t, geometry, 3);
}

// c[m, n] = a[m, k] @ w, with w as the model holds it: up to AS_FEW_ROWS rows through
// as_few_rows_gemm (AS_MATMUL_AUTO), else oneDNN's matmul; false when oneDNN cannot run
// it, the BLAS path is faster at m rows (unless AS_MATMUL_ALWAYS), or
// w needs packing and nobody watches it (packing it on every call would cost more than it
// saves) or this is its first use in the layout (as_packed_weights' `deferred`): the
// caller's GEMM runs instead.
AS_GLUE_ENTRY bool as_dnnl_matmul(AsMatmulSite* s, const float* a, const float* w, float* c, int64_t m) {
  if (s->broken || !as_dnnl_engine()) return false;
  // A first use of the few-rows kernel's copy (-1) goes on as a weight nobody watches: to the
  // matmul where it reads the weight in place, else BLAS (leaving the matmul's copy to its own
  // first use).
  bool few_first_use = false;
  if (m <= AS_FEW_ROWS && s->mode == AS_MATMUL_AUTO) {
    const int few = as_few_rows_matmul(s, a, w, c, m);
    if (few > 0) return true;
    few_first_use = few < 0;
  }
  int64_t panels = __atomic_load_n(&s->panels, __ATOMIC_RELAXED);
  if (!panels) {  // (a function of the site's shape and the ISA: any thread's value is it)
    panels = as_matmul_panels(s->k, s->n);
    __atomic_store_n(&s->panels, panels, __ATOMIC_RELAXED);
  }
  const int64_t np = s->n / panels;
  if (s->mode != AS_MATMUL_ALWAYS && !as_matmul_pays(m, s->k, np, s->transposed)) return false;
  // A panel's first weight, in the model's layout, and its first output column.
  const int64_t step = s->transposed ? np * s->k : np;
  pthread_mutex_lock(&s->weights.mu);
  as_cache_list(&s->weights);
  if (!s->made) {
    s->made = true;
    s->broken = !as_matmul_make(s);
  }
  // (A panel transposed row-major, rows s->ld apart: as_pack_transposed; else a reorder.)
  const AsPacker transpose = {[](const void* site, const float* plain, float* to) {
                                const AsMatmulSite* t = (const AsMatmulSite*)site;
                                as_pack_transposed(plain, t->n / t->panels, t->k, to, t->ld);
                              }, s};
  bool first_use = false;  // (AS_MATMUL_ALWAYS packs on the first: every call on the matmul)
  const float* packed =
      s->broken || (few_first_use && !s->in_place) ? nullptr
      : s->in_place                                ? w
                    : as_packed_weights(&s->weights, w, s->plain, s->packed, panels, step,
                                        s->transposes ? &transpose : nullptr,
                                        s->mode == AS_MATMUL_ALWAYS ? nullptr : &first_use);
  pthread_mutex_unlock(&s->weights.mu);
  if (!packed || (packed == w && !s->in_place)) return false;
  const int64_t next = s->in_place ? step : as_packed_panel_floats(s->packed);
  dnnl_memory_desc_t src = as_rows_md(m, s->k), dst = as_rows_md(m, np, s->n);
  void* scratch = s->scratch_bytes ? as_scratch(s->scratch_bytes) : nullptr;
  bool ok = src && dst && (scratch || !s->scratch_bytes);
  const int args[4] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_WEIGHTS, AS_DNNL_ARG_DST,
                       AS_DNNL_ARG_SCRATCHPAD};
  const_dnnl_memory_desc_t mds[4] = {src, s->packed, dst, s->scratch};
  for (int64_t p = 0; ok && p < panels; ++p) {
    void* ptrs[4] = {(void*)a, (void*)(packed + p * next), c + p * np, scratch};
    ok = as_dnnl_run(s->matmul, 4, args, mds, ptrs);
  }
  if (src) dnnl_memory_desc_destroy(src);
  if (dst) dnnl_memory_desc_destroy(dst);
  if (ok) __atomic_add_fetch(&as_dnnl_matmul_runs, 1, __ATOMIC_RELAXED);
  return ok;
}

// The site of a family's kernel for a [k, n] weight (see as_site_for).
__attribute__((noipa)) AS_GLUE_ENTRY AsMatmulSite* as_matmul_site(AsSiteTable* t, int64_t k, int64_t n,
                                                            int64_t transposed, int64_t mode) {
  const int64_t geometry[4] = {k, n, transposed, mode};
  return as_site_for<AsMatmulSite>(t, geometry, 4);
}
#endif  // AS_DNNL_GLUE_OBJECT
