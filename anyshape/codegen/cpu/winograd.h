// anyshape CPU runtime: 3x3 convolutions by Winograd's minimal filtering F(2x2, 3x3)
// (plugin mode, when oneDNN is installed). Pasted after dnnl_matmul.h, whose GEMM tile
// (as_panel_rows), panel layout (as_panels_pack) and packed-weight cache (as_rows_packed)
// it uses, into translation units that hold a convolution route (conv_emit._conv_winograd);
// the glue object (build.py) compiles its definitions once per machine.

// A 3x3 convolution with unit stride and dilation on [N, H, W, C] activations, by
// Winograd's minimal filtering F(2x2, 3x3) (as_winograd_conv): its OIHW weight transformed
// into 16 [c, o] matrices, each in as_rows_gemm's panels.
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

// Winograd's F(2x2, 3x3): a 2 x 2 block of output from a 4 x 4 tile of input in 16
// multiplications per channel pair where the direct convolution takes 36, with the input
// tile transformed by B^T d B, the weight by G g G^T and the 16 products back by A^T m A.
// Per channel pair of the weight ([o][c][3][3], model layout) into the panels: the 16
// matrices [c, o], each as as_panels_pack lays out a [k, n] weight (zero past o).
static void as_winograd_pack(int64_t c, int64_t o, const float* w, float* to) {
  const int64_t np = (o + AS_ROWS_NB - 1) / AS_ROWS_NB;
#pragma omp parallel for schedule(static) if (o * c >= 4096)
  for (int64_t p = 0; p < np; ++p) {
    for (int xi = 0; xi < 16; ++xi)
      memset(to + (xi * np + p) * c * AS_ROWS_NB, 0, sizeof(float) * c * AS_ROWS_NB);
    for (int64_t j = 0; j < as_min64(AS_ROWS_NB, o - p * AS_ROWS_NB); ++j)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* g = w + ((p * AS_ROWS_NB + j) * c + ch) * 9;
        float t[4][3], u[4][4];  // G g, then (G g) G^T; G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
        for (int q = 0; q < 3; ++q) {
          t[0][q] = g[q];
          t[1][q] = 0.5f * (g[q] + g[3 + q] + g[6 + q]);
          t[2][q] = 0.5f * (g[q] - g[3 + q] + g[6 + q]);
          t[3][q] = g[6 + q];
        }
        for (int i = 0; i < 4; ++i) {
          u[i][0] = t[i][0];
          u[i][1] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
          u[i][2] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
          u[i][3] = t[i][2];
        }
        for (int xi = 0; xi < 16; ++xi)
          to[((xi * np + p) * c + ch) * AS_ROWS_NB + j] = u[xi / 4][xi % 4];
      }
  }
}

AS_GLUE_ENTRY const float* as_winograd_panels(AsWinogradSite* s, const float* w) {
  if (s->broken || !as_dnnl_engine()) return nullptr;
  const AsPacker pack = {[](const void* site, const float* plain, float* to) {
                           const AsWinogradSite* t = (const AsWinogradSite*)site;
                           as_winograd_pack(t->c, t->o, plain, to);
                         }, s};
  // (Panels of [c, AS_ROWS_NB], 16 for each AS_ROWS_NB output channels.)
  const int64_t np = (s->o + AS_ROWS_NB - 1) / AS_ROWS_NB;
  return as_rows_packed(&s->weights, &s->rows, s->c, 16 * np * AS_ROWS_NB, w, pack, nullptr);
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

// Tiles [t0, t0 + count) of the output (2 x 2 pixels each, `tw` across, `th` down an
// image) into rows `row` on of v [16][ld][c]: each tile's 4 x 4 input (zero outside the
// image) by B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
static void as_winograd_in(const int64_t* g, const float* x, int64_t t0, int64_t count,
                           int64_t th, int64_t tw, float* v, int64_t ld, int64_t row) {
  const int64_t h = g[1], w = g[2], c = g[3], ph = g[5], pw = g[6];
  for (int64_t t = 0; t < count; ++t) {
    const int64_t q = t0 + t, n = q / (th * tw), ty = q / tw % th, tx = q % tw;
    const float* at[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const int64_t iy = 2 * ty - ph + i, ix = 2 * tx - pw + j;
        at[i][j] = iy >= 0 && iy < h && ix >= 0 && ix < w ? x + ((n * h + iy) * w + ix) * c : nullptr;
      }
    for (int64_t ch = 0; ch < c; ch += AS_VEC_V) {
      const int64_t left = c - ch;
      AsPanelVec d[4][4], e[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) d[i][j] = at[i][j] ? as_vec_load(at[i][j] + ch, left) : AsPanelVec{};
      for (int j = 0; j < 4; ++j) {
        e[0][j] = d[0][j] - d[2][j];
        e[1][j] = d[1][j] + d[2][j];
        e[2][j] = d[2][j] - d[1][j];
        e[3][j] = d[1][j] - d[3][j];
      }
      for (int i = 0; i < 4; ++i) {
        float* to = v + ((int64_t)(i * 4) * ld + row + t) * c + ch;
        as_vec_store(to, e[i][0] - e[i][2], left);
        as_vec_store(to + ld * c, e[i][1] + e[i][2], left);
        as_vec_store(to + 2 * ld * c, e[i][2] - e[i][1], left);
        as_vec_store(to + 3 * ld * c, e[i][1] - e[i][3], left);
      }
    }
  }
}

// The 16 products of those tiles (rows `row` on of m [16][ld][o]) back into their output
// pixels by A^T m A, A^T = [1 1 1 0; 0 1 -1 -1]; false where an output is not finite.
static bool as_winograd_out(const int64_t* g, const float* m, int64_t t0, int64_t count,
                            int64_t th, int64_t tw, float* y, int64_t ld, int64_t row) {
  const int64_t o = g[4], oh = g[7], ow = g[8];
  AsPanelVec check{};
  for (int64_t t = 0; t < count; ++t) {
    const int64_t q = t0 + t, n = q / (th * tw), ty = q / tw % th, tx = q % tw;
    for (int64_t oc = 0; oc < o; oc += AS_VEC_V) {
      const int64_t left = o - oc;
      AsPanelVec a[4][4], b[2][4];
      for (int xi = 0; xi < 16; ++xi)
        a[xi / 4][xi % 4] = as_vec_load(m + ((int64_t)xi * ld + row + t) * o + oc, left);
      for (int j = 0; j < 4; ++j) {
        b[0][j] = a[0][j] + a[1][j] + a[2][j];
        b[1][j] = a[1][j] - a[2][j] - a[3][j];
      }
      for (int i = 0; i < 2 && 2 * ty + i < oh; ++i) {
        const AsPanelVec y0 = b[i][0] + b[i][1] + b[i][2], y1 = b[i][1] - b[i][2] - b[i][3];
        float* out = y + ((n * oh + 2 * ty + i) * ow + 2 * tx) * o + oc;
        as_vec_store(out, y0, left);
        check += y0 * 0.0f;
        if (2 * tx + 1 < ow) {
          as_vec_store(out + o, y1, left);
          check += y1 * 0.0f;
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

// c [16][count][o] = the 16 matrices a [16][count][c] by the panels, one matrix and panel a
// task when `threads` (else on the calling thread).
static void as_winograd_gemms(int64_t count, int64_t c, int64_t o, const float* a,
                              const float* panels, float* m, bool threads) {
  const int64_t np = (o + AS_ROWS_NB - 1) / AS_ROWS_NB;
#pragma omp parallel for schedule(static) if (threads)
  for (int64_t task = 0; task < 16 * np; ++task) {
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

// Two ways through the tiles, by the size of the transformed weight (16 c o floats):
// - up to 1 MB (ResNet-50's 64 and 128 channels) blocks of AS_WINOGRAD_TILES tiles, one
//   per task: the block's transformed input, its 16 GEMMs by the whole weight (in L2)
//   and its output, all in cache;
// - over that (256 channels: 4 MB) up to AS_WINOGRAD_CHUNK bytes of transformed input and
//   products at a time: every such tile's input, then the 16 GEMMs with one matrix and
//   panel a task (each read once a chunk), then every output: a block of tiles would read
//   the whole weight again.
// Out of memory it returns 1: oneDNN's path computes the call.
// Measured alone against oneDNN's convolution (docs/performance.md, "2026-12-08"):
// capped to AVX2, 0.64-0.79 of its time at 4 x 56 x 56 x 64 to 4 x 14 x 14 x 256; with
// AVX-512 0.74-0.87.
#define AS_WINOGRAD_TILES 48
#define AS_WINOGRAD_CHUNK (INT64_C(32) << 20)
AS_GLUE_ENTRY int as_winograd_conv(const int64_t* g, const float* x, const float* panels,
                                   float* y) {
  const int64_t n = g[0], c = g[3], o = g[4], oh = g[7], ow = g[8];
  const int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2, tiles = n * th * tw;
  if (tiles == 0 || o == 0) return 0;
  int failed = 0, infinite = 0;
  if (16 * c * o * (int64_t)sizeof(float) <= (1 << 20)) {
    // (Up to AS_WINOGRAD_TILES a block, as many blocks for every thread.)
    const int64_t threads = omp_get_max_threads();
    int64_t blocks = (tiles + AS_WINOGRAD_TILES - 1) / AS_WINOGRAD_TILES;
    blocks = as_min64(tiles, (blocks + threads - 1) / threads * threads);
    const int64_t size = (tiles + blocks - 1) / blocks;
    blocks = (tiles + size - 1) / size;
#pragma omp parallel for schedule(static) reduction(| : failed, infinite) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t t0 = b * size, count = as_min64(size, tiles - t0);
      float* v = (float*)as_scratch((int64_t)sizeof(float) * 16 * count * (c + o));
      if (!v) {
        failed = 1;  // (the caller's path runs the call)
        continue;
      }
      float* m = v + 16 * count * c;
      as_winograd_in(g, x, t0, count, th, tw, v, count, 0);
      as_winograd_gemms(count, c, o, v, panels, m, false);
      infinite |= !as_winograd_out(g, m, t0, count, th, tw, y, count, 0);
    }
  } else {
    const int64_t most = as_max64(1, AS_WINOGRAD_CHUNK / (64 * (c + o)));  // (tiles a chunk)
    const int64_t chunks = (tiles + most - 1) / most, chunk = (tiles + chunks - 1) / chunks;
    float* v = (float*)as_scratch((int64_t)sizeof(float) * 16 * chunk * (c + o));
    if (!v) return 1;
    float* m = v + 16 * chunk * c;
    const int64_t threads = omp_get_max_threads();
    for (int64_t first = 0; first < tiles && !infinite; first += chunk) {
      const int64_t count = as_min64(chunk, tiles - first), step = (count + threads - 1) / threads;
#pragma omp parallel for schedule(static)
      for (int64_t t0 = 0; t0 < count; t0 += step)
        as_winograd_in(g, x, first + t0, as_min64(step, count - t0), th, tw, v, count, t0);
      as_winograd_gemms(count, c, o, v, panels, m, true);
#pragma omp parallel for schedule(static) reduction(| : infinite)
      for (int64_t t0 = 0; t0 < count; t0 += step)
        infinite |= !as_winograd_out(g, m, first + t0, as_min64(step, count - t0), th, tw, y,
                                     count, t0);
    }
  }
  if (failed || infinite) return 1;
  __atomic_add_fetch(&as_winograd_runs, 1, __ATOMIC_RELAXED);
  return 0;
}

#endif  // AS_DNNL_GLUE_OBJECT
