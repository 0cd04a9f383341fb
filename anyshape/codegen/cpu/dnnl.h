// anyshape CPU runtime: the part of oneDNN's C API the generated code uses, and the
// weights it keeps packed in oneDNN's layouts (plugin mode, when installed). Pasted after
// prelude.h, before dnnl_conv.h and dnnl_matmul.h, into translation units that call
// oneDNN primitives and into the glue object (below); only compiled with ANYSHAPE_DNNL
// (the build links the onednn-cpu-gomp wheel's libdnnl.so.3, which ships no headers).
// Only entry points stable across oneDNN 3.x are declared.
#include <pthread.h>

// What runs once per site, shape or weight (the engine, primitives, packing, the watch)
// is compiled at -O1: the work is oneDNN's (the glue object 0.39-0.43 s at -O1 against
// 0.53-0.56 s at -O3, compiler CPU on a 2-core AMD EPYC with AVX-512).
#define AS_SETUP __attribute__((optimize("O1")))

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
typedef struct dnnl_post_ops* dnnl_post_ops_t;
typedef const struct dnnl_post_ops* const_dnnl_post_ops_t;
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
int dnnl_matmul_primitive_desc_create(dnnl_primitive_desc_t*, dnnl_engine_t,
                                      const_dnnl_memory_desc_t src, const_dnnl_memory_desc_t weights,
                                      const_dnnl_memory_desc_t bias, const_dnnl_memory_desc_t dst,
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
int dnnl_primitive_attr_set_post_ops(dnnl_primitive_attr_t, const_dnnl_post_ops_t);
int dnnl_post_ops_create(dnnl_post_ops_t*);
int dnnl_post_ops_destroy(dnnl_post_ops_t);
int dnnl_post_ops_append_eltwise(dnnl_post_ops_t, int alg_kind, float alpha, float beta);
int dnnl_post_ops_append_binary(dnnl_post_ops_t, int alg_kind, const_dnnl_memory_desc_t src1);
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
  AS_DNNL_ARG_SRC_1 = 2,
  AS_DNNL_POST_OP_ARG_BASE = 32768,  // DNNL_ARG_ATTR_MULTIPLE_POST_OP(k) = base * (k + 1)
  AS_DNNL_QUERY_EXEC_ARG_MD = 255,
  AS_DNNL_ELTWISE_RELU = 0x20,
  AS_DNNL_BINARY_ADD = 0x1fff0,
  AS_DNNL_BINARY_MUL = 0x1fff1,
  AS_DNNL_BINARY_SUB = 0x1fff5,
};

// A convolution's epilogue run by oneDNN as post-ops (post_ops.py): 4 bits per op, the
// first op lowest; 1 x * v, 2 x + v, 3 x - v with v a vector of one value per output
// channel, 4 max(x, 0), 5 x + t with t a tensor of the output's shape. At most 8 ops.
#define AS_POST_OPS_MAX 8

// Where a kernel's oneDNN call site lives: one table per kernel, one site per geometry
// (as_site_for).
struct AsSiteTable {
  pthread_mutex_t mu;
  void** sites;
  int64_t count;
};

// Weights of one layer in the layout one primitive wants.
struct AsPackedWeights {
  const float* plain;
  dnnl_memory_desc_t md;
  float* data;
  uint64_t generation;
};

// The packed weights of one call site (a site serves every layer its kernel is shared by).
struct AsWeightsCache {
  pthread_mutex_t mu;
  AsPackedWeights* packed;
  int64_t npacked;
  AsWeightsCache* next;  // every site that has run, for `anyshape_unwatch_weights`
  bool listed;
};

// The glue, everything below here and in dnnl_conv.h and dnnl_matmul.h but the types and
// the entry points' declarations (AS_GLUE_ENTRY), is compiled once per machine and ISA
// into an object that every library holding oneDNN call sites links (build.py,
// `dnnl_glue_object`, with AS_DNNL_GLUE_OBJECT): the units of kernels see the types and
// declarations alone. Compiled into each unit, it was a third of a small model's build
// (0.16 s for the matmul's, 0.16 s for the convolution's, per unit, 2-core AMD EPYC with
// AVX-512). The object is one more unit of the library (AS_SPLIT_UNIT): its state (the
// engine, the watched weights) is one copy per library, as when each unit compiled it.
#define AS_GLUE_ENTRY __attribute__((visibility("hidden")))

#ifdef AS_DNNL_GLUE_OBJECT

static inline bool as_post_op_binary(int64_t op) { return (op >= 1 && op <= 3) || op == 5; }

// `attr` given the post-ops of `code`: vectors described by `vector`, tensors by `tensor`.
AS_SETUP static bool as_dnnl_post_ops(dnnl_primitive_attr_t attr, int64_t code,
                                      const_dnnl_memory_desc_t vector,
                                      const_dnnl_memory_desc_t tensor) {
  dnnl_post_ops_t po = nullptr;
  bool ok = dnnl_post_ops_create(&po) == 0;
  for (int64_t c = code; ok && c; c >>= 4) {
    const int64_t op = c & 15;
    if (op == 4) ok = dnnl_post_ops_append_eltwise(po, AS_DNNL_ELTWISE_RELU, 0.f, 0.f) == 0;
    else if (op == 5) ok = dnnl_post_ops_append_binary(po, AS_DNNL_BINARY_ADD, tensor) == 0;
    else if (op >= 1 && op <= 3)
      ok = dnnl_post_ops_append_binary(po, op == 1 ? AS_DNNL_BINARY_MUL
                                           : op == 2 ? AS_DNNL_BINARY_ADD
                                                     : AS_DNNL_BINARY_SUB, vector) == 0;
    else ok = false;
  }
  ok = ok && dnnl_primitive_attr_set_post_ops(attr, po) == 0;
  if (po) dnnl_post_ops_destroy(po);
  return ok;
}

// The execute arguments of the operands of `code` appended at args/mds/ptrs; their count.
static int as_dnnl_post_args(int64_t code, const_dnnl_memory_desc_t vector,
                             const_dnnl_memory_desc_t tensor, const float* const* operands,
                             int* args, const_dnnl_memory_desc_t* mds, void** ptrs) {
  int n = 0, k = 0, v = 0;
  for (int64_t c = code; c; c >>= 4, ++k) {
    if (!as_post_op_binary(c & 15)) continue;
    args[n] = AS_DNNL_POST_OP_ARG_BASE * (k + 1) | AS_DNNL_ARG_SRC_1;
    mds[n] = (c & 15) == 5 ? tensor : vector;
    ptrs[n++] = operands ? (void*)operands[v++] : nullptr;
  }
  return n;
}

// Whether the primitive made with the post-ops of `code` takes their operands as the
// execute arguments `as_dnnl_post_args` names, each of the size it will be given.
AS_SETUP static bool as_dnnl_post_args_known(const_dnnl_primitive_desc_t pd, int64_t code,
                                             const_dnnl_memory_desc_t vector,
                                             const_dnnl_memory_desc_t tensor) {
  int args[AS_POST_OPS_MAX];
  const_dnnl_memory_desc_t mds[AS_POST_OPS_MAX];
  void* ptrs[AS_POST_OPS_MAX];
  const int n = as_dnnl_post_args(code, vector, tensor, nullptr, args, mds, ptrs);
  for (int i = 0; i < n; ++i) {
    const_dnnl_memory_desc_t md = dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_EXEC_ARG_MD, args[i]);
    if (!md || dnnl_memory_desc_get_size(md) != dnnl_memory_desc_get_size(mds[i])) return false;
  }
  return true;
}

AS_SETUP AS_SHARED dnnl_engine_t as_dnnl_engine() {
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
AS_SETUP AS_SHARED dnnl_stream_t as_dnnl_stream() {
  static thread_local AsDnnlStream stream;
  if (!stream.s && dnnl_stream_create(&stream.s, as_dnnl_engine(), 1) != 0) stream.s = nullptr;
  return stream.s;
}

// A weight is packed once only if its owner watches it for in-place changes (plugin mode
// registers the weights it watches with `anyshape_watch_weights` and calls
// `anyshape_weights_changed()` after any change). Other weights — a library loaded twice
// serves models that may not watch theirs — are packed into each call's scratch space.
AS_SHARED pthread_mutex_t as_watch_mu = PTHREAD_MUTEX_INITIALIZER;
AS_SHARED const void** as_watched = nullptr;
AS_SHARED int64_t as_nwatched = 0;
AS_SHARED uint64_t as_weights_generation = 1;
// Registering weights also bumps the generation: new weights may sit where freed ones
// were packed from.
extern "C" AS_SETUP int anyshape_watch_weights(const void* const* weights, int64_t n) {
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

AS_SHARED AsWeightsCache* as_sites = nullptr;

// Called under c->mu on each use: the site joins the list `anyshape_unwatch_weights` walks.
static void as_cache_list(AsWeightsCache* c) {
  if (c->listed) return;
  pthread_mutex_lock(&as_watch_mu);
  c->next = as_sites;
  as_sites = c;
  c->listed = true;
  pthread_mutex_unlock(&as_watch_mu);
}

// The owner of these weights is gone: forget them and free their packed copies, unless
// another owner (a second compiled model over the same weights, served by this library)
// still watches them and may be running with those copies.
extern "C" AS_SETUP void anyshape_unwatch_weights(const void* const* weights, int64_t n) {
  const void** gone_list = (const void**)malloc(sizeof(void*) * (n > 0 ? n : 1));
  int64_t ngone = 0;
  pthread_mutex_lock(&as_watch_mu);
  for (int64_t k = 0; k < n; ++k) {
    bool still = false;
    for (int64_t j = 0; j < as_nwatched; ++j)
      if (as_watched[j] == weights[k]) {
        as_watched[j] = as_watched[--as_nwatched];
        break;
      }
    for (int64_t j = 0; j < as_nwatched && !still; ++j) still = as_watched[j] == weights[k];
    if (!still && gone_list) gone_list[ngone++] = weights[k];
  }
  AsWeightsCache* sites = as_sites;  // only ever grows at the head
  pthread_mutex_unlock(&as_watch_mu);
  weights = gone_list;  // without memory to list them, the copies stay (they are only stale)
  n = ngone;
  for (AsWeightsCache* s = sites; s; s = s->next) {
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
  free(gone_list);
  __atomic_add_fetch(&as_weights_generation, 1, __ATOMIC_SEQ_CST);
}

// Frees what describing a primitive took, once it is made (or failed): its descriptor,
// its attributes and the n memory descriptors it was described with (null ones skipped).
AS_SETUP static void as_dnnl_release(dnnl_primitive_desc_t pd, dnnl_primitive_attr_t attr,
                            dnnl_memory_desc_t* mds, int n) {
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  for (int i = 0; i < n; ++i)
    if (mds[i]) dnnl_memory_desc_destroy(mds[i]);
}

AS_SETUP static dnnl_primitive_t as_dnnl_reorder(const_dnnl_memory_desc_t from, const_dnnl_memory_desc_t to) {
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t p = nullptr;
  if (dnnl_reorder_primitive_desc_create(&pd, from, as_dnnl_engine(), to, as_dnnl_engine(), nullptr))
    return nullptr;
  if (dnnl_primitive_create(&p, pd)) p = nullptr;
  dnnl_primitive_desc_destroy(pd);
  return p;
}

static bool as_dnnl_run(const_dnnl_primitive_t p, int n, const int* args,
                        const const_dnnl_memory_desc_t* mds, void* const* ptrs) {
  dnnl_exec_arg_t exec[4 + AS_POST_OPS_MAX];
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

// `rows` x `cols` row-major floats `plain` transposed into `packed` (`cols` x `rows`), 64
// rows of `plain` per task over the threads, 8x8 tiles through registers (as_transpose2d).
// Repacking BERT-base's 72 linear weights into buffers already mapped took 44 ms this way
// and 66 ms through oneDNN's reorder (2-core AMD EPYC, AVX-512).
static void as_pack_transposed(const float* plain, int64_t rows, int64_t cols, float* packed,
                               int64_t ld) {
  const int64_t tasks = (rows + 63) / 64;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r0 = t * 64, n = as_min64(64, rows - r0);
    as_transpose2d<float>(plain + r0 * cols, cols, packed + r0, ld, n, cols);
  }
}

// `plain` (laid out as `plain_md`) reordered into `packed` (layout `md`).
AS_SETUP static bool as_dnnl_pack(const_dnnl_memory_desc_t plain_md, const float* plain,
                         const_dnnl_memory_desc_t md, float* packed) {
  dnnl_primitive_t r = as_dnnl_reorder(plain_md, md);
  const int args[2] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_DST};
  const_dnnl_memory_desc_t mds[2] = {plain_md, md};
  void* ptrs[2] = {(void*)plain, packed};
  const bool ok = r && as_dnnl_run(r, 2, args, mds, ptrs);
  if (r) dnnl_primitive_destroy(r);
  return ok;
}

// Floats from one packed panel to the next (64-byte aligned, as each panel starts).
static inline int64_t as_packed_panel_floats(const_dnnl_memory_desc_t md) {
  return as_round64((int64_t)dnnl_memory_desc_get_size(md)) / 4;
}

// A caller's own packing of a site's weight (as_packed_weights): fn(site, plain, to).
struct AsPacker {
  void (*fn)(const void* site, const float* plain, float* to);
  const void* site;
};

// Under c->mu: the weights `plain` (layout `plain_md`) in layout `md`, packed on first use
// (with `deferred` given: on the second, see below) and again after
// `anyshape_weights_changed()`; `plain` itself for weights nobody watches (the caller
// decides what to do with them); null when out of memory or oneDNN failed.
//
// A caller that can run a watched weight as the model holds it passes `deferred`: on the
// weight's first use in this layout it gets `plain` back and `*deferred` set, and the copy
// is made on the second use. A call made once (a script that runs a model once, the check
// of a restored model, a row count met once) then never pays for a copy no later call
// reads: BERT-base's 340 MB per layout, whose first touch of new memory took 0.1-0.7 s
// on a 2-core KVM guest, against 0.05 s of packing into memory already mapped.
// With `panels` > 1, `plain_md` describes one panel, the k-th at `plain + k * step`, and
// the packed panels follow each other `as_packed_panel_floats(md)` apart. Each panel is
// laid out by oneDNN's reorder, or by `pack`, the caller's own function (a linear layer's
// weight transposed by as_pack_transposed, the few-rows kernel's column panels).
static const float* as_packed_weights(AsWeightsCache* c, const float* plain,
                                      const_dnnl_memory_desc_t plain_md,
                                      const_dnnl_memory_desc_t md, int64_t panels = 1,
                                      int64_t step = 0, const AsPacker* pack = nullptr,
                                      bool* deferred = nullptr) {
  const uint64_t gen = __atomic_load_n(&as_weights_generation, __ATOMIC_SEQ_CST);
  AsPackedWeights* p = nullptr;
  for (int64_t k = 0; k < c->npacked && !p; ++k)
    if (c->packed[k].plain == plain && dnnl_memory_desc_equal(c->packed[k].md, md))
      p = &c->packed[k];
  if (p && p->generation == gen) return p->data;
  if (!p) {
    // Entries exist only for watched weights (unwatching drops them): look no further.
    if (!as_is_watched(plain)) return plain;
    AsPackedWeights* grown =
        (AsPackedWeights*)realloc(c->packed, sizeof(AsPackedWeights) * (c->npacked + 1));
    if (!grown) return nullptr;
    c->packed = grown;
    p = &c->packed[c->npacked];
    memset(p, 0, sizeof(*p));
    p->plain = plain;
    if (dnnl_memory_desc_clone(&p->md, md)) return nullptr;
    c->npacked += 1;
    if (deferred) {  // (generation 0: no copy made yet)
      *deferred = true;
      return plain;
    }
  }
  if (!p->data) {
    p->data = (float*)as_alloc(panels * 4 * as_packed_panel_floats(md));
    if (!p->data) return nullptr;
  }
  for (int64_t k = 0; k < panels; ++k) {
    float* to = p->data + k * as_packed_panel_floats(md);
    if (pack)
      pack->fn(pack->site, plain + k * step, to);
    else if (!as_dnnl_pack(plain_md, plain + k * step, p->md, to))
      return nullptr;
  }
  p->generation = gen;
  return p->data;
}

// The call sites of one kernel family (families.py): a kernel compiled once for several
// static geometries keeps one site per geometry, found by the geometry's `words` int64s
// (the first fields of every site struct), made zeroed on its first call and kept for the
// library's life, as a kernel's own static site is. The lookup holds the table's lock
// only while it scans a few entries. Never null: out of memory, a site marked broken (the
// caller's BLAS or im2col path runs). Kept out of every interprocedural optimization
// (noipa, also on the two wrappers): inlined into a kernel whose geometry is constant, or
// specialized for it, GCC 12's points-to analysis at -O3 folded the geometry's copy into
// the new site wrongly (GPT-2's attention projection gave wrong values; right at -O0 or
// with -fno-tree-pta). A call costs nothing beside a GEMM.
template <class Site>
__attribute__((noipa)) static Site* as_site_for(AsSiteTable* t, const int64_t* geometry, int64_t words) {
  pthread_mutex_lock(&t->mu);
  Site* hit = nullptr;
  for (int64_t i = 0; i < t->count && !hit; ++i)
    if (memcmp(t->sites[i], geometry, sizeof(int64_t) * words) == 0) hit = (Site*)t->sites[i];
  if (!hit) {
    void** grown = (void**)realloc(t->sites, sizeof(void*) * (t->count + 1));
    if (grown) t->sites = grown;
    Site* made = grown ? (Site*)calloc(1, sizeof(Site)) : nullptr;
    if (made) {
      memcpy((void*)made, geometry, sizeof(int64_t) * words);
      pthread_mutex_init(&made->weights.mu, nullptr);
      t->sites[t->count++] = made;
      hit = made;
    }
  }
  pthread_mutex_unlock(&t->mu);
  if (!hit) {
    static Site refused;
    static const bool marked = (refused.broken = true);
    (void)marked;
    hit = &refused;
  }
  return hit;
}
#endif  // AS_DNNL_GLUE_OBJECT
