// anyshape CPU runtime: 2-D float convolutions through oneDNN (plugin mode, when installed).
// Pasted after prelude.h into translation units that hold such a convolution, and only
// compiled with ANYSHAPE_DNNL (the build links the onednn-cpu-gomp wheel's libdnnl.so.3).
//
// oneDNN's direct convolutions (brgconv / jit, in a channels-last or blocked layout) ran
// ResNet-50's 3x3 convolutions at 225-245 GFLOP/s on the 2-core Zen 4 machine where im2col +
// OpenBLAS reached 95-130 (docs/architecture.md, "Libraries"). A oneDNN primitive is made
// for one shape, so each call site keeps the primitives of the input sizes it has seen:
// one image at a time (the batch size never makes a new one), created on first sight of
// an (H, W) in about 0.3-0.5 ms, then reused. Weights are reordered into the convolution's
// layout once per weight tensor when their owner watches them for changes (below).
// Only the C API entry points used here are declared (stable across oneDNN 3.x).
#include <pthread.h>

extern "C" {
typedef struct dnnl_engine* dnnl_engine_t;
typedef struct dnnl_stream* dnnl_stream_t;
typedef struct dnnl_memory_desc* dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc* const_dnnl_memory_desc_t;
typedef struct dnnl_memory* dnnl_memory_t;
typedef struct dnnl_primitive_desc* dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_desc* const_dnnl_primitive_desc_t;
typedef struct dnnl_primitive* dnnl_primitive_t;
typedef const struct dnnl_primitive* const_dnnl_primitive_t;
typedef struct dnnl_primitive_attr* dnnl_primitive_attr_t;
typedef const struct dnnl_primitive_attr* const_dnnl_primitive_attr_t;
typedef int64_t dnnl_dims_t[12];
typedef struct {
  int arg;
  dnnl_memory_t memory;
} dnnl_exec_arg_t;
int dnnl_engine_create(dnnl_engine_t*, int kind, size_t index);
int dnnl_stream_create(dnnl_stream_t*, dnnl_engine_t, unsigned flags);
int dnnl_stream_destroy(dnnl_stream_t);
int dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t*, int ndims, const dnnl_dims_t dims,
                                     int data_type, int tag);
int dnnl_memory_desc_create_with_strides(dnnl_memory_desc_t*, int ndims, const dnnl_dims_t dims,
                                         int data_type, const dnnl_dims_t strides);
int dnnl_memory_desc_clone(dnnl_memory_desc_t*, const_dnnl_memory_desc_t);
int dnnl_memory_desc_destroy(dnnl_memory_desc_t);
int dnnl_memory_desc_equal(const_dnnl_memory_desc_t, const_dnnl_memory_desc_t);
size_t dnnl_memory_desc_get_size(const_dnnl_memory_desc_t);
int dnnl_memory_create(dnnl_memory_t*, const_dnnl_memory_desc_t, dnnl_engine_t, void* handle);
int dnnl_memory_destroy(dnnl_memory_t);
int dnnl_convolution_forward_primitive_desc_create(
    dnnl_primitive_desc_t*, dnnl_engine_t, int prop_kind, int alg_kind,
    const_dnnl_memory_desc_t src, const_dnnl_memory_desc_t weights,
    const_dnnl_memory_desc_t bias, const_dnnl_memory_desc_t dst, const dnnl_dims_t strides,
    const dnnl_dims_t dilates, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const_dnnl_primitive_attr_t attr);
int dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t*, const_dnnl_memory_desc_t src,
                                       dnnl_engine_t, const_dnnl_memory_desc_t dst,
                                       dnnl_engine_t, const_dnnl_primitive_attr_t attr);
const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(const_dnnl_primitive_desc_t, int what,
                                                      int index);
int dnnl_primitive_desc_destroy(dnnl_primitive_desc_t);
int dnnl_primitive_create(dnnl_primitive_t*, const_dnnl_primitive_desc_t);
int dnnl_primitive_execute(const_dnnl_primitive_t, dnnl_stream_t, int nargs,
                           const dnnl_exec_arg_t* args);
int dnnl_primitive_destroy(dnnl_primitive_t);
int dnnl_primitive_attr_create(dnnl_primitive_attr_t*);
int dnnl_primitive_attr_destroy(dnnl_primitive_attr_t);
int dnnl_primitive_attr_set_scratchpad_mode(dnnl_primitive_attr_t, int mode);
}

enum {
  AS_DNNL_CPU = 1,
  AS_DNNL_F32 = 3,
  AS_DNNL_TAG_ANY = 1,
  AS_DNNL_FORWARD_INFERENCE = 96,
  AS_DNNL_CONVOLUTION_DIRECT = 1,
  AS_DNNL_QUERY_SRC_MD = 129,
  AS_DNNL_QUERY_WEIGHTS_MD = 131,
  AS_DNNL_QUERY_DST_MD = 133,
  AS_DNNL_QUERY_SCRATCHPAD_MD = 136,
  AS_DNNL_SCRATCHPAD_USER = 1,
  AS_DNNL_ARG_SRC = 1,
  AS_DNNL_ARG_DST = 17,
  AS_DNNL_ARG_WEIGHTS = 33,
  AS_DNNL_ARG_SCRATCHPAD = 80,
};

// Shapes kept per call site; the least recently used one not running is replaced.
#define AS_CONV_SHAPES 32

static dnnl_engine_t as_dnnl_engine() {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    return dnnl_engine_create(&e, AS_DNNL_CPU, 0) == 0 ? e : nullptr;
  }();
  return engine;
}

struct AsDnnlStream {
  dnnl_stream_t s = nullptr;
  ~AsDnnlStream() {
    if (s) dnnl_stream_destroy(s);
  }
};
static dnnl_stream_t as_dnnl_stream() {
  static thread_local AsDnnlStream stream;
  if (!stream.s && dnnl_stream_create(&stream.s, as_dnnl_engine(), 1) != 0) stream.s = nullptr;
  return stream.s;
}

// A weight is packed once only if its owner watches it for in-place changes (plugin mode
// registers the weights it watches with `anyshape_watch_weights` and calls
// `anyshape_weights_changed()` after any change). Other weights — a library loaded twice
// serves models that may not watch theirs — are packed into each call's scratch space.
static pthread_mutex_t as_watch_mu = PTHREAD_MUTEX_INITIALIZER;
static const void** as_watched = nullptr;
static int64_t as_nwatched = 0;
static uint64_t as_weights_generation = 1;
// Registering weights also bumps the generation: new weights may sit where freed ones
// were packed from.
extern "C" int anyshape_watch_weights(const void* const* weights, int64_t n) {
  pthread_mutex_lock(&as_watch_mu);
  const void** grown = (const void**)realloc(as_watched, sizeof(void*) * (as_nwatched + n + 1));
  if (grown) {
    as_watched = grown;
    for (int64_t k = 0; k < n; ++k) as_watched[as_nwatched++] = weights[k];
  }
  pthread_mutex_unlock(&as_watch_mu);
  __atomic_add_fetch(&as_weights_generation, 1, __ATOMIC_SEQ_CST);
  return grown != nullptr;
}
extern "C" void anyshape_weights_changed() {
  __atomic_add_fetch(&as_weights_generation, 1, __ATOMIC_SEQ_CST);
}
static bool as_is_watched(const void* weights) {
  pthread_mutex_lock(&as_watch_mu);
  bool found = false;
  for (int64_t k = 0; k < as_nwatched && !found; ++k) found = as_watched[k] == weights;
  pthread_mutex_unlock(&as_watch_mu);
  return found;
}

// Weights of one layer in the convolution's own layout.
struct AsPackedWeights {
  const float* plain;
  dnnl_memory_desc_t md;
  float* data;
  uint64_t generation;
};

// The primitives for one input size (one image).
struct AsConvShape {
  int64_t h, w;
  dnnl_primitive_t conv, to_conv, from_conv;  // reorders are null when layouts agree
  dnnl_memory_desc_t src_plain, dst_plain, src, weights, dst, scratch;
  int64_t src_bytes, dst_bytes, scratch_bytes;
  int64_t last_use, users;
};

static void as_conv_shape_free(AsConvShape* e) {
  if (e->conv) dnnl_primitive_destroy(e->conv);
  if (e->to_conv) dnnl_primitive_destroy(e->to_conv);
  if (e->from_conv) dnnl_primitive_destroy(e->from_conv);
  dnnl_memory_desc_t mds[] = {e->src_plain, e->dst_plain, e->src, e->weights, e->dst, e->scratch};
  for (dnnl_memory_desc_t md : mds)
    if (md) dnnl_memory_desc_destroy(md);
  memset(e, 0, sizeof(*e));
}

// One call site: a convolution's static geometry, its shapes and its layers' packed weights.
struct AsConvSite {
  int64_t c, o, kh, kw, sh, sw, ph, pw, dh, dw;
  pthread_mutex_t mu;
  AsConvShape shapes[AS_CONV_SHAPES];
  int64_t clock;
  AsPackedWeights* packed;
  int64_t npacked;
  bool broken;  // oneDNN refused this geometry: the caller's own path runs instead
  AsConvSite* next;  // every site that has run, for `anyshape_unwatch_weights`
  bool listed;
};
static AsConvSite* as_sites = nullptr;

// The owner of these weights is gone: forget them and free their packed copies.
extern "C" void anyshape_unwatch_weights(const void* const* weights, int64_t n) {
  pthread_mutex_lock(&as_watch_mu);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < as_nwatched; ++j)
      if (as_watched[j] == weights[k]) {
        as_watched[j] = as_watched[--as_nwatched];
        break;
      }
  AsConvSite* sites = as_sites;  // only ever grows at the head
  pthread_mutex_unlock(&as_watch_mu);
  for (AsConvSite* s = sites; s; s = s->next) {
    pthread_mutex_lock(&s->mu);
    for (int64_t j = 0; j < s->npacked;) {
      bool gone = false;
      for (int64_t k = 0; k < n && !gone; ++k) gone = s->packed[j].plain == weights[k];
      if (!gone) {
        ++j;
        continue;
      }
      free(s->packed[j].data);
      dnnl_memory_desc_destroy(s->packed[j].md);
      s->packed[j] = s->packed[--s->npacked];
    }
    pthread_mutex_unlock(&s->mu);
  }
  __atomic_add_fetch(&as_weights_generation, 1, __ATOMIC_SEQ_CST);
}

static dnnl_primitive_t as_dnnl_reorder(const_dnnl_memory_desc_t from, const_dnnl_memory_desc_t to) {
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t p = nullptr;
  if (dnnl_reorder_primitive_desc_create(&pd, from, as_dnnl_engine(), to, as_dnnl_engine(), nullptr))
    return nullptr;
  if (dnnl_primitive_create(&p, pd)) p = nullptr;
  dnnl_primitive_desc_destroy(pd);
  return p;
}

static bool as_conv_shape_make(const AsConvSite* s, int64_t h, int64_t w, AsConvShape* e) {
  memset(e, 0, sizeof(*e));
  e->h = h;
  e->w = w;
  const int64_t ekh = (s->kh - 1) * s->dh + 1, ekw = (s->kw - 1) * s->dw + 1;
  const int64_t oh = (h + 2 * s->ph - ekh) / s->sh + 1, ow = (w + 2 * s->pw - ekw) / s->sw + 1;
  // Right/bottom padding as oneDNN counts it: what the last output window reaches.
  const int64_t prh = (oh - 1) * s->sh + ekh - h - s->ph, prw = (ow - 1) * s->sw + ekw - w - s->pw;
  dnnl_dims_t src = {1, s->c, h, w}, src_st = {s->c * h * w, h * w, w, 1};
  dnnl_dims_t wei = {s->o, s->c, s->kh, s->kw};
  dnnl_dims_t dst = {1, s->o, oh, ow}, dst_st = {s->o * oh * ow, oh * ow, ow, 1};
  dnnl_dims_t strides = {s->sh, s->sw}, dil = {s->dh - 1, s->dw - 1};
  dnnl_dims_t pl = {s->ph, s->pw}, pr = {prh, prw};
  dnnl_memory_desc_t src_any = nullptr, wei_any = nullptr, dst_any = nullptr;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  bool ok =
      dnnl_memory_desc_create_with_strides(&e->src_plain, 4, src, AS_DNNL_F32, src_st) == 0 &&
      dnnl_memory_desc_create_with_strides(&e->dst_plain, 4, dst, AS_DNNL_F32, dst_st) == 0 &&
      dnnl_memory_desc_create_with_tag(&src_any, 4, src, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0 &&
      dnnl_memory_desc_create_with_tag(&wei_any, 4, wei, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0 &&
      dnnl_memory_desc_create_with_tag(&dst_any, 4, dst, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0 &&
      dnnl_primitive_attr_create(&attr) == 0 &&
      dnnl_primitive_attr_set_scratchpad_mode(attr, AS_DNNL_SCRATCHPAD_USER) == 0 &&
      dnnl_convolution_forward_primitive_desc_create(
          &pd, as_dnnl_engine(), AS_DNNL_FORWARD_INFERENCE, AS_DNNL_CONVOLUTION_DIRECT, src_any,
          wei_any, nullptr, dst_any, strides, dil, pl, pr, attr) == 0 &&
      dnnl_primitive_create(&e->conv, pd) == 0 &&
      dnnl_memory_desc_clone(&e->src, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_SRC_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&e->weights, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_WEIGHTS_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&e->dst, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_DST_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&e->scratch, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_SCRATCHPAD_MD, 0)) == 0;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  dnnl_memory_desc_t tmp[] = {src_any, wei_any, dst_any};
  for (dnnl_memory_desc_t md : tmp)
    if (md) dnnl_memory_desc_destroy(md);
  if (ok && !dnnl_memory_desc_equal(e->src_plain, e->src))
    ok = (e->to_conv = as_dnnl_reorder(e->src_plain, e->src)) != nullptr;
  if (ok && !dnnl_memory_desc_equal(e->dst, e->dst_plain))
    ok = (e->from_conv = as_dnnl_reorder(e->dst, e->dst_plain)) != nullptr;
  if (!ok) {
    as_conv_shape_free(e);
    return false;
  }
  e->src_bytes = e->to_conv ? as_round64((int64_t)dnnl_memory_desc_get_size(e->src)) : 0;
  e->dst_bytes = e->from_conv ? as_round64((int64_t)dnnl_memory_desc_get_size(e->dst)) : 0;
  e->scratch_bytes = as_round64((int64_t)dnnl_memory_desc_get_size(e->scratch));
  return true;
}

static bool as_dnnl_run(const_dnnl_primitive_t p, int n, const int* args,
                        const const_dnnl_memory_desc_t* mds, void* const* ptrs) {
  dnnl_exec_arg_t exec[4];
  bool ok = true;
  int made = 0;
  for (; made < n && ok; ++made) {
    exec[made].arg = args[made];
    ok = dnnl_memory_create(&exec[made].memory, mds[made], as_dnnl_engine(), ptrs[made]) == 0;
    if (!ok) break;
  }
  dnnl_stream_t stream = as_dnnl_stream();
  ok = ok && stream && dnnl_primitive_execute(p, stream, n, exec) == 0;
  for (int k = 0; k < made; ++k)
    if (exec[k].memory) dnnl_memory_destroy(exec[k].memory);
  return ok;
}

// OIHW weights `plain` reordered into `packed` (layout `md`).
static bool as_conv_pack(const AsConvSite* s, const float* plain, const_dnnl_memory_desc_t md,
                         float* packed) {
  dnnl_dims_t dims = {s->o, s->c, s->kh, s->kw};
  dnnl_dims_t st = {s->c * s->kh * s->kw, s->kh * s->kw, s->kw, 1};
  dnnl_memory_desc_t plain_md = nullptr;
  bool ok = dnnl_memory_desc_create_with_strides(&plain_md, 4, dims, AS_DNNL_F32, st) == 0;
  dnnl_primitive_t r = ok ? as_dnnl_reorder(plain_md, md) : nullptr;
  const int args[2] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_DST};
  const_dnnl_memory_desc_t mds[2] = {plain_md, md};
  void* ptrs[2] = {(void*)plain, packed};
  ok = r && as_dnnl_run(r, 2, args, mds, ptrs);
  if (r) dnnl_primitive_destroy(r);
  if (plain_md) dnnl_memory_desc_destroy(plain_md);
  return ok;
}

// The layer's weights in the layout of `e`, packed on first use (under the site's lock);
// `plain` itself for weights nobody watches.
static const float* as_conv_packed(AsConvSite* s, const AsConvShape* e, const float* plain) {
  const uint64_t gen = __atomic_load_n(&as_weights_generation, __ATOMIC_SEQ_CST);
  AsPackedWeights* p = nullptr;
  for (int64_t k = 0; k < s->npacked && !p; ++k)
    if (s->packed[k].plain == plain && dnnl_memory_desc_equal(s->packed[k].md, e->weights))
      p = &s->packed[k];
  if (p && p->generation == gen) return p->data;
  if (!p) {
    // Entries exist only for watched weights (unwatching drops them): look no further.
    if (!as_is_watched(plain)) return plain;  // the caller packs it for this call
    AsPackedWeights* grown =
        (AsPackedWeights*)realloc(s->packed, sizeof(AsPackedWeights) * (s->npacked + 1));
    if (!grown) return nullptr;
    s->packed = grown;
    p = &s->packed[s->npacked];
    memset(p, 0, sizeof(*p));
    p->plain = plain;
    p->data = (float*)as_alloc((int64_t)dnnl_memory_desc_get_size(e->weights));
    if (!p->data || dnnl_memory_desc_clone(&p->md, e->weights)) {
      free(p->data);
      return nullptr;
    }
    s->npacked += 1;
  }
  if (!as_conv_pack(s, plain, p->md, p->data)) return nullptr;
  p->generation = gen;
  return p->data;
}

// The entry for (h, w), made if new; marked in use until as_conv_release.
static AsConvShape* as_conv_acquire(AsConvSite* s, int64_t h, int64_t w, const float* weights,
                                    const float** packed) {
  pthread_mutex_lock(&s->mu);
  if (!s->listed) {
    pthread_mutex_lock(&as_watch_mu);
    s->next = as_sites;
    as_sites = s;
    s->listed = true;
    pthread_mutex_unlock(&as_watch_mu);
  }
  AsConvShape* hit = nullptr;
  AsConvShape* victim = nullptr;
  for (int k = 0; k < AS_CONV_SHAPES && !hit; ++k) {
    AsConvShape* e = &s->shapes[k];
    if (e->conv && e->h == h && e->w == w) hit = e;
    else if (!e->users && (!victim || !e->conv || (victim->conv && e->last_use < victim->last_use)))
      victim = e;
  }
  if (!hit && victim && !s->broken) {
    if (victim->conv) as_conv_shape_free(victim);
    if (as_conv_shape_make(s, h, w, victim)) hit = victim;
    else s->broken = true;
  }
  if (hit) {
    *packed = as_conv_packed(s, hit, weights);
    if (*packed) {
      hit->users += 1;
      hit->last_use = ++s->clock;
    } else {
      hit = nullptr;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return hit;
}

static void as_conv_release(AsConvSite* s, AsConvShape* e) {
  pthread_mutex_lock(&s->mu);
  e->users -= 1;
  pthread_mutex_unlock(&s->mu);
}

// y = conv(x, w) for one image in NCHW; false if oneDNN could not run it (the caller
// falls back to im2col + GEMM).
static bool as_dnnl_conv2d(AsConvSite* s, const float* x, const float* w, float* y, int64_t h,
                           int64_t wd) {
  if (s->broken || !as_dnnl_engine()) return false;
  const float* packed = nullptr;
  AsConvShape* e = as_conv_acquire(s, h, wd, w, &packed);
  if (!e) return false;
  const int64_t own_weights =
      packed == w ? as_round64((int64_t)dnnl_memory_desc_get_size(e->weights)) : 0;
  char* buf = (char*)as_scratch(e->src_bytes + e->dst_bytes + e->scratch_bytes + own_weights);
  bool ok = buf != nullptr;
  void* src = e->to_conv ? (void*)buf : (void*)x;
  void* dst = e->from_conv ? (void*)(buf + e->src_bytes) : (void*)y;
  void* scratch = buf + e->src_bytes + e->dst_bytes;
  if (ok && own_weights) {
    float* mine = (float*)(buf + e->src_bytes + e->dst_bytes + e->scratch_bytes);
    ok = as_conv_pack(s, w, e->weights, mine);
    packed = mine;
  }
  if (ok && e->to_conv) {
    const int args[2] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_DST};
    const_dnnl_memory_desc_t mds[2] = {e->src_plain, e->src};
    void* ptrs[2] = {(void*)x, src};
    ok = as_dnnl_run(e->to_conv, 2, args, mds, ptrs);
  }
  if (ok) {
    const int args[4] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_WEIGHTS, AS_DNNL_ARG_DST,
                         AS_DNNL_ARG_SCRATCHPAD};
    const_dnnl_memory_desc_t mds[4] = {e->src, e->weights, e->dst, e->scratch};
    void* ptrs[4] = {src, (void*)packed, dst, scratch};
    ok = as_dnnl_run(e->conv, 4, args, mds, ptrs);
  }
  if (ok && e->from_conv) {
    const int args[2] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_DST};
    const_dnnl_memory_desc_t mds[2] = {e->dst, e->dst_plain};
    void* ptrs[2] = {dst, (void*)y};
    ok = as_dnnl_run(e->from_conv, 2, args, mds, ptrs);
  }
  as_conv_release(s, e);
  return ok;
}
