/* anyshape_file.h: the C API's implementation, part 1 of 2 (included by anyshape.h under
 * ANYSHAPE_IMPLEMENTATION): the model record, checking an artifact file in the order
 * docs/standalone.md lists, parsing its manifest, and checking the ISA against this CPU.
 */

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
typedef void* (*anyshape__alloc_fn)(int64_t);

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
  anyshape__alloc_fn alloc_fn; /* the library's output allocator; NULL: its free is free() */
};

static const char* const anyshape__dtype_names[] = {"b8",  "i8",  "u8",  "i16", "i32",
                                                    "i64", "f16", "bf16", "f32", "f64",
                                                    "u16", "u32", "u64"};
static const unsigned char anyshape__dtype_sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 2, 4, 8};

size_t anyshape_dtype_size(int dtype) {
  return dtype >= 0 && dtype <= ANYSHAPE_U64 ? anyshape__dtype_sizes[dtype] : 0;
}

const char* anyshape_dtype_name(int dtype) {
  return dtype >= 0 && dtype <= ANYSHAPE_U64 ? anyshape__dtype_names[dtype] : "unknown";
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
  for (int k = 0; k <= ANYSHAPE_U64; ++k)
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

#ifdef __cplusplus
}
#endif
