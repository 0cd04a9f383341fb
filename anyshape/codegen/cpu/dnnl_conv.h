// anyshape CPU runtime: 2-D float convolutions through oneDNN (plugin mode, when installed).
// Pasted after dnnl.h into translation units that hold such a convolution.
//
// oneDNN's direct convolutions (brgconv / jit, in a channels-last or blocked layout) ran
// ResNet-50's 3x3 convolutions at 225-245 GFLOP/s on the 2-core Zen 4 machine where im2col +
// OpenBLAS reached 95-130 (docs/architecture.md, "Libraries"). A oneDNN primitive is made
// for one shape, so each call site keeps the primitives of the input sizes it has seen:
// one image at a time (the batch size never makes a new one), created on first sight of
// an (H, W) in about 0.3-0.5 ms, then reused. Weights are reordered into the convolution's
// layout once per weight tensor when their owner watches them for changes (below).

// Shapes kept per call site; the least recently used one not running is replaced.
#define AS_CONV_SHAPES 32

// The primitives for one input size (one image).
struct AsConvShape {
  int64_t h, w;
  dnnl_primitive_t conv, to_conv, from_conv;  // reorders are null when layouts agree
  dnnl_memory_desc_t src_plain, dst_plain, src, weights, dst, scratch;
  dnnl_memory_desc_t vector;  // a post-op's per-channel vector (null without post-ops)
  int64_t src_bytes, dst_bytes, scratch_bytes;
  int64_t last_use, users;
  bool refused;  // oneDNN made no primitive for this size (conv is null): its calls fall back
};

// One call site: a convolution's static geometry, its shapes and its layers' packed weights.
// Activations are channels first ([C, H, W] per image) or, with nhwc, channels last.
struct AsConvSite {
  int64_t c, o, kh, kw, sh, sw, ph, pw, dh, dw, nhwc;
  int64_t post;  // the epilogue as oneDNN post-ops (dnnl.h), 0 for none
  AsWeightsCache weights;
  AsConvShape shapes[AS_CONV_SHAPES];
  int64_t clock;
  bool made_one;  // a primitive was made for some size: a later refusal is that size's alone
  bool broken;    // oneDNN refused this geometry: the caller's own path runs instead
};

// conv(x, w) for one image, or 0 (below); the site of a kernel for one geometry.
AS_GLUE_ENTRY int as_dnnl_conv2d(AsConvSite* s, const float* x, const float* w, float* y,
                                 int64_t h, int64_t wd, const float* const* operands = nullptr,
                                 float* z = nullptr);
AS_GLUE_ENTRY AsConvSite* as_conv_site(AsSiteTable* t, int64_t c, int64_t o, int64_t kh,
                                       int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                       int64_t pw, int64_t dh, int64_t dw, int64_t nhwc,
                                       int64_t post);

// gemm.h's im2col path for float, what a kernel runs where oneDNN does not: compiled
// once here, so no unit of a library compiles the template (a kernel calls it without
// template arguments and overload resolution picks this function).
AS_GLUE_ENTRY bool as_conv2d_nhwc(const float* x, const float* w, float* y, int64_t c,
                                  int64_t o, int64_t h, int64_t wd, int64_t oh, int64_t ow,
                                  int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                  int64_t pw, int64_t dh, int64_t dw);

#ifdef AS_DNNL_GLUE_OBJECT
AS_GLUE_ENTRY bool as_conv2d_nhwc(const float* x, const float* w, float* y, int64_t c,
                                  int64_t o, int64_t h, int64_t wd, int64_t oh, int64_t ow,
                                  int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                  int64_t pw, int64_t dh, int64_t dw) {
  return as_conv2d_nhwc<float>(x, w, y, c, o, h, wd, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw);
}

AS_SETUP static void as_conv_shape_free(AsConvShape* e) {
  if (e->conv) dnnl_primitive_destroy(e->conv);
  if (e->to_conv) dnnl_primitive_destroy(e->to_conv);
  if (e->from_conv) dnnl_primitive_destroy(e->from_conv);
  dnnl_memory_desc_t mds[] = {e->src_plain, e->dst_plain, e->src, e->weights, e->dst, e->scratch, e->vector};
  for (dnnl_memory_desc_t md : mds)
    if (md) dnnl_memory_desc_destroy(md);
  memset(e, 0, sizeof(*e));
}

AS_SETUP static bool as_conv_shape_make(const AsConvSite* s, int64_t h, int64_t w, AsConvShape* e) {
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
  if (s->nhwc) {  // the same dims, channels innermost
    src_st[1] = 1, src_st[2] = w * s->c, src_st[3] = s->c;
    dst_st[1] = 1, dst_st[2] = ow * s->o, dst_st[3] = s->o;
  }
  dnnl_dims_t strides = {s->sh, s->sw}, dil = {s->dh - 1, s->dw - 1};
  dnnl_dims_t pl = {s->ph, s->pw}, pr = {prh, prw};
  dnnl_memory_desc_t src_any = nullptr, wei_any = nullptr, dst_any = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_dims_t per_channel = {1, s->o, 1, 1}, per_channel_st = {s->o, 1, 1, 1};
  bool ok =
      dnnl_memory_desc_create_with_strides(&e->src_plain, 4, src, AS_DNNL_F32, src_st) == 0 &&
      dnnl_memory_desc_create_with_strides(&e->dst_plain, 4, dst, AS_DNNL_F32, dst_st) == 0 &&
      dnnl_memory_desc_create_with_tag(&src_any, 4, src, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0 &&
      dnnl_memory_desc_create_with_tag(&wei_any, 4, wei, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0 &&
      dnnl_memory_desc_create_with_tag(&dst_any, 4, dst, AS_DNNL_F32, AS_DNNL_TAG_ANY) == 0;
  // The primitive's description, with the site's post-ops where oneDNN takes them (e->vector
  // describes their per-channel vectors), else without (the caller's epilogue runs).
  auto describe = [&](bool with_post) -> dnnl_primitive_desc_t {
    dnnl_primitive_attr_t attr = nullptr;
    dnnl_primitive_desc_t pd = nullptr;
    const bool made =
        dnnl_primitive_attr_create(&attr) == 0 &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, AS_DNNL_SCRATCHPAD_USER) == 0 &&
        (!with_post || as_dnnl_post_ops(attr, s->post, e->vector, e->dst_plain)) &&
        dnnl_convolution_forward_primitive_desc_create(
            &pd, as_dnnl_engine(), AS_DNNL_FORWARD_INFERENCE, AS_DNNL_CONVOLUTION_DIRECT, src_any,
            wei_any, nullptr, dst_any, strides, dil, pl, pr, attr) == 0 &&
        (!with_post || as_dnnl_post_args_known(pd, s->post, e->vector, e->dst_plain));
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!made && pd) dnnl_primitive_desc_destroy(pd);
    return made ? pd : nullptr;
  };
  if (ok && s->post && dnnl_memory_desc_create_with_strides(&e->vector, 4, per_channel,
                                                            AS_DNNL_F32, per_channel_st) == 0)
    pd = describe(true);
  if (!pd && e->vector) {
    dnnl_memory_desc_destroy(e->vector);
    e->vector = nullptr;
  }
  if (ok && !pd) pd = describe(false);
  ok = ok && pd &&
      dnnl_primitive_create(&e->conv, pd) == 0 &&
      dnnl_memory_desc_clone(&e->src, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_SRC_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&e->weights, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_WEIGHTS_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&e->dst, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_DST_MD, 0)) == 0 &&
      dnnl_memory_desc_clone(&e->scratch, dnnl_primitive_desc_query_md(pd, AS_DNNL_QUERY_SCRATCHPAD_MD, 0)) == 0;
  dnnl_memory_desc_t described[] = {src_any, wei_any, dst_any};
  as_dnnl_release(pd, nullptr, described, 3);
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

// OIHW weights as the model holds them.
static dnnl_memory_desc_t as_conv_plain_weights(const AsConvSite* s) {
  dnnl_dims_t dims = {s->o, s->c, s->kh, s->kw};
  dnnl_dims_t st = {s->c * s->kh * s->kw, s->kh * s->kw, s->kw, 1};
  dnnl_memory_desc_t md = nullptr;
  return dnnl_memory_desc_create_with_strides(&md, 4, dims, AS_DNNL_F32, st) == 0 ? md : nullptr;
}

// OIHW weights `plain` reordered into `packed` (layout `md`).
AS_SETUP static bool as_conv_pack(const AsConvSite* s, const float* plain, const_dnnl_memory_desc_t md,
                         float* packed) {
  dnnl_memory_desc_t plain_md = as_conv_plain_weights(s);
  const bool ok = plain_md && as_dnnl_pack(plain_md, plain, md, packed);
  if (plain_md) dnnl_memory_desc_destroy(plain_md);
  return ok;
}

// The entry for (h, w), made if new; marked in use until as_conv_release.
static AsConvShape* as_conv_acquire(AsConvSite* s, int64_t h, int64_t w, const float* weights,
                                    const float** packed) {
  pthread_mutex_lock(&s->weights.mu);
  as_cache_list(&s->weights);
  AsConvShape* hit = nullptr;
  AsConvShape* victim = nullptr;
  bool refused = false;
  for (int k = 0; k < AS_CONV_SHAPES && !hit && !refused; ++k) {
    AsConvShape* e = &s->shapes[k];
    const bool used = e->conv || e->refused;
    if (used && e->h == h && e->w == w) {
      if (e->conv) hit = e;
      else refused = true;
      e->last_use = ++s->clock;
    } else if (!e->users && (!victim || !used || ((victim->conv || victim->refused) && e->last_use < victim->last_use))) {
      victim = e;
    }
  }
  if (!hit && !refused && victim && !s->broken) {
    if (victim->conv || victim->refused) as_conv_shape_free(victim);
    if (as_conv_shape_make(s, h, w, victim)) {
      hit = victim;
      s->made_one = true;
    } else if (s->made_one) {  // this size only (as_conv_shape_make left it cleared)
      victim->refused = true;
      victim->h = h;
      victim->w = w;
      victim->last_use = ++s->clock;
    } else {
      s->broken = true;
    }
  }
  if (hit) {
    dnnl_memory_desc_t plain_md = as_conv_plain_weights(s);
    bool deferred = false;  // (unread: a first use packs into the call's scratch, below)
    *packed = plain_md ? as_packed_weights(&s->weights, weights, plain_md, hit->weights, 1, 0,
                                           nullptr, &deferred)
                       : nullptr;
    if (plain_md) dnnl_memory_desc_destroy(plain_md);
    if (*packed) {
      hit->users += 1;
      hit->last_use = ++s->clock;
    } else {
      hit = nullptr;
    }
  }
  pthread_mutex_unlock(&s->weights.mu);
  return hit;
}

static void as_conv_release(AsConvSite* s, AsConvShape* e) {
  pthread_mutex_lock(&s->weights.mu);
  e->users -= 1;
  pthread_mutex_unlock(&s->weights.mu);
}

// y = conv(x, w) for one image (CHW, or HWC when the site is nhwc): 1; with the site's
// post-ops (their `operands`: vectors, or this image's part of a tensor), z = the epilogue
// of conv(x, w) instead: 2 (where oneDNN took them for this size); 0 if oneDNN could not
// run it (the caller falls back to im2col + GEMM).
AS_GLUE_ENTRY int as_dnnl_conv2d(AsConvSite* s, const float* x, const float* w, float* y,
                                 int64_t h, int64_t wd, const float* const* operands,
                                 float* z) {
  if (s->broken || !as_dnnl_engine()) return 0;
  const float* packed = nullptr;
  AsConvShape* e = as_conv_acquire(s, h, wd, w, &packed);
  if (!e) return 0;
  const bool fused = e->vector != nullptr;
  if (fused) y = z;
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
    int args[4 + AS_POST_OPS_MAX] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_WEIGHTS, AS_DNNL_ARG_DST,
                                     AS_DNNL_ARG_SCRATCHPAD};
    const_dnnl_memory_desc_t mds[4 + AS_POST_OPS_MAX] = {e->src, e->weights, e->dst, e->scratch};
    void* ptrs[4 + AS_POST_OPS_MAX] = {src, (void*)packed, dst, scratch};
    const int n = fused ? 4 + as_dnnl_post_args(s->post, e->vector, e->dst_plain, operands,
                                                 args + 4, mds + 4, ptrs + 4)
                        : 4;
    ok = as_dnnl_run(e->conv, n, args, mds, ptrs);
  }
  if (ok && e->from_conv) {
    const int args[2] = {AS_DNNL_ARG_SRC, AS_DNNL_ARG_DST};
    const_dnnl_memory_desc_t mds[2] = {e->dst, e->dst_plain};
    void* ptrs[2] = {dst, (void*)y};
    ok = as_dnnl_run(e->from_conv, 2, args, mds, ptrs);
  }
  as_conv_release(s, e);
  return ok ? (fused ? 2 : 1) : 0;
}

// The site of a family's kernel for one convolution geometry (see as_site_for).
__attribute__((noipa)) AS_GLUE_ENTRY AsConvSite* as_conv_site(AsSiteTable* t, int64_t c, int64_t o,
                                                        int64_t kh, int64_t kw, int64_t sh,
                                                        int64_t sw, int64_t ph, int64_t pw,
                                                        int64_t dh, int64_t dw, int64_t nhwc,
                                                        int64_t post) {
  const int64_t geometry[12] = {c, o, kh, kw, sh, sw, ph, pw, dh, dw, nhwc, post};
  return as_site_for<AsConvSite>(t, geometry, 12);
}
#endif  // AS_DNNL_GLUE_OBJECT
