/* run_artifact: run an anyshape artifact from C, with nothing but anyshape.h.
 *
 *   run_artifact MODEL.anyshape              print the signature
 *   run_artifact MODEL.anyshape CASE_DIR...  run each case
 *
 * A case directory holds input<k>.bin (raw little-endian data) and input<k>.shape
 * (space-separated dims, empty for a scalar) for every input k; the outputs are written
 * next to them as output<k>.bin and output<k>.shape. Exit code: 0 ok, 1 bad input,
 * 2 run-time error, 3 load, usage or I/O error.
 *
 * Build:
 *   gcc -O2 -std=c99 -I$(python -c 'import anyshape; print(anyshape.include_dir())') \
 *       examples/run_artifact.c -o run_artifact -ldl
 */
#define ANYSHAPE_IMPLEMENTATION
#include "anyshape.h" /* first: its implementation needs _GNU_SOURCE */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static char err[1024];

/* Sets the error message and returns the exit code. */
static int fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, sizeof err, fmt, ap);
  va_end(ap);
  return code;
}

/* The accessors return NULL past the last input, output, dim or constraint. */
static void print_signature(const anyshape_model* m) {
  const char *name, *dim, *text;
  printf("target ISA %s\ninputs:\n", anyshape_isa(m));
  for (int i = 0; (name = anyshape_input_name(m, i)) != NULL; ++i) {
    printf("  %s %s[", name, anyshape_dtype_name(anyshape_input_dtype(m, i)));
    for (int d = 0; (dim = anyshape_input_dim(m, i, d)) != NULL; ++d)
      printf("%s%s", d ? ", " : "", dim);
    printf("]\n");
  }
  printf("outputs:\n");
  for (int i = 0; (name = anyshape_output_name(m, i)) != NULL; ++i) {
    printf("  %s %s[", name, anyshape_dtype_name(anyshape_output_dtype(m, i)));
    for (int d = 0; (dim = anyshape_output_dim(m, i, d)) != NULL; ++d)
      printf("%s%s", d ? ", " : "", dim);
    printf("]\n");
  }
  for (int i = 0; (text = anyshape_constraint(m, i)) != NULL; ++i)
    printf("%s  %s\n", i ? "" : "constraints:\n", text);
}

/* Reads input k of a case into t (its data malloc'd); 0 or an exit code. */
static int read_input(const char* dir, int k, int dtype, anyshape_tensor* t) {
  char path[4096];
  long long dim;
  size_t numel = 1, bytes;
  int ok = 1;
  FILE* f;
  t->ndim = 0;
  t->dtype = dtype;
  snprintf(path, sizeof path, "%s/input%d.shape", dir, k);
  if (!(f = fopen(path, "r"))) return fail(3, "cannot read %s", path);
  while (ok && fscanf(f, "%lld", &dim) == 1) {
    ok = t->ndim < ANYSHAPE_MAX_RANK && dim >= 0;
    if (ok) numel *= (size_t)(t->shape[t->ndim++] = dim);
  }
  if (!ok || !feof(f)) { /* a bad dim, too many, or not a number */
    fclose(f);
    return fail(1, "%s: expected at most %d non-negative dims", path, ANYSHAPE_MAX_RANK);
  }
  fclose(f);
  bytes = numel * anyshape_dtype_size(dtype);
  snprintf(path, sizeof path, "%s/input%d.bin", dir, k);
  if (!(f = fopen(path, "rb"))) return fail(3, "cannot read %s", path);
  t->data = malloc(bytes ? bytes : 1);
  if (!t->data || fread(t->data, 1, bytes, f) != bytes || fgetc(f) != EOF) {
    fclose(f);
    return fail(1, "%s does not hold %zu bytes (%zu %s values)", path, bytes, numel,
                anyshape_dtype_name(dtype));
  }
  fclose(f);
  return 0;
}

static int write_output(const char* dir, int k, const anyshape_tensor* t) {
  char path[4096];
  size_t numel = 1, bytes;
  int ok;
  FILE* f;
  snprintf(path, sizeof path, "%s/output%d.shape", dir, k);
  if (!(f = fopen(path, "w"))) return fail(3, "cannot write %s", path);
  for (int d = 0; d < t->ndim; ++d) {
    fprintf(f, "%s%lld", d ? " " : "", (long long)t->shape[d]);
    numel *= (size_t)t->shape[d];
  }
  ok = fprintf(f, "\n") == 1;
  if (fclose(f) != 0 || !ok) return fail(3, "cannot write %s", path);
  bytes = numel * anyshape_dtype_size((int)t->dtype);
  snprintf(path, sizeof path, "%s/output%d.bin", dir, k);
  if (!(f = fopen(path, "wb"))) return fail(3, "cannot write %s", path);
  ok = fwrite(t->data, 1, bytes, f) == bytes;
  if (fclose(f) != 0 || !ok) return fail(3, "cannot write %s", path);
  return 0;
}

/* Runs one case directory; prints its output shapes and the run time. */
static int run_case(const anyshape_model* m, const char* dir) {
  int n_in = anyshape_num_inputs(m), n_out = anyshape_num_outputs(m), code = 0;
  anyshape_tensor* in = (anyshape_tensor*)calloc((size_t)n_in + 1, sizeof *in);
  anyshape_tensor* out = (anyshape_tensor*)calloc((size_t)n_out + 1, sizeof *out);
  struct timespec t0, t1;
  if (!in || !out) code = fail(3, "out of memory");
  for (int k = 0; k < n_in && !code; ++k)
    code = read_input(dir, k, anyshape_input_dtype(m, k), &in[k]);
  if (!code) {
    clock_gettime(CLOCK_MONOTONIC, &t0);
    code = anyshape_run(m, in, n_in, out, n_out, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!code) {
      printf("%s:", dir);
      for (int k = 0; k < n_out; ++k) {
        printf(" %s[", anyshape_output_name(m, k));
        for (int d = 0; d < out[k].ndim; ++d)
          printf("%s%lld", d ? "x" : "", (long long)out[k].shape[d]);
        printf("]");
      }
      printf(" in %.3f ms\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
      for (int k = 0; k < n_out; ++k) {
        if (!code) code = write_output(dir, k, &out[k]);
        anyshape_release(m, out[k].data);
      }
    }
  }
  for (int k = 0; in && k < n_in; ++k) free(in[k].data);
  free(in);
  free(out);
  return code;
}

int main(int argc, char** argv) {
  anyshape_model* m;
  int code = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.anyshape [CASE_DIR...]\n", argv[0]);
    return 3;
  }
  if (!(m = anyshape_load(argv[1], err, sizeof err))) {
    fprintf(stderr, "%s\n", err);
    return 3;
  }
  if (argc == 2) print_signature(m);
  for (int i = 2; i < argc && !code; ++i) code = run_case(m, argv[i]);
  if (code) fprintf(stderr, "%s\n", err);
  anyshape_unload(m);
  return code;
}
