/* anyshape runtime: the one native call per model call, from Python, in C.
 *
 * Built once per Python/NumPy version by runtime/fastcall.py (through the same
 * content-addressed cache as compiled graphs), with plugin/torchcall.c and
 * plugin/modulecall.c after it in one unit. call() describes the input arrays
 * as anyshape_tensor records (checking count, dtype and rank first), calls a compiled
 * graph's anyshape_main, and wraps every returned buffer in a NumPy array that
 * frees it with the last reference: no copy and no per-call ctypes work.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stddef.h>
#include <stdint.h>

#include "anyshape_abi.h" /* anyshape_tensor, ANYSHAPE_MAX_RANK (pasted in by the build) */

// tp_traverse, tp_clear and tp_dealloc of a GC type whose object fields OBJECTS(X) lists
// (TorchCall, ModuleCall): prefix_traverse, prefix_clear, prefix_dealloc.
#define AS_GC_VISIT(name) Py_VISIT(self->name);
#define AS_GC_CLEAR(name) Py_CLEAR(self->name);
#define AS_GC_SLOTS(prefix, Type, OBJECTS)                                 \
  static int prefix##_traverse(Type* self, visitproc visit, void* arg) {   \
    OBJECTS(AS_GC_VISIT)                                                   \
    return 0;                                                              \
  }                                                                        \
  static int prefix##_clear(Type* self) {                                  \
    OBJECTS(AS_GC_CLEAR)                                                   \
    return 0;                                                              \
  }                                                                        \
  static void prefix##_dealloc(Type* self) {                               \
    PyObject_GC_UnTrack(self);                                             \
    prefix##_clear(self);                                                  \
    Py_TYPE(self)->tp_free((PyObject*)self);                               \
  }

typedef int (*as_main_fn)(const anyshape_tensor*, const anyshape_tensor*, anyshape_tensor*,
                          const int64_t*, char*, int64_t);
typedef void (*as_free_fn)(void*);

static void release(PyObject* capsule) {
  as_free_fn f = (as_free_fn)PyCapsule_GetContext(capsule);
  void* p = PyCapsule_GetPointer(capsule, "anyshape.buffer");
  if (f && p) f(p);
}

/* call(main, free, params, arrays, extra, in_types, in_names, out_types, input_error,
 *      kernel_error) -> list of arrays */
static PyObject* call(PyObject* self, PyObject* args) {
  unsigned long long main_addr, free_addr, params_addr;
  PyObject *arrays, *extra, *in_types, *in_names, *out_types, *input_error, *kernel_error;
  if (!PyArg_ParseTuple(args, "KKKO!O!O!O!O!OO", &main_addr, &free_addr, &params_addr,
                        &PyList_Type, &arrays, &PyTuple_Type, &extra, &PyTuple_Type, &in_types,
                        &PyTuple_Type, &in_names, &PyTuple_Type, &out_types, &input_error,
                        &kernel_error))
    return NULL;
  Py_ssize_t n = PyList_GET_SIZE(arrays);
  Py_ssize_t expected = PyTuple_GET_SIZE(in_types);
  if (n != expected) {
    PyErr_Format(input_error, "the compiled graph takes %zd inputs, got %zd", expected, n);
    return NULL;
  }
  anyshape_tensor stack_in[8];
  anyshape_tensor* ins =
      n <= 8 ? stack_in : (anyshape_tensor*)PyMem_Malloc(sizeof(anyshape_tensor) * (size_t)n);
  PyObject** held = (PyObject**)PyMem_Malloc(sizeof(PyObject*) * (size_t)(n ? n : 1));
  Py_ssize_t n_held = 0;
  int64_t* ext_heap = NULL; /* run-time symbols past the 16 on the stack */
  PyObject* result = NULL;
  if (!ins || !held) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* obj = PyList_GET_ITEM(arrays, i);
    if (!PyArray_Check(obj)) {
      PyErr_Format(input_error, "input '%U' must be an array, got %s",
                   PyTuple_GET_ITEM(in_names, i), Py_TYPE(obj)->tp_name);
      goto done;
    }
    PyArrayObject* a = (PyArrayObject*)obj;
    long want = PyLong_AsLong(PyTuple_GET_ITEM(in_types, i));
    if (PyArray_TYPE(a) != want && !(PyArray_EquivTypenums(PyArray_TYPE(a), (int)want))) {
      PyObject* got = PyObject_Str((PyObject*)PyArray_DESCR(a));
      PyArray_Descr* wd = PyArray_DescrFromType((int)want);
      PyObject* exp = wd ? PyObject_Str((PyObject*)wd) : NULL;
      Py_XDECREF(wd);
      if (got && exp)
        PyErr_Format(input_error, "input '%U' has dtype %U, expected %U",
                     PyTuple_GET_ITEM(in_names, i), got, exp);
      Py_XDECREF(got);
      Py_XDECREF(exp);
      goto done;
    }
    if (PyArray_NDIM(a) > ANYSHAPE_MAX_RANK) {
      PyErr_Format(input_error, "input '%U' has rank %d; at most %d is supported",
                   PyTuple_GET_ITEM(in_names, i), PyArray_NDIM(a), ANYSHAPE_MAX_RANK);
      goto done;
    }
    if (!PyArray_IS_C_CONTIGUOUS(a)) {
      a = (PyArrayObject*)PyArray_NewCopy(a, NPY_CORDER);
      if (!a) goto done;
      held[n_held++] = (PyObject*)a;
    }
    ins[i].data = PyArray_SIZE(a) ? PyArray_DATA(a) : NULL;
    ins[i].ndim = PyArray_NDIM(a);
    for (int d = 0; d < PyArray_NDIM(a); ++d) ins[i].shape[d] = PyArray_DIM(a, d);
    ins[i].dtype = PyArray_TYPE(a);
  }
  {
    Py_ssize_t n_extra = PyTuple_GET_SIZE(extra);
    int64_t ext_stack[16];
    int64_t* ext = ext_stack;
    if (n_extra > 16) {
      ext = ext_heap = (int64_t*)PyMem_Malloc(sizeof(int64_t) * (size_t)n_extra);
      if (!ext) {
        PyErr_NoMemory();
        goto done;
      }
    }
    for (Py_ssize_t k = 0; k < n_extra; ++k) {
      ext[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(extra, k));
      if (PyErr_Occurred()) goto done;
    }
    Py_ssize_t n_out = PyTuple_GET_SIZE(out_types);
    anyshape_tensor outs_stack[8];
    anyshape_tensor* outs = n_out <= 8 ? outs_stack
                                       : (anyshape_tensor*)PyMem_Malloc(sizeof(anyshape_tensor) *
                                                                        (size_t)n_out);
    if (!outs) {
      PyErr_NoMemory();
      goto done;
    }
    char err[1024];
    err[0] = 0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = ((as_main_fn)(uintptr_t)main_addr)(ins,
                                              (const anyshape_tensor*)(uintptr_t)params_addr,
                                              outs, ext, err, (int64_t)sizeof(err));
    Py_END_ALLOW_THREADS
    if (code) {
      PyErr_SetString(code == 1 ? input_error : kernel_error, err);
      if (outs != outs_stack) PyMem_Free(outs);
      goto done;
    }
    result = PyList_New(n_out);
    for (Py_ssize_t k = 0; result && k < n_out; ++k) {
      npy_intp dims[ANYSHAPE_MAX_RANK];
      for (int d = 0; d < outs[k].ndim; ++d) dims[d] = (npy_intp)outs[k].shape[d];
      int typenum = (int)PyLong_AsLong(PyTuple_GET_ITEM(out_types, k));
      PyObject* cap = PyCapsule_New(outs[k].data, "anyshape.buffer", release);
      PyObject* arr = NULL;
      if (cap && PyCapsule_SetContext(cap, (void*)(uintptr_t)free_addr) == 0)
        arr = PyArray_SimpleNewFromData((int)outs[k].ndim, dims, typenum, outs[k].data);
      if (!arr || PyArray_SetBaseObject((PyArrayObject*)arr, cap) < 0) {
        /* on failure the capsule (if any) still frees the buffer */
        Py_XDECREF(arr);
        Py_XDECREF(cap);
        for (Py_ssize_t j = k + 1; j < n_out; ++j) ((as_free_fn)(uintptr_t)free_addr)(outs[j].data);
        Py_CLEAR(result);
        break;
      }
      PyList_SET_ITEM(result, k, arr);
    }
    if (outs != outs_stack) PyMem_Free(outs);
  }
done:
  PyMem_Free(ext_heap);
  for (Py_ssize_t k = 0; k < n_held; ++k) Py_DECREF(held[k]);
  if (held) PyMem_Free(held);
  if (ins && ins != stack_in) PyMem_Free(ins);
  return result;
}
