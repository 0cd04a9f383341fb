/* anyshape_abi.h: the tensor descriptor every compiled library takes and returns.
 *
 * The one declaration of the ABI, shared by the generated code (codegen/cpu/prelude.h
 * includes it; the build pastes it into each unit), the C API for artifacts (anyshape.h)
 * and the fast-call extension (runtime/fastcall.c). runtime/native.py mirrors it with
 * ctypes, and tests/test_abi.py checks that mirror against this file. C99 and C++.
 */
#ifndef ANYSHAPE_ABI_H
#define ANYSHAPE_ABI_H

#include <stdint.h>

/* The highest rank a tensor crossing the ABI may have. */
#define ANYSHAPE_MAX_RANK 8

/* Element types, as coded in anyshape_tensor.dtype (the manifest spells them b8 ... u64);
 * the order of anyshape.ir.dtypes.DType. */
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
  ANYSHAPE_F64,
  ANYSHAPE_U16,
  ANYSHAPE_U32,
  ANYSHAPE_U64
};

/* A dense C-contiguous tensor: inputs, weights and outputs of anyshape_main. */
typedef struct anyshape_tensor {
  void* data; /* may be NULL when the tensor has no elements */
  int64_t ndim;
  int64_t shape[ANYSHAPE_MAX_RANK];
  int64_t dtype; /* ANYSHAPE_* */
} anyshape_tensor;

#endif /* ANYSHAPE_ABI_H */
