/* anyshape.h: load and run an anyshape artifact (a model saved by anyshape.export) from C or C++.
 *
 * Header-only, C99 (also compiles as C++), Linux on x86-64 and aarch64, needs only libc and
 * libdl. In exactly one .c/.cpp file, before any other #include (the implementation needs
 * _GNU_SOURCE):
 *
 *     #define ANYSHAPE_IMPLEMENTATION
 *     #include "anyshape.h"
 *
 * include it without the define everywhere else, and link with -ldl. Then:
 *
 *     char err[512];
 *     anyshape_model* m = anyshape_load("bert.anyshape", err, sizeof err);
 *     if (!m) { fprintf(stderr, "%s\n", err); return 3; }
 *     anyshape_tensor in[2] = ...;   // dense, C-contiguous, dtype codes ANYSHAPE_*
 *     anyshape_tensor out[2];
 *     int code = anyshape_run(m, in, 2, out, 2, err, sizeof err);  // 0 ok, 1 input, 2 run error
 *     ... use out[k].data, out[k].ndim, out[k].shape ..., then anyshape_release(m, out[k].data);
 *     anyshape_unload(m);
 *
 * anyshape_load checks the file in the order docs/standalone.md lists (size, magic, version,
 * header CRC, file size, section bounds, manifest + library CRC, weights word sum, ISA and CPU
 * flags): a corrupt, truncated or foreign file is NULL and a message, never a crash. The
 * compiled library is loaded from memory (a memfd), so nothing is left on disk; the weights
 * stay in the read-only mapping of the file, shared with every process that maps it.
 * anyshape_run may be called from many threads at once on one model. examples/run_artifact.c
 * is a complete program.
 */
#if defined(ANYSHAPE_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* memfd_create, mkstemp: must precede every system header */
#endif

#ifndef ANYSHAPE_H
#define ANYSHAPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ANYSHAPE_MAX_RANK 8

/* Element types, as coded in anyshape_tensor.dtype (the manifest spells them b8 ... f64). */
enum {
  ANYSHAPE_B8 = 0,
  ANYSHAPE_I8,
  ANYSHAPE_U8,
  ANYSHAPE_I16,
  ANYSHAPE_I32,
  ANYSHAPE_I64,
  ANYSHAPE_F16,
  ANYSHAPE_BF16,
  ANYSHAPE_F32,
  ANYSHAPE_F64
};

/* A dense C-contiguous tensor; the same layout as the compiled library's AsTensor. */
typedef struct {
  void* data; /* may be NULL when the tensor has no elements */
  int64_t ndim;
  int64_t shape[ANYSHAPE_MAX_RANK];
  int64_t dtype; /* ANYSHAPE_* */
} anyshape_tensor;

typedef struct anyshape_model anyshape_model;

/* Open, check and load an artifact; NULL and a message in err on any failure. */
anyshape_model* anyshape_load(const char* path, char* err, size_t errlen);
/* Free a model; no anyshape_run on it may be in progress. */
void anyshape_unload(anyshape_model* m);

/* The signature, from the manifest. Out-of-range indices give -1 or NULL. */
int anyshape_num_inputs(const anyshape_model* m);
int anyshape_num_outputs(const anyshape_model* m);
const char* anyshape_input_name(const anyshape_model* m, int i);
int anyshape_input_dtype(const anyshape_model* m, int i);
int anyshape_input_rank(const anyshape_model* m, int i);
const char* anyshape_input_dim(const anyshape_model* m, int i, int d); /* "s0", "768", "s1+1" */
const char* anyshape_output_name(const anyshape_model* m, int i);
int anyshape_output_dtype(const anyshape_model* m, int i);
int anyshape_output_rank(const anyshape_model* m, int i);
const char* anyshape_output_dim(const anyshape_model* m, int i, int d);
const char* anyshape_isa(const anyshape_model* m); /* the target ISA, e.g. "x86-64-v3" */
int anyshape_num_constraints(const anyshape_model* m);
const char* anyshape_constraint(const anyshape_model* m, int i); /* informational text */

/* Run the model. Returns 0, or 1 for a bad input (count, dtype, rank, NULL data, or a
 * shape/constraint violation the model's prologue reports), or 2 for a run-time error; the
 * message names the input and dim. On success each outputs[k] holds data the caller owns
 * (free it with anyshape_release), ndim, shape and dtype; on failure outputs hold nothing
 * to free. Thread-safe: many threads may run one model at once. */
int anyshape_run(const anyshape_model* m, const anyshape_tensor* inputs, int num_inputs,
                 anyshape_tensor* outputs, int num_outputs, char* err, size_t errlen);
/* Free an output buffer returned by anyshape_run (NULL is ignored). */
void anyshape_release(const anyshape_model* m, void* data);

size_t anyshape_dtype_size(int dtype);      /* bytes per element; 0 for an unknown code */
const char* anyshape_dtype_name(int dtype); /* "f32" ...; "unknown" for an unknown code */

#ifdef __cplusplus
}
#endif
#endif /* ANYSHAPE_H */

/* ------------------------------------------------------------------------------------------ */

#if defined(ANYSHAPE_IMPLEMENTATION) && !defined(ANYSHAPE_IMPLEMENTED)
#define ANYSHAPE_IMPLEMENTED

#if !defined(__linux__) || !(defined(__x86_64__) || defined(__aarch64__)) || \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "anyshape.h runs artifacts on little-endian Linux, x86-64 or aarch64"
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__GLIBC__) && !defined(__USE_GNU)
#error "define ANYSHAPE_IMPLEMENTATION and include anyshape.h before any other header in that file"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ANYSHAPE__HEADER_SIZE 256
#define ANYSHAPE__FORMAT_VERSION 1

#if defined(__x86_64__)
#define ANYSHAPE__ARCH "x86_64"
#define ANYSHAPE__CPU_FLAGS_KEY "flags"
#else
#define ANYSHAPE__ARCH "aarch64"
#define ANYSHAPE__CPU_FLAGS_KEY "Features"
#endif

typedef void (*anyshape__init_fn)(int);
typedef int (*anyshape__main_fn)(const anyshape_tensor*, const anyshape_tensor*, anyshape_tensor*,
                                 const int64_t*, char*, int64_t);
typedef void (*anyshape__free_fn)(void*);

enum { ANYSHAPE__SLOT, ANYSHAPE__INPUT, ANYSHAPE__PARAM };

/* An input, output or param record of the manifest; strings point into the model's text. */
typedef struct {
  const char* name;
  int dtype, rank;
  const char* dims[ANYSHAPE_MAX_RANK];
  int source, index; /* outputs: where the data comes from (slot K, input I, param P) */
  int owns_slot;     /* outputs: the first output of a slot takes main's buffer, later ones copy */
  uint64_t offset, nbytes; /* params: place in the weights section */
  int64_t shape[ANYSHAPE_MAX_RANK]; /* params: the dims as numbers */
} anyshape__record;

struct anyshape_model {
  unsigned char* map; /* the whole file, read-only */
  size_t size;
  char isa[33];       /* from the header */
  char* text; /* the manifest, split in place into the strings below */
  const char* manifest_isa;
  anyshape__record *inputs, *outputs, *params;
  int num_inputs, num_outputs, num_params;
  const char** cpu_flags;
  int num_cpu_flags;
  const char** constraints;
  int num_constraints;
  int threads;
  int num_slots;    /* entries of main's out array: the largest slot + 1 */
  int* slot_owner;  /* per slot: the output that hands main's buffer out, or -1 (freed) */
  anyshape_tensor* prm; /* the weights, pointing into map */
  void* lib;
  anyshape__main_fn main_fn;
  anyshape__free_fn free_fn;
};

static const char* const anyshape__dtype_names[] = {"b8",  "i8",   "u8",  "i16", "i32",
                                                    "i64", "f16", "bf16", "f32", "f64"};
static const unsigned char anyshape__dtype_sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};

size_t anyshape_dtype_size(int dtype) {
  return dtype >= 0 && dtype <= ANYSHAPE_F64 ? anyshape__dtype_sizes[dtype] : 0;
}

const char* anyshape_dtype_name(int dtype) {
  return dtype >= 0 && dtype <= ANYSHAPE_F64 ? anyshape__dtype_names[dtype] : "unknown";
}

/* Writes the message (if there is room for one) and returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int anyshape__fail(int code, char* err, size_t errlen, const char* fmt, ...) {
  va_list ap;
  if (err && errlen) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* zlib's CRC-32, chained like zlib.crc32(data, crc). The table is rebuilt per call (2k steps,
 * nothing next to hashing megabytes) so there is no shared state to initialize. */
static uint32_t anyshape__crc32(uint32_t crc, const unsigned char* p, size_t n) {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  crc = ~crc;
  while (n--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

/* The weights checksum: the sum of little-endian u64 words mod 2^64, a final partial word
 * zero-padded. memcpy because the section need not be 8-byte aligned in a foreign file. */
static uint64_t anyshape__word_sum(const unsigned char* p, uint64_t n) {
  uint64_t sum = 0, w, k;
  for (k = 0; k + 8 <= n; k += 8) {
    memcpy(&w, p + k, 8);
    sum += w;
  }
  if (k < n) {
    w = 0;
    memcpy(&w, p + k, (size_t)(n - k));
    sum += w;
  }
  return sum;
}

static uint64_t anyshape__u64(const unsigned char* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static uint32_t anyshape__u32(const unsigned char* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* The header checks, in the order of docs/standalone.md (the file is >= 256 bytes). */
static int anyshape__check_file(anyshape_model* m, const char* path, char* err, size_t errlen) {
  const unsigned char* h = m->map;
  const uint64_t size = m->size;
  uint64_t m_off = anyshape__u64(h + 48), m_len = anyshape__u64(h + 56);
  uint64_t l_off = anyshape__u64(h + 64), l_len = anyshape__u64(h + 72);
  uint64_t w_off = anyshape__u64(h + 80), w_len = anyshape__u64(h + 88);
  uint64_t file_size = anyshape__u64(h + 96);
  uint32_t version = anyshape__u32(h + 8);
  if (memcmp(h, "ANYSHAPE", 8) != 0) {
    char magic[8 * 4 + 1], *q = magic;
    for (int k = 0; k < 8; ++k)
      if (h[k] >= 32 && h[k] < 127 && h[k] != '\\' && h[k] != '\'')
        q += sprintf(q, "%c", h[k]);
      else
        q += sprintf(q, "\\x%02x", h[k]);
    return anyshape__fail(0, err, errlen, "%s is not an anyshape artifact (magic '%s')", path,
                          magic);
  }
  if (version != ANYSHAPE__FORMAT_VERSION)
    return anyshape__fail(0, err, errlen,
                          "artifact %s has format version %u; this runtime reads version %d "
                          "(export the model again with a matching anyshape)",
                          path, (unsigned)version, ANYSHAPE__FORMAT_VERSION);
  if (anyshape__u32(h + 12) != ANYSHAPE__HEADER_SIZE ||
      anyshape__u64(h + 120) != anyshape__crc32(0, h, 120))
    return anyshape__fail(0, err, errlen, "artifact %s is corrupt: header checksum mismatch", path);
  if (file_size != size)
    return anyshape__fail(0, err, errlen, "artifact %s is %s: %llu bytes, the header says %llu",
                          path, size < file_size ? "truncated" : "longer than recorded",
                          (unsigned long long)size, (unsigned long long)file_size);
  if (m_off > size || m_len > size - m_off)
    return anyshape__fail(0, err, errlen, "artifact %s is corrupt: the manifest runs past the end",
                          path);
  if (l_off > size || l_len > size - l_off)
    return anyshape__fail(0, err, errlen, "artifact %s is corrupt: the library runs past the end",
                          path);
  if (w_off > size || w_len != size - w_off)
    return anyshape__fail(0, err, errlen,
                          "artifact %s is corrupt: the weights section does not end the file",
                          path);
  if (anyshape__crc32(anyshape__crc32(0, h + m_off, m_len), h + l_off, l_len) !=
      anyshape__u64(h + 104))
    return anyshape__fail(0, err, errlen,
                          "artifact %s is corrupt: manifest/library checksum mismatch", path);
  if (anyshape__word_sum(h + w_off, w_len) != anyshape__u64(h + 112))
    return anyshape__fail(0, err, errlen, "artifact %s is corrupt: weights checksum mismatch",
                          path);
  memcpy(m->isa, h + 16, 32); /* NUL-padded; isa[32] stays 0 from calloc */
  return 1;
}

/* A non-negative decimal integer with nothing after it. */
static int anyshape__parse_uint(const char* s, uint64_t limit, uint64_t* out) {
  uint64_t v = 0;
  if (!*s) return 0;
  for (; *s; ++s) {
    uint64_t digit = (uint64_t)(*s - '0');
    if (*s < '0' || *s > '9' || digit > limit || v > (limit - digit) / 10) return 0;
    v = v * 10 + digit;
  }
  *out = v;
  return 1;
}

static int anyshape__parse_dtype(const char* s) {
  for (int k = 0; k <= ANYSHAPE_F64; ++k)
    if (strcmp(s, anyshape__dtype_names[k]) == 0) return k;
  return -1;
}

/* Splits s in place at runs of spaces (the writer puts two around an empty dim list); returns
 * the word count, storing at most max words. */
static int anyshape__split(char* s, char** words, int max) {
  int n = 0;
  for (;;) {
    while (*s == ' ') *s++ = 0;
    if (!*s) return n;
    if (n < max) words[n] = s;
    ++n;
    while (*s && *s != ' ') ++s;
  }
}

/* One input/output/param line: words[0] is the key, then name dtype rank dims..., then
 * `extra` more words (an output's source; a param's offset and nbytes). 0 and why if malformed. */
static int anyshape__parse_record(anyshape__record* r, char** words, int n, int extra,
                                  uint64_t w_len, char* why, size_t whylen) {
  uint64_t rank, v, numel = 1;
  if (n < 4) return anyshape__fail(0, why, whylen, "too few fields");
  r->name = words[1];
  r->dtype = anyshape__parse_dtype(words[2]);
  if (r->dtype < 0) return anyshape__fail(0, why, whylen, "unknown dtype '%s'", words[2]);
  if (!anyshape__parse_uint(words[3], ANYSHAPE_MAX_RANK, &rank))
    return anyshape__fail(0, why, whylen, "rank '%s' is not in 0..%d", words[3],
                          ANYSHAPE_MAX_RANK);
  r->rank = (int)rank;
  if (n != 4 + r->rank + extra)
    return anyshape__fail(0, why, whylen, "%d fields, a rank-%d %s has %d", n, r->rank, words[0],
                          4 + r->rank + extra);
  for (int d = 0; d < r->rank; ++d) r->dims[d] = words[4 + d];
  if (extra == 1) {
    const char* s = words[4 + r->rank];
    const char* num = NULL;
    if (strncmp(s, "slot:", 5) == 0) r->source = ANYSHAPE__SLOT, num = s + 5;
    if (strncmp(s, "input:", 6) == 0) r->source = ANYSHAPE__INPUT, num = s + 6;
    if (strncmp(s, "param:", 6) == 0) r->source = ANYSHAPE__PARAM, num = s + 6;
    if (!num || !anyshape__parse_uint(num, INT32_MAX, &v))
      return anyshape__fail(0, why, whylen, "source '%s' is not slot:K, input:I or param:P", s);
    r->index = (int)v;
  }
  if (extra == 2) {
    /* A weight's dims are numbers, and its bytes lie inside the weights section. */
    for (int d = 0; d < r->rank; ++d) {
      if (!anyshape__parse_uint(r->dims[d], (uint64_t)INT64_MAX, &v))
        return anyshape__fail(0, why, whylen, "weight dim '%s' is not a number", r->dims[d]);
      r->shape[d] = (int64_t)v;
      numel = v && numel > UINT64_MAX / v ? UINT64_MAX : numel * v;
    }
    if (!anyshape__parse_uint(words[4 + r->rank], UINT64_MAX, &r->offset) ||
        !anyshape__parse_uint(words[5 + r->rank], UINT64_MAX, &r->nbytes))
      return anyshape__fail(0, why, whylen, "offset and nbytes must be numbers");
    if (numel > UINT64_MAX / 8 || r->nbytes != numel * anyshape__dtype_sizes[r->dtype])
      return anyshape__fail(0, why, whylen, "%llu bytes do not match the shape",
                            (unsigned long long)r->nbytes);
    if (r->offset > w_len || r->nbytes > w_len - r->offset)
      return anyshape__fail(0, why, whylen, "bytes %llu..%llu are outside the %llu-byte weights",
                            (unsigned long long)r->offset,
                            (unsigned long long)(r->offset + r->nbytes),
                            (unsigned long long)w_len);
  }
  return 1;
}

/* Parses the manifest into m; a malformed line is an error quoting it. */
static int anyshape__parse_manifest(anyshape_model* m, const char* path, char* err,
                                    size_t errlen) {
  const unsigned char* h = m->map;
  const char* src = (const char*)h + anyshape__u64(h + 48);
  const size_t len = (size_t)anyshape__u64(h + 56);
  const uint64_t w_len = anyshape__u64(h + 88);
  size_t lines = 1, start = 0;
  int number = 0;
  for (size_t k = 0; k < len; ++k) lines += src[k] == '\n';
  m->text = (char*)malloc(len + 1);
  m->inputs = (anyshape__record*)calloc(3 * lines, sizeof(anyshape__record));
  m->constraints = (const char**)calloc(lines, sizeof(char*));
  if (!m->text || !m->inputs || !m->constraints)
    return anyshape__fail(0, err, errlen, "out of memory reading artifact %s", path);
  m->outputs = m->inputs + lines; /* one block: at most `lines` records of each kind */
  m->params = m->inputs + 2 * lines;
  memcpy(m->text, src, len);
  m->text[len] = 0;
  for (; start <= len; ++number) {
    size_t end = start;
    char* line = m->text + start;
    char* words[4 + ANYSHAPE_MAX_RANK + 2];
    char why[160];
    int n, ok = 1;
    while (end < len && src[end] != '\n') ++end;
    m->text[end] = 0;
    if (strncmp(line, "constraint", 10) == 0 && (line[10] == ' ' || line[10] == 0)) {
      m->constraints[m->num_constraints++] = line + 10 + !!line[10]; /* free text: not split */
      start = end + 1;
      continue;
    }
    n = anyshape__split(line, words, (int)(sizeof words / sizeof *words));
    if (n == 0 || strcmp(words[0], "anyshape") == 0) {
      /* an empty line, or the writer's version: nothing to check */
    } else if (strcmp(words[0], "isa") == 0) {
      if (n != 2) ok = anyshape__fail(0, why, sizeof why, "expected one ISA name");
      m->manifest_isa = words[1];
    } else if (strcmp(words[0], "cpu_flags") == 0) {
      /* words holds the first few only: collect the words of the (already split) line again */
      free((void*)m->cpu_flags);
      m->cpu_flags = (const char**)calloc((size_t)n, sizeof(char*));
      if (!m->cpu_flags) return anyshape__fail(0, err, errlen, "out of memory reading %s", path);
      m->num_cpu_flags = 0;
      for (char* s = words[0] + strlen(words[0]); s < m->text + end; ++s)
        if (*s && s[-1] == 0) m->cpu_flags[m->num_cpu_flags++] = s;
    } else if (strcmp(words[0], "threads") == 0) {
      uint64_t t;
      if (n != 2 || !anyshape__parse_uint(words[1], INT32_MAX, &t))
        ok = anyshape__fail(0, why, sizeof why, "expected a thread count");
      else
        m->threads = (int)t;
    } else if (strcmp(words[0], "input") == 0) {
      ok = anyshape__parse_record(&m->inputs[m->num_inputs++], words, n, 0, w_len, why,
                                  sizeof why);
    } else if (strcmp(words[0], "output") == 0) {
      ok = anyshape__parse_record(&m->outputs[m->num_outputs++], words, n, 1, w_len, why,
                                  sizeof why);
    } else if (strcmp(words[0], "param") == 0) {
      ok = anyshape__parse_record(&m->params[m->num_params++], words, n, 2, w_len, why,
                                  sizeof why);
    } else {
      ok = anyshape__fail(0, why, sizeof why, "unknown record '%.40s'", words[0]);
    }
    if (!ok)
      return anyshape__fail(0, err, errlen, "artifact %s: corrupt manifest, line %d: '%.*s' (%s)",
                            path, number + 1, (int)(end - start > 200 ? 200 : end - start),
                            src + start, why);
    start = end + 1;
  }
  return 1;
}

/* Checks that every output's source exists and matches it, and sizes main's out array. */
static int anyshape__link_outputs(anyshape_model* m, const char* path, char* err, size_t errlen) {
  for (int k = 0; k < m->num_outputs; ++k) {
    anyshape__record* r = &m->outputs[k];
    const anyshape__record* from = NULL;
    if (r->source == ANYSHAPE__SLOT) {
      /* each slot is a distinct output, which also bounds main's out array */
      if (r->index >= m->num_outputs)
        return anyshape__fail(0, err, errlen,
                              "artifact %s: corrupt manifest: output '%s' takes slot %d of a "
                              "model with %d outputs",
                              path, r->name, r->index, m->num_outputs);
      if (r->index + 1 > m->num_slots) m->num_slots = r->index + 1;
      continue;
    }
    if (r->source == ANYSHAPE__INPUT && r->index < m->num_inputs) from = &m->inputs[r->index];
    if (r->source == ANYSHAPE__PARAM && r->index < m->num_params) from = &m->params[r->index];
    if (!from || from->dtype != r->dtype || from->rank != r->rank)
      return anyshape__fail(0, err, errlen,
                            "artifact %s: corrupt manifest: output '%s' copies %s %d, which is "
                            "missing or has another dtype or rank",
                            path, r->name, r->source == ANYSHAPE__INPUT ? "input" : "param",
                            r->index);
  }
  m->slot_owner = (int*)malloc(sizeof(int) * (size_t)(m->num_slots ? m->num_slots : 1));
  if (!m->slot_owner) return anyshape__fail(0, err, errlen, "out of memory loading %s", path);
  for (int s = 0; s < m->num_slots; ++s) m->slot_owner[s] = -1;
  for (int k = 0; k < m->num_outputs; ++k) {
    anyshape__record* r = &m->outputs[k];
    if (r->source == ANYSHAPE__SLOT && m->slot_owner[r->index] < 0) {
      m->slot_owner[r->index] = k;
      r->owns_slot = 1;
    }
  }
  return 1;
}

/* The whole of a small file such as /proc/cpuinfo (whose size stat does not know). */
static char* anyshape__read_text(const char* path) {
  size_t n = 0, cap = 1 << 16;
  char* buf = (char*)malloc(cap + 1);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t got;
  if (fd < 0 || !buf) {
    if (fd >= 0) close(fd);
    free(buf);
    return NULL;
  }
  while ((got = read(fd, buf + n, cap - n)) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    n += (size_t)got;
    if (n == cap) {
      char* bigger = (char*)realloc(buf, 2 * cap + 1);
      if (!bigger) break;
      buf = bigger;
      cap *= 2;
    }
  }
  close(fd);
  buf[n] = 0;
  return buf;
}

static int anyshape__has_word(const char* list, const char* word) {
  size_t n = strlen(word);
  for (const char* p = list; (p = strstr(p, word)) != NULL; p += n)
    if ((p == list || p[-1] == ' ' || p[-1] == '\t') && (p[n] == 0 || p[n] == ' ' || p[n] == '\t'))
      return 1;
  return 0;
}

/* The header and manifest name one ISA, its architecture is this machine's, and the CPU has
 * every flag the manifest lists. */
static int anyshape__check_isa(const anyshape_model* m, const char* path, char* err,
                               size_t errlen) {
  const char* isa = strncmp(m->isa, "native-", 7) == 0 ? m->isa + 7 : m->isa;
  const char* arch = strncmp(isa, "x86-64", 6) == 0 ? "x86_64"
                     : strncmp(isa, "aarch64", 7) == 0 || strncmp(isa, "armv8", 5) == 0
                         ? "aarch64"
                         : NULL;
  char *info, *flags = NULL, missing[256] = "";
  if (!m->manifest_isa || strcmp(m->isa, m->manifest_isa) != 0)
    return anyshape__fail(0, err, errlen,
                          "artifact %s is corrupt: header ISA '%s' vs manifest '%s'", path, m->isa,
                          m->manifest_isa ? m->manifest_isa : "");
  if (!arch)
    return anyshape__fail(0, err, errlen,
                          "artifact %s was built for ISA '%s', unknown to this runtime", path,
                          m->isa);
  if (strcmp(arch, ANYSHAPE__ARCH) != 0)
    return anyshape__fail(0, err, errlen,
                          "artifact %s was built for ISA %s (%s); this machine is %s", path,
                          m->isa, arch, ANYSHAPE__ARCH);
  if (m->num_cpu_flags == 0) return 1;
  info = anyshape__read_text("/proc/cpuinfo");
  /* the first "flags : ..." (x86) or "Features : ..." (arm) line; every core lists the same */
  for (char *line = info, *next; line && !flags; line = next) {
    const size_t n = strlen(ANYSHAPE__CPU_FLAGS_KEY);
    char* p = line + n;
    if ((next = strchr(line, '\n')) != NULL) *next++ = 0;
    if (strncmp(line, ANYSHAPE__CPU_FLAGS_KEY, n) != 0) continue;
    while (*p == ' ' || *p == '\t') ++p;
    if (*p == ':') flags = p + 1;
  }
  if (!flags) {
    free(info);
    return anyshape__fail(0, err, errlen,
                          "cannot check the CPU flags artifact %s needs: no '%s' line in "
                          "/proc/cpuinfo",
                          path, ANYSHAPE__CPU_FLAGS_KEY);
  }
  for (int k = 0; k < m->num_cpu_flags; ++k)
    if (!anyshape__has_word(flags, m->cpu_flags[k]) &&
        strlen(missing) + strlen(m->cpu_flags[k]) + 2 < sizeof missing)
      strcat(strcat(missing, *missing ? " " : ""), m->cpu_flags[k]);
  free(info);
  if (*missing)
    return anyshape__fail(0, err, errlen,
                          "artifact %s was built for ISA %s, which needs CPU flags %s that this "
                          "CPU lacks (export with the default portable target)",
                          path, m->isa, missing);
  return 1;
}

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

const char* anyshape_input_name(const anyshape_model* m, int i) {
  const anyshape__record* r = anyshape__in(m, i);
  return r ? r->name : NULL;
}
int anyshape_input_dtype(const anyshape_model* m, int i) {
  const anyshape__record* r = anyshape__in(m, i);
  return r ? r->dtype : -1;
}
int anyshape_input_rank(const anyshape_model* m, int i) {
  const anyshape__record* r = anyshape__in(m, i);
  return r ? r->rank : -1;
}
const char* anyshape_input_dim(const anyshape_model* m, int i, int d) {
  return anyshape__dim(anyshape__in(m, i), d);
}
const char* anyshape_output_name(const anyshape_model* m, int i) {
  const anyshape__record* r = anyshape__out(m, i);
  return r ? r->name : NULL;
}
int anyshape_output_dtype(const anyshape_model* m, int i) {
  const anyshape__record* r = anyshape__out(m, i);
  return r ? r->dtype : -1;
}
int anyshape_output_rank(const anyshape_model* m, int i) {
  const anyshape__record* r = anyshape__out(m, i);
  return r ? r->rank : -1;
}
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
  if (t->dtype != r->dtype && t->dtype >= 0 && t->dtype <= ANYSHAPE_F64)
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
    outputs[k].data = malloc(bytes ? bytes : 1); /* anyshape_free is free() */
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
    if (!m->outputs[j].owns_slot) free(outputs[j].data);
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
#endif /* ANYSHAPE_IMPLEMENTATION */
