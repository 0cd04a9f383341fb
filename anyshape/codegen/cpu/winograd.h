// anyshape CPU runtime: 3x3 convolutions by Winograd's minimal filtering F(4x4, 3x3) or
// F(2x2, 3x3) (plugin mode, when oneDNN is installed). Pasted after dnnl_matmul.h, whose
// GEMM tile (as_panel_rows), panel layout (as_panels_pack) and packed-weight cache (as_rows_packed)
// it uses, into translation units that hold a convolution route (conv_emit._conv_winograd);
// the glue object (build.py) compiles its definitions once per machine.

// A 3x3 convolution with unit stride and dilation on [N, H, W, C] activations, by
// Winograd's minimal filtering F(M x M, 3x3) (as_winograd_conv, M by as_winograd_tile): its
// OIHW weight transformed into (M + 2)^2 [c, o] matrices, each in as_rows_gemm's panels
// (36/9 of the weight's size with M = 4, 16/9 with M = 2).
struct AsWinogradSite {
  int64_t c, o;  // (the geometry first, as AsMatmulSite's)
  AsWeightsCache weights;
  dnnl_memory_desc_t rows;  // the layout of the panels (made on first use)
  bool broken;              // no site could be made (as_site_for): the caller's path runs
};
AS_GLUE_ENTRY AsWinogradSite* as_winograd_site(AsSiteTable* t, int64_t c, int64_t o);
// The site's weight transformed and in panels (made on its second use), or null.
AS_GLUE_ENTRY const float* as_winograd_panels(AsWinogradSite* s, const float* w);
// y [N, OH, OW, O] = x [N, H, W, C] convolved with the weight in `panels`, padded by
// g = {n, h, w, c, o, ph, pw, oh, ow}, over the threads: 0; 1 where an output is not
// finite or out of memory (the caller's path computes the call again, as eager would).
AS_GLUE_ENTRY int as_winograd_conv(const int64_t* g, const float* x, const float* panels,
                                   float* y);

#ifdef AS_DNNL_GLUE_OBJECT

// Winograd's F(M x M, 3x3): an M x M block of output from an (M + 2) x (M + 2) tile of
// input in (M + 2)^2 multiplications per channel pair where the direct convolution takes
// 9 M^2, with the input tile transformed by B^T d B, the weight by G g G^T and the
// products back by A^T m A. F(2x2, 3x3) takes 16 for 4 outputs, F(4x4, 3x3) 36 for 16
// (points 0, +-1, +-2: larger constants in its transforms, so a larger rounding error: in
// ResNet-50 the largest relative error against eager went from 1.7-2.0e-6 to 1.8-2.6e-6).
template <int M>
struct AsWinograd {
  static constexpr int A = M + 2;  // a tile's side
  static constexpr int T = A * A;  // its products: matrices of the transformed weight

  // G g for one column of the weight: out[A] from g[3] (`step` floats apart).
  template <class V>
  static inline void weight(const V* g, int64_t step, V* out) {
    const V g0 = g[0], g1 = g[step], g2 = g[2 * step];
    if constexpr (M == 2) {  // G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
      out[0] = g0;
      out[1] = 0.5f * (g0 + g1 + g2);
      out[2] = 0.5f * (g0 - g1 + g2);
      out[3] = g2;
    } else {  // G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
      out[0] = 0.25f * g0;
      out[1] = (-1.0f / 6) * (g0 + g1 + g2);
      out[2] = (-1.0f / 6) * (g0 - g1 + g2);
      out[3] = (1.0f / 24) * g0 + (1.0f / 12) * g1 + (1.0f / 6) * g2;
      out[4] = (1.0f / 24) * g0 - (1.0f / 12) * g1 + (1.0f / 6) * g2;
      out[5] = g2;
    }
  }

  // B^T d for one column of the input tile: out[A] from d[A] (`step` apart).
  static inline void input(const AsPanelVec* d, int64_t step, AsPanelVec* out) {
    const AsPanelVec d0 = d[0], d1 = d[step], d2 = d[2 * step], d3 = d[3 * step];
    if constexpr (M == 2) {  // B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
      out[0] = d0 - d2;
      out[1] = d1 + d2;
      out[2] = d2 - d1;
      out[3] = d1 - d3;
    } else {  // B^T's rows: [4 0 -5 0 1 0], [0 -4 -4 1 1 0], [0 4 -4 -1 1 0],
              // [0 -2 -1 2 1 0], [0 2 -1 -2 1 0], [0 4 0 -5 0 1]
      const AsPanelVec d4 = d[4 * step], d5 = d[5 * step];
      const AsPanelVec p = d4 - 4.0f * d2, q = d3 - 4.0f * d1, r = d4 - d2, s = 2.0f * (d3 - d1);
      out[0] = 4.0f * d0 - 5.0f * d2 + d4;
      out[1] = p + q;
      out[2] = p - q;
      out[3] = r + s;
      out[4] = r - s;
      out[5] = 4.0f * d1 - 5.0f * d3 + d5;
    }
  }

  // A^T m for one column of the products: out[M] from m[A] (`step` apart).
  static inline void output(const AsPanelVec* m, int64_t step, AsPanelVec* out) {
    const AsPanelVec m0 = m[0], m1 = m[step], m2 = m[2 * step], m3 = m[3 * step];
    if constexpr (M == 2) {  // A^T = [1 1 1 0; 0 1 -1 -1]
      out[0] = m0 + m1 + m2;
      out[1] = m1 - m2 - m3;
    } else {  // A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
      const AsPanelVec m4 = m[4 * step], m5 = m[5 * step];
      const AsPanelVec p = m1 + m2, q = m1 - m2, r = m3 + m4, s = m3 - m4;
      out[0] = m0 + p + r;
      out[1] = q + 2.0f * s;
      out[2] = p + 4.0f * r;
      out[3] = q + 8.0f * s + m5;
    }
  }
};

// The output tile M of a site with c input and o output channels: F(4x4, 3x3) where c o is
// at most 128 x 128 (a transformed weight of up to 2.4 MB), F(2x2, 3x3) above. Interleaved
// in ResNet-50 against F(2x2, 3x3) everywhere (docs/performance.md, "2026-12-08, third"): its 64- and 128-channel layers took 0.61-0.95 of the time on both ISAs; its
// 256-channel ones 0.72-0.77 at 4 x 320 with AVX-512 but 1.1-1.6 at 160-224 px, where a
// 10 x 10 or 14 x 14 image makes few tiles (3 x 3 or 4 x 4 of 4 x 4 pixels, some of them
// past the edge) for a 9.4 MB weight.
static inline int as_winograd_tile(int64_t c, int64_t o) {
  return c * o <= 128 * 128 ? 4 : 2;
}

// Per channel pair of the weight ([o][c][3][3], model layout) into the panels: the T
// matrices [c, o] of G g G^T, each as as_panels_pack lays out a [k, n] weight (zero past o).
template <int M>
static void as_winograd_pack(int64_t c, int64_t o, const float* w, float* to) {
  constexpr int A = AsWinograd<M>::A, T = AsWinograd<M>::T;
  const int64_t np = (o + AS_ROWS_NB - 1) / AS_ROWS_NB;
#pragma omp parallel for schedule(static) if (o * c >= 4096)
  for (int64_t p = 0; p < np; ++p) {
    for (int xi = 0; xi < T; ++xi)
      memset(to + (xi * np + p) * c * AS_ROWS_NB, 0, sizeof(float) * c * AS_ROWS_NB);
    for (int64_t j = 0; j < as_min64(AS_ROWS_NB, o - p * AS_ROWS_NB); ++j)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* g = w + ((p * AS_ROWS_NB + j) * c + ch) * 9;
        float t[A][3], u[A][A];  // G g, then (G g) G^T
        for (int q = 0; q < 3; ++q) {
          float col[A];
          AsWinograd<M>::weight(g + q, 3, col);
          for (int i = 0; i < A; ++i) t[i][q] = col[i];
        }
        for (int i = 0; i < A; ++i) AsWinograd<M>::weight(t[i], 1, u[i]);
        for (int xi = 0; xi < T; ++xi)
          to[((xi * np + p) * c + ch) * AS_ROWS_NB + j] = u[xi / A][xi % A];
      }
  }
}

AS_GLUE_ENTRY const float* as_winograd_panels(AsWinogradSite* s, const float* w) {
  if (s->broken || !as_dnnl_engine()) return nullptr;
  const AsPacker pack = {[](const void* site, const float* plain, float* to) {
                           const AsWinogradSite* t = (const AsWinogradSite*)site;
                           if (as_winograd_tile(t->c, t->o) == 4)
                             as_winograd_pack<4>(t->c, t->o, plain, to);
                           else
                             as_winograd_pack<2>(t->c, t->o, plain, to);
                         }, s};
  // (Panels of [c, AS_ROWS_NB], T for each AS_ROWS_NB output channels.)
  const int64_t np = (s->o + AS_ROWS_NB - 1) / AS_ROWS_NB, a = as_winograd_tile(s->c, s->o) + 2;
  return as_rows_packed(&s->weights, &s->rows, s->c, a * a * np * AS_ROWS_NB, w, pack, nullptr);
}

__attribute__((noipa)) AS_GLUE_ENTRY AsWinogradSite* as_winograd_site(AsSiteTable* t, int64_t c,
                                                                    int64_t o) {
  const int64_t geometry[2] = {c, o};
  return as_site_for<AsWinogradSite>(t, geometry, 2);
}

// Up to `n` floats at `p` as a vector, zero past them; and back.
static inline AsPanelVec as_vec_load(const float* p, int64_t n) {
  if (n >= AS_VEC_V) return *(const AsPanelLoad*)p;
  float v[AS_VEC_V] = {};
  memcpy(v, p, sizeof(float) * n);
  AsPanelVec r;
  memcpy(&r, v, sizeof(r));
  return r;
}
static inline void as_vec_store(float* p, AsPanelVec v, int64_t n) {
  if (n >= AS_VEC_V) {
    *(AsPanelLoad*)p = v;
  } else {
    float t[AS_VEC_V];
    memcpy(t, &v, sizeof(t));
    memcpy(p, t, sizeof(float) * n);
  }
}

// Tiles [t0, t0 + count) of the output (M x M pixels each, `tw` across, `th` down an
// image) into rows `row` on of v [T][ld][c]: each tile's input (zero outside the image)
// by B^T d B.
template <int M>
static void as_winograd_in(const int64_t* g, const float* x, int64_t t0, int64_t count,
                           int64_t th, int64_t tw, float* v, int64_t ld, int64_t row) {
  constexpr int A = AsWinograd<M>::A;
  const int64_t h = g[1], w = g[2], c = g[3], ph = g[5], pw = g[6];
  for (int64_t t = 0; t < count; ++t) {
    const int64_t q = t0 + t, n = q / (th * tw), ty = q / tw % th, tx = q % tw;
    const float* at[A][A];
    for (int i = 0; i < A; ++i)
      for (int j = 0; j < A; ++j) {
        const int64_t iy = M * ty - ph + i, ix = M * tx - pw + j;
        at[i][j] = iy >= 0 && iy < h && ix >= 0 && ix < w ? x + ((n * h + iy) * w + ix) * c : nullptr;
      }
    for (int64_t ch = 0; ch < c; ch += AS_VEC_V) {
      const int64_t left = c - ch;
      AsPanelVec d[A][A], e[A][A], f[A];
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) d[i][j] = at[i][j] ? as_vec_load(at[i][j] + ch, left) : AsPanelVec{};
      for (int j = 0; j < A; ++j) {  // (B^T d, a column at a time)
        AsWinograd<M>::input(&d[0][j], A, f);
        for (int i = 0; i < A; ++i) e[i][j] = f[i];
      }
      for (int i = 0; i < A; ++i) {  // (then by B, a row at a time)
        AsWinograd<M>::input(e[i], 1, f);
        float* to = v + ((int64_t)(i * A) * ld + row + t) * c + ch;
        for (int j = 0; j < A; ++j) as_vec_store(to + j * ld * c, f[j], left);
      }
    }
  }
}

// The T products of those tiles (rows `row` on of m [T][ld][o]) back into their output
// pixels by A^T m A; false where an output is not finite.
template <int M>
static bool as_winograd_out(const int64_t* g, const float* m, int64_t t0, int64_t count,
                            int64_t th, int64_t tw, float* y, int64_t ld, int64_t row) {
  constexpr int A = AsWinograd<M>::A, T = AsWinograd<M>::T;
  const int64_t o = g[4], oh = g[7], ow = g[8];
  AsPanelVec check{};
  for (int64_t t = 0; t < count; ++t) {
    const int64_t q = t0 + t, n = q / (th * tw), ty = q / tw % th, tx = q % tw;
    const int rows = (int)as_min64(M, oh - M * ty), cols = (int)as_min64(M, ow - M * tx);
    for (int64_t oc = 0; oc < o; oc += AS_VEC_V) {
      const int64_t left = o - oc;
      AsPanelVec a[A][A], b[M][A], f[M];
      for (int xi = 0; xi < T; ++xi)
        a[xi / A][xi % A] = as_vec_load(m + ((int64_t)xi * ld + row + t) * o + oc, left);
      for (int j = 0; j < A; ++j) {  // (A^T m, a column at a time)
        AsWinograd<M>::output(&a[0][j], A, f);
        for (int i = 0; i < M; ++i) b[i][j] = f[i];
      }
      for (int i = 0; i < rows; ++i) {  // (then by A, a row at a time)
        AsWinograd<M>::output(b[i], 1, f);
        float* out = y + ((n * oh + M * ty + i) * ow + M * tx) * o + oc;
        for (int j = 0; j < cols; ++j) {
          as_vec_store(out + j * o, f[j], left);
          check += f[j] * 0.0f;
        }
      }
    }
  }
  float lanes[AS_VEC_V];
  memcpy(lanes, &check, sizeof(lanes));
  for (int i = 0; i < AS_VEC_V; ++i)
    if (lanes[i] != 0.0f) return false;  // (NaN: some output was infinite or NaN)
  return true;
}

// c [T][count][o] = the T matrices a [T][count][c] by the panels, one matrix and panel a
// task when `threads` (else on the calling thread).
static void as_winograd_gemms(int t, int64_t count, int64_t c, int64_t o, const float* a,
                              const float* panels, float* m, bool threads) {
  const int64_t np = (o + AS_ROWS_NB - 1) / AS_ROWS_NB;
#pragma omp parallel for schedule(static) if (threads)
  for (int64_t task = 0; task < t * np; ++task) {
    const int64_t xi = task / np, p = task % np;
    as_panel_rows<AS_ROWS_MR, AS_ROWS_NV, false>(
        count, a + xi * count * c, panels + task * c * AS_ROWS_NB, c,
        m + xi * count * o + p * AS_ROWS_NB, o, as_min64(AS_ROWS_NB, o - p * AS_ROWS_NB));
  }
}

// Convolutions as_winograd_conv ran, for tests and diagnostics.
AS_SHARED int64_t as_winograd_runs = 0;
extern "C" int64_t anyshape_winograd_runs() {
  return __atomic_load_n(&as_winograd_runs, __ATOMIC_RELAXED);
}

// Two ways through the tiles, by the size of the transformed weight (T c o floats):
// - up to 1 MB, blocks of AS_WINOGRAD_TILES tiles, one per task: the block's transformed
//   input, its T GEMMs by the whole weight (in L2) and its output, all in cache (F(4x4,
//   3x3) to c o = 7281, ResNet-50's 64 channels; F(2x2, 3x3) runs from c o = 16 385, past
//   this bound, so always the other way);
// - over that, up to AS_WINOGRAD_CHUNK bytes of transformed input and products at a time:
//   every such tile's input, then the T GEMMs with one matrix and panel a task (each read
//   once a chunk), then every output: a block of tiles would read the whole weight again.
// Out of memory it returns 1: oneDNN's path computes the call.
#define AS_WINOGRAD_TILES 48
#define AS_WINOGRAD_CHUNK (INT64_C(32) << 20)
template <int M>
static int as_winograd_run(const int64_t* g, const float* x, const float* panels, float* y) {
  constexpr int T = AsWinograd<M>::T;
  const int64_t n = g[0], c = g[3], o = g[4], oh = g[7], ow = g[8];
  const int64_t th = (oh + M - 1) / M, tw = (ow + M - 1) / M, tiles = n * th * tw;
  if (tiles == 0 || o == 0) return 0;
  int failed = 0, infinite = 0;
  if (T * c * o * (int64_t)sizeof(float) <= (1 << 20)) {
    // (Up to AS_WINOGRAD_TILES a block, as many blocks for every thread.)
    const int64_t threads = omp_get_max_threads();
    int64_t blocks = (tiles + AS_WINOGRAD_TILES - 1) / AS_WINOGRAD_TILES;
    blocks = as_min64(tiles, (blocks + threads - 1) / threads * threads);
    const int64_t size = (tiles + blocks - 1) / blocks;
    blocks = (tiles + size - 1) / size;
#pragma omp parallel for schedule(static) reduction(| : failed, infinite) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t t0 = b * size, count = as_min64(size, tiles - t0);
      float* v = (float*)as_scratch((int64_t)sizeof(float) * T * count * (c + o));
      if (!v) {
        failed = 1;  // (the caller's path runs the call)
        continue;
      }
      float* m = v + T * count * c;
      as_winograd_in<M>(g, x, t0, count, th, tw, v, count, 0);
      as_winograd_gemms(T, count, c, o, v, panels, m, false);
      infinite |= !as_winograd_out<M>(g, m, t0, count, th, tw, y, count, 0);
    }
  } else {
    const int64_t most = as_max64(1, AS_WINOGRAD_CHUNK / (4 * T * (c + o)));  // (tiles a chunk)
    const int64_t chunks = (tiles + most - 1) / most, chunk = (tiles + chunks - 1) / chunks;
    float* v = (float*)as_scratch((int64_t)sizeof(float) * T * chunk * (c + o));
    if (!v) return 1;
    float* m = v + T * chunk * c;
    const int64_t threads = omp_get_max_threads();
    for (int64_t first = 0; first < tiles && !infinite; first += chunk) {
      const int64_t count = as_min64(chunk, tiles - first), step = (count + threads - 1) / threads;
#pragma omp parallel for schedule(static)
      for (int64_t t0 = 0; t0 < count; t0 += step)
        as_winograd_in<M>(g, x, first + t0, as_min64(step, count - t0), th, tw, v, count, t0);
      as_winograd_gemms(T, count, c, o, v, panels, m, true);
#pragma omp parallel for schedule(static) reduction(| : infinite)
      for (int64_t t0 = 0; t0 < count; t0 += step)
        infinite |= !as_winograd_out<M>(g, m, first + t0, as_min64(step, count - t0), th, tw, y,
                                        count, t0);
    }
  }
  if (failed || infinite) return 1;
  __atomic_add_fetch(&as_winograd_runs, 1, __ATOMIC_RELAXED);
  return 0;
}

AS_GLUE_ENTRY int as_winograd_conv(const int64_t* g, const float* x, const float* panels,
                                   float* y) {
  return as_winograd_tile(g[3], g[4]) == 4 ? as_winograd_run<4>(g, x, panels, y)
                                            : as_winograd_run<2>(g, x, panels, y);
}

#endif  // AS_DNNL_GLUE_OBJECT
