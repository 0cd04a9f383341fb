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

#include "anyshape_abi.h" /* anyshape_tensor, ANYSHAPE_MAX_RANK, dtype codes ANYSHAPE_* */

#ifdef __cplusplus
extern "C" {
#endif

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

/* The implementation, in pipeline order: the file, then the library and the call. */
#if defined(ANYSHAPE_IMPLEMENTATION) && !defined(ANYSHAPE_IMPLEMENTED)
#define ANYSHAPE_IMPLEMENTED
#include "anyshape_file.h"
#include "anyshape_run.h"
#endif
