// anyshape CPU runtime: vectorizable float math, pasted after prelude.h.
// Branch-free, inlined, no libm calls, so loops that use them vectorize at the target's
// SIMD width (needs -fno-trapping-math for floor and rint). Accuracy over float inputs,
// against double-precision libm (tests/test_cpu_backend.py checks these bounds):
//   exp: relative error <= 8.4e-8 (1.4 ulp) on the normal range, subnormal results within
//   one subnormal step (0 below -103.97), inf above 88.72;
//   erf: absolute error <= 4.2e-7;  tanh: relative error <= 3.3e-7.  NaN in, NaN out.
#define AS_VINLINE static inline __attribute__((always_inline))
AS_VINLINE float as_bits_to_float(int32_t i) { return __builtin_bit_cast(float, i); }
#if defined(__has_builtin)
#if __has_builtin(__builtin_assoc_barrier)
#define AS_ASSOC_BARRIER(x) __builtin_assoc_barrier(x)
#endif
#endif
#ifndef AS_ASSOC_BARRIER
#define AS_ASSOC_BARRIER(x) (x)
#endif

// exp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r,
// scaled by 2^n in two steps so results near the overflow and subnormal ends stay right.
// The upper clamp makes overflow fall out of the arithmetic (88.8 overflows to inf) and NaN
// flows through it; below -104.5 one select gives 0 (e^x rounds to 0 from -103.97).
AS_VINLINE float as_expf(float x) {
  const float hi = 88.8f, lo = -104.5f;
  float xc = hi < x ? hi : x;  // one-sided (NaN passes): GCC turns a two-sided clamp into 9 ops
  float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = __builtin_fmaf(n, -0.693359375f, xc);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  float y = __builtin_fmaf(p, r * r, r) + 1.0f;
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1, n2 = ni - n1;
  // Two steps, in this order even where the kernel reassociates (host.py): one scale of
  // 2^(n1 + n2) would overflow or flush at the ends.
  y = AS_ASSOC_BARRIER(y * as_bits_to_float((n1 + 127) << 23)) *
      as_bits_to_float((n2 + 127) << 23);
  return x < lo ? 0.0f : y;  // below lo the reduction above is garbage; e^x rounds to 0 there
}

// erf: odd rational approximation on [0, 4] (erf is 1 in float beyond), sign copied from
// the argument: clamping |a| on one side costs 2 ops where clamping a on both costs 8.
AS_VINLINE float as_erff(float a) {
  float x = __builtin_fabsf(a);
  x = 4.0f < x ? 4.0f : x;
  float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return __builtin_copysignf(p / q, a);
}

// GELU, exact (erf) form: 0.5 x (1 + erf(x / sqrt 2)) with erf's rational above rescaled to
// take x directly (coefficient k divided by 2^k, 1/sqrt 2 folded into p) and 0.5 x (1 + e)
// as one fma: 3 fewer ops per element than the expression, with erf's error bound (GELU
// absolute error <= 0.5 |x| 4.2e-7 + half an ulp of the result). The clamp is 5.625, where
// the rational is exactly 1 (at 4 sqrt 2 it is 1 + 1 ulp, which made GELU(-1e30) +6e22) and
// erf(5.625 / sqrt 2) already rounds to 1. Codegen matches the lowering's expression
// (codegen/cpu/expr.py).
AS_VINLINE float as_gelu_erff(float x) {
  const float c = 5.625f;
  float a = __builtin_fabsf(x);
  a = c < a ? c : a;
  float a2 = a * a;
  float p = -3.01199012050038e-12f;
  p = p * a2 + 6.12239882530040e-10f;
  p = p * a2 + -9.28530207850775e-08f;
  p = p * a2 + -5.03151234198254e-06f;
  p = p * a2 + -1.29929214703174e-04f;
  p = p * a2 + -1.04460878015564e-03f;
  p = p * a2 + -1.13816143151900e-02f;
  p = p * a;
  float q = -9.10379490406225e-07f;
  q = q * a2 + -2.66717569098631e-05f;
  q = q * a2 + -4.20706743595508e-04f;
  q = q * a2 + -3.68666458360234e-03f;
  q = q * a2 + -1.42647390514189e-02f;
  float e = __builtin_copysignf(p / q, x);
  float h = 0.5f * x;
  return __builtin_fmaf(h, e, h);
}

// tanh: odd rational approximation on [0, 7.9] (tanh is 1 in float beyond), sign copied
// from the argument as in erf; identity for tiny inputs.
AS_VINLINE float as_tanhf(float a) {
  const float c = 7.90531110763549805f;
  float ax = __builtin_fabsf(a);
  float x = c < ax ? c : ax;
  float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  float y = p / q;
  y = ax < 0.0004f ? ax : y;
  return __builtin_copysignf(y, a);
}

// Every math function the generated code calls, as compiler builtins (no <cmath>): float
// and double get the matching builtin; integer arguments compute in double, as C++ does.
#define AS_MATH1(name, fn)                                                        \
  AS_VINLINE float name(float x) { return __builtin_##fn##f(x); }                \
  AS_VINLINE double name(double x) { return __builtin_##fn(x); }                 \
  template <class T> AS_VINLINE double name(T x) { return __builtin_##fn((double)x); }
AS_MATH1(as_log, log)
AS_MATH1(as_log1p, log1p)
AS_MATH1(as_expm1, expm1)
AS_MATH1(as_sqrt, sqrt)
AS_MATH1(as_sin, sin)
AS_MATH1(as_cos, cos)
AS_MATH1(as_tan, tan)
AS_MATH1(as_asin, asin)
AS_MATH1(as_acos, acos)
AS_MATH1(as_atan, atan)
AS_MATH1(as_sinh, sinh)
AS_MATH1(as_cosh, cosh)
AS_MATH1(as_asinh, asinh)
AS_MATH1(as_acosh, acosh)
AS_MATH1(as_atanh, atanh)
AS_MATH1(as_floor, floor)
AS_MATH1(as_ceil, ceil)
AS_MATH1(as_nearbyint, nearbyint)
AS_MATH1(as_trunc, trunc)
#undef AS_MATH1
#define AS_MATH2(name, fn)                                                          \
  AS_VINLINE float name(float x, float y) { return __builtin_##fn##f(x, y); }      \
  AS_VINLINE double name(double x, double y) { return __builtin_##fn(x, y); }      \
  template <class A, class B> AS_VINLINE double name(A x, B y) {                    \
    return __builtin_##fn((double)x, (double)y);                                    \
  }
AS_MATH2(as_atan2, atan2)
AS_MATH2(as_fmod, fmod)
#undef AS_MATH2
template <class T> AS_VINLINE T as_abs(T x) { return x < 0 ? (T)-x : x; }
AS_VINLINE float as_abs(float x) { return __builtin_fabsf(x); }
AS_VINLINE double as_abs(double x) { return __builtin_fabs(x); }
template <class T> AS_VINLINE bool as_isinf(T) { return false; }
AS_VINLINE bool as_isinf(float x) { return __builtin_isinf(x); }
AS_VINLINE bool as_isinf(double x) { return __builtin_isinf(x); }
template <class T> AS_VINLINE double as_exp(T x) { return __builtin_exp((double)x); }
template <class T> AS_VINLINE double as_erf(T x) { return __builtin_erf((double)x); }
template <class T> AS_VINLINE double as_tanh(T x) { return __builtin_tanh((double)x); }
AS_VINLINE double as_exp(double x) { return __builtin_exp(x); }
AS_VINLINE double as_erf(double x) { return __builtin_erf(x); }
AS_VINLINE double as_tanh(double x) { return __builtin_tanh(x); }
AS_VINLINE float as_exp(float x) { return as_expf(x); }
AS_VINLINE float as_erf(float x) { return as_erff(x); }
AS_VINLINE float as_tanh(float x) { return as_tanhf(x); }
template <class T> AS_VINLINE T as_sigmoid(T x) { return (T)1 / ((T)1 + as_exp(-x)); }
