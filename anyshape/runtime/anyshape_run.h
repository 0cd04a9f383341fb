/* anyshape_run.h: the C API's implementation, part 2 of 2 (included by anyshape.h after
 * anyshape_file.h): loading the compiled library from memory, anyshape_load/unload, the
 * signature accessors, and anyshape_run.
 */

#ifdef __cplusplus
extern "C" {
#endif

static int anyshape__write_all(int fd, const unsigned char* p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return 0;
    p += k;
    n -= (size_t)k;
  }
  return 1;
}

/* dlopen a library held in memory: from a memfd, else from a temporary file unlinked at once.
 * The library is never unloaded (RTLD_NODELETE): OpenMP may keep worker threads parked in its
 * runtime, and thread_local destructors pin it anyway. So its memfd stays open too: the
 * dynamic loader knows a library by its path, and a closed fd's number, reused for the next
 * model's memfd, would make dlopen("/proc/self/fd/N") hand back this library. */
static void* anyshape__open_library(const unsigned char* p, size_t n, char* why, size_t whylen) {
  const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
  char name[4096];
  const char* dir = getenv("TMPDIR");
  void* lib = NULL;
  int fd;
#if defined(MFD_CLOEXEC) && !defined(ANYSHAPE_NO_MEMFD)
  fd = memfd_create("anyshape-model", MFD_CLOEXEC);
  if (fd >= 0) {
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    if (anyshape__write_all(fd, p, n)) lib = dlopen(name, flags);
    if (lib) return lib; /* fd deliberately left open, see above */
    close(fd);
  }
#endif
  /* no memfd (old kernel, seccomp) or no exec from it (vm.memfd_noexec): a file instead */
  snprintf(name, sizeof name, "%s/anyshape-XXXXXX", dir && *dir ? dir : "/tmp");
  fd = mkstemp(name);
  if (fd < 0) {
    snprintf(why, whylen, "cannot create %.300s: %s", name, strerror(errno));
    return NULL;
  }
  if (anyshape__write_all(fd, p, n)) {
    lib = dlopen(name, flags);
    if (!lib) snprintf(why, whylen, "%s", dlerror());
  } else {
    snprintf(why, whylen, "cannot write %.300s: %s", name, strerror(errno));
  }
  close(fd);
  unlink(name);
  return lib;
}

/* Loads the library, calls its anyshape_init once, and describes the weights for main. */
static int anyshape__load_library(anyshape_model* m, const char* path, char* err, size_t errlen) {
  static int init_lock; /* anyshape_init sets process-wide OpenMP/BLAS state: one at a time */
  const unsigned char* h = m->map;
  const char* names[3] = {"anyshape_init", "anyshape_main", "anyshape_free"};
  void* syms[3];
  anyshape__init_fn init;
  char why[512] = "";
  m->lib = anyshape__open_library(h + anyshape__u64(h + 64), (size_t)anyshape__u64(h + 72), why,
                                  sizeof why);
  if (!m->lib)
    return anyshape__fail(0, err, errlen, "cannot load the library of artifact %s: %s", path, why);
  for (int k = 0; k < 3; ++k)
    if ((syms[k] = dlsym(m->lib, names[k])) == NULL)
      return anyshape__fail(0, err, errlen, "the library of artifact %s does not export %s", path,
                            names[k]);
  /* memcpy: ISO C has no cast from an object pointer to a function pointer */
  memcpy(&init, &syms[0], sizeof init);
  memcpy(&m->main_fn, &syms[1], sizeof m->main_fn);
  memcpy(&m->free_fn, &syms[2], sizeof m->free_fn);
  {
    /* Libraries that keep freed output blocks export their allocator: copies of outputs
     * come from it, so anyshape_free takes them back. Older ones free with free(). */
    void* alloc = dlsym(m->lib, "anyshape_alloc");
    m->alloc_fn = NULL;
    if (alloc) memcpy(&m->alloc_fn, &alloc, sizeof m->alloc_fn);
  }
  m->prm = (anyshape_tensor*)calloc((size_t)(m->num_params ? m->num_params : 1),
                                    sizeof(anyshape_tensor));
  if (!m->prm) return anyshape__fail(0, err, errlen, "out of memory loading %s", path);
  for (int k = 0; k < m->num_params; ++k) {
    const anyshape__record* r = &m->params[k];
    m->prm[k].data = r->nbytes ? m->map + anyshape__u64(h + 80) + r->offset : NULL;
    m->prm[k].ndim = r->rank;
    memcpy(m->prm[k].shape, r->shape, sizeof r->shape);
    m->prm[k].dtype = r->dtype;
  }
  while (__atomic_exchange_n(&init_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
  init(m->threads);
  __atomic_store_n(&init_lock, 0, __ATOMIC_RELEASE);
  return 1;
}

anyshape_model* anyshape_load(const char* path, char* err, size_t errlen) {
  struct stat st;
  anyshape_model* m;
  void* map;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    anyshape__fail(0, err, errlen, "cannot open artifact %s: %s", path, strerror(errno));
    return NULL;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    anyshape__fail(0, err, errlen, "cannot open artifact %s: not a regular file", path);
    close(fd);
    return NULL;
  }
  if (st.st_size < ANYSHAPE__HEADER_SIZE) {
    anyshape__fail(0, err, errlen,
                   "%s is not an anyshape artifact: %lld bytes, shorter than the %d-byte header "
                   "(truncated?)",
                   path, (long long)st.st_size, ANYSHAPE__HEADER_SIZE);
    close(fd);
    return NULL;
  }
  map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    anyshape__fail(0, err, errlen, "cannot map artifact %s: %s", path, strerror(errno));
    return NULL;
  }
  m = (anyshape_model*)calloc(1, sizeof *m);
  if (!m) {
    munmap(map, (size_t)st.st_size);
    anyshape__fail(0, err, errlen, "out of memory loading %s", path);
    return NULL;
  }
  m->map = (unsigned char*)map;
  m->size = (size_t)st.st_size;
  if (!anyshape__check_file(m, path, err, errlen) ||
      !anyshape__parse_manifest(m, path, err, errlen) ||
      !anyshape__link_outputs(m, path, err, errlen) || !anyshape__check_isa(m, path, err, errlen) ||
      !anyshape__load_library(m, path, err, errlen)) {
    anyshape_unload(m);
    return NULL;
  }
  return m;
}

void anyshape_unload(anyshape_model* m) {
  if (!m) return;
  if (m->lib) dlclose(m->lib); /* the code stays loaded: see anyshape__open_library */
  if (m->map) munmap(m->map, m->size);
  free(m->text);
  free(m->inputs); /* outputs and params share its block */
  free((void*)m->cpu_flags);
  free((void*)m->constraints);
  free(m->slot_owner);
  free(m->prm);
  free(m);
}

int anyshape_num_inputs(const anyshape_model* m) { return m ? m->num_inputs : -1; }
int anyshape_num_outputs(const anyshape_model* m) { return m ? m->num_outputs : -1; }

static const anyshape__record* anyshape__in(const anyshape_model* m, int i) {
  return m && i >= 0 && i < m->num_inputs ? &m->inputs[i] : NULL;
}
static const anyshape__record* anyshape__out(const anyshape_model* m, int i) {
  return m && i >= 0 && i < m->num_outputs ? &m->outputs[i] : NULL;
}
static const char* anyshape__dim(const anyshape__record* r, int d) {
  return r && d >= 0 && d < r->rank ? r->dims[d] : NULL;
}

static const char* anyshape__name(const anyshape__record* r) { return r ? r->name : NULL; }
static int anyshape__dtype(const anyshape__record* r) { return r ? r->dtype : -1; }
static int anyshape__rank(const anyshape__record* r) { return r ? r->rank : -1; }

const char* anyshape_input_name(const anyshape_model* m, int i) { return anyshape__name(anyshape__in(m, i)); }
int anyshape_input_dtype(const anyshape_model* m, int i) { return anyshape__dtype(anyshape__in(m, i)); }
int anyshape_input_rank(const anyshape_model* m, int i) { return anyshape__rank(anyshape__in(m, i)); }
const char* anyshape_input_dim(const anyshape_model* m, int i, int d) {
  return anyshape__dim(anyshape__in(m, i), d);
}
const char* anyshape_output_name(const anyshape_model* m, int i) { return anyshape__name(anyshape__out(m, i)); }
int anyshape_output_dtype(const anyshape_model* m, int i) { return anyshape__dtype(anyshape__out(m, i)); }
int anyshape_output_rank(const anyshape_model* m, int i) { return anyshape__rank(anyshape__out(m, i)); }
const char* anyshape_output_dim(const anyshape_model* m, int i, int d) {
  return anyshape__dim(anyshape__out(m, i), d);
}
const char* anyshape_isa(const anyshape_model* m) { return m ? m->isa : NULL; }
int anyshape_num_constraints(const anyshape_model* m) { return m ? m->num_constraints : -1; }
const char* anyshape_constraint(const anyshape_model* m, int i) {
  return m && i >= 0 && i < m->num_constraints ? m->constraints[i] : NULL;
}

/* "f32[s0, 768]": the manifest's description of an input, for messages. */
static const char* anyshape__describe(const anyshape__record* r, char* buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "%s[", anyshape__dtype_names[r->dtype]);
  for (int d = 0; d < r->rank && k < n; ++d)
    k += (size_t)snprintf(buf + k, n - k, "%s%s", d ? ", " : "", r->dims[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* Elements of a tensor whose ndim and dims were checked (or came from the library). */
static size_t anyshape__numel(const anyshape_tensor* t) {
  size_t n = 1;
  for (int d = 0; d < (int)t->ndim; ++d) n *= (size_t)t->shape[d];
  return n;
}

/* 0, or 1 with a message naming the input: the dtype, rank, dims and data main relies on. */
static int anyshape__check_input(const anyshape__record* r, const anyshape_tensor* t, char* err,
                                 size_t errlen) {
  char want[160];
  uint64_t numel = 1;
  if (t->dtype != r->dtype && t->dtype >= 0 && t->dtype <= ANYSHAPE_U64)
    return anyshape__fail(1, err, errlen, "input '%s' has dtype %s, expected %s", r->name,
                          anyshape__dtype_names[t->dtype], anyshape__dtype_names[r->dtype]);
  if (t->dtype != r->dtype)
    return anyshape__fail(1, err, errlen, "input '%s' has dtype code %lld, expected %s (code %d)",
                          r->name, (long long)t->dtype, anyshape__dtype_names[r->dtype], r->dtype);
  if (t->ndim != r->rank)
    return anyshape__fail(1, err, errlen, "input '%s' has rank %lld, expected rank %d (%s)",
                          r->name, (long long)t->ndim, r->rank,
                          anyshape__describe(r, want, sizeof want));
  for (int d = 0; d < r->rank; ++d) {
    uint64_t n = (uint64_t)t->shape[d];
    if (t->shape[d] < 0)
      return anyshape__fail(1, err, errlen, "input '%s' dim %d is negative (%lld)", r->name, d,
                            (long long)t->shape[d]);
    numel = n && numel > (uint64_t)INT64_MAX / n ? (uint64_t)INT64_MAX : numel * n;
  }
  if (numel > (uint64_t)INT64_MAX / 8)
    return anyshape__fail(1, err, errlen, "input '%s' is too large", r->name);
  if (numel && !t->data)
    return anyshape__fail(1, err, errlen, "input '%s' has NULL data but %llu elements", r->name,
                          (unsigned long long)numel);
  return 0;
}

/* Hands main's buffers out (each slot to its first output) and copies inputs, weights and
 * repeated slots, so every output has one owner. On failure frees everything, returns 2. */
static int anyshape__fill_outputs(const anyshape_model* m, const anyshape_tensor* inputs,
                                  const anyshape_tensor* slots, anyshape_tensor* outputs,
                                  char* err, size_t errlen) {
  int k, code = 0;
  for (k = 0; k < m->num_outputs && !code; ++k) {
    const anyshape__record* r = &m->outputs[k];
    const anyshape_tensor* from = r->source == ANYSHAPE__SLOT    ? &slots[r->index]
                                  : r->source == ANYSHAPE__INPUT ? &inputs[r->index]
                                                                 : &m->prm[r->index];
    size_t bytes = 0;
    if (from->ndim != r->rank) {
      code = anyshape__fail(2, err, errlen,
                            "the model's library returned rank %lld for output '%s', its "
                            "manifest says %d",
                            (long long)from->ndim, r->name, r->rank);
      break;
    }
    outputs[k] = *from;
    outputs[k].dtype = r->dtype; /* the library leaves it unset */
    if (r->owns_slot) continue;
    bytes = anyshape__numel(from) * anyshape__dtype_sizes[r->dtype];
    outputs[k].data = m->alloc_fn ? m->alloc_fn((int64_t)bytes) : malloc(bytes ? bytes : 1);
    if (!outputs[k].data) {
      code = anyshape__fail(2, err, errlen, "out of memory copying output '%s' (%zu bytes)",
                            r->name, bytes);
      break;
    }
    if (bytes) memcpy(outputs[k].data, from->data, bytes);
  }
  /* success: free the slots no output holds; failure: free all slots and the copies made */
  for (int s = 0; s < m->num_slots; ++s)
    if ((code || m->slot_owner[s] < 0) && slots[s].data) m->free_fn(slots[s].data);
  for (int j = 0; code && j < k; ++j) {
    if (!m->outputs[j].owns_slot) m->alloc_fn ? m->free_fn(outputs[j].data) : free(outputs[j].data);
    outputs[j].data = NULL;
  }
  return code;
}

int anyshape_run(const anyshape_model* m, const anyshape_tensor* inputs, int num_inputs,
                 anyshape_tensor* outputs, int num_outputs, char* err, size_t errlen) {
  anyshape_tensor stack[16], *slots = stack;
  const int64_t extra[1] = {0}; /* exported models take every symbol from the input dims */
  char msg[1024] = "";
  int code;
  if (!m) return anyshape__fail(1, err, errlen, "no model (did anyshape_load fail?)");
  if (num_inputs != m->num_inputs)
    return anyshape__fail(1, err, errlen, "the model takes %d inputs, got %d", m->num_inputs,
                          num_inputs);
  if (num_outputs != m->num_outputs)
    return anyshape__fail(1, err, errlen, "the model has %d outputs, got room for %d",
                          m->num_outputs, num_outputs);
  if ((num_inputs && !inputs) || (num_outputs && !outputs))
    return anyshape__fail(1, err, errlen, "NULL inputs or outputs array");
  for (int i = 0; i < num_inputs; ++i)
    if (anyshape__check_input(&m->inputs[i], &inputs[i], err, errlen)) return 1;
  if (m->num_slots > (int)(sizeof stack / sizeof *stack)) {
    slots = (anyshape_tensor*)malloc(sizeof(anyshape_tensor) * (size_t)m->num_slots);
    if (!slots) return anyshape__fail(2, err, errlen, "out of memory");
  }
  memset(slots, 0, sizeof(anyshape_tensor) * (size_t)m->num_slots);
  code = m->main_fn(inputs, m->prm, slots, extra, msg, (int64_t)sizeof msg);
  if (code == 0) {
    code = anyshape__fill_outputs(m, inputs, slots, outputs, err, errlen);
  } else {
    /* main has freed its buffers; 1 is an input error, anything else a run-time error */
    if (!*msg) snprintf(msg, sizeof msg, "the model's library failed (code %d)", code);
    code = anyshape__fail(code == 1 ? 1 : 2, err, errlen, "%s", msg);
  }
  if (slots != stack) free(slots);
  return code;
}

void anyshape_release(const anyshape_model* m, void* data) {
  if (m && data) m->free_fn(data);
}

#ifdef __cplusplus
}
#endif
