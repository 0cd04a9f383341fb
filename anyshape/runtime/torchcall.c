/* anyshape runtime: plugin mode's whole call in C, from torch tensors to torch tensors.
 *
 * Built into the fast-call extension after fastcall.c (see runtime/fastcall.py).
 * A TorchCall is made once per compiled model whose graph is one native library
 * taking the model's own inputs (plugin/direct.py decides). Calling it with the
 * model's (*args, **kwargs) puts the inputs in order, checks each is a CPU,
 * contiguous tensor of the compiled dtype, calls the library's anyshape_main
 * (which checks shapes, ranges and guards in its prologue), wraps the outputs
 * as tensors without a copy and rebuilds the output structure.
 *
 * Anything off the common path -- a call structured unlike the example, a
 * non-tensor, another dtype or device, a non-contiguous tensor, or a shape the
 * prologue refuses -- returns NotImplemented, and the caller takes the general
 * Python path, which either handles it or raises the error that names the input.
 */

typedef struct {
  PyObject_HEAD vectorcallfunc vectorcall;
  as_main_fn main;
  as_free_fn free;
  const AsTensor* params;
  Py_ssize_t n_args;   /* positional inputs expected */
  PyObject* kw_names;  /* keyword inputs expected, in flat order after the positionals */
  Py_ssize_t n_flat;
  PyObject* order;     /* per graph input: its flat index */
  PyObject* dtypes;    /* per graph input: the torch.dtype compiled for */
  PyObject* out_types; /* per output slot: NumPy type number */
  PyObject* outputs;   /* per flat output: (0, slot) | (1, flat input) | (2, constant) */
  int form;            /* 0: one leaf, 1: a tuple of leaves, 2: unflatten(list) */
  PyObject* unflatten;
  PyObject* tensor_types; /* the exact tensor types taken (subclasses go the general way) */
  PyObject* from_numpy;
  PyObject* kernel_error;
} TorchCall;

static PyObject* torchcall_call(PyObject* callable, PyObject* const* args, size_t nargsf,
                                PyObject* kwnames);

static PyObject *s_dtype, *s_is_cpu, *s_shape, *s_data_ptr, *s_is_contiguous;

static int intern_names(void) {
  if (s_dtype) return 0;
  s_dtype = PyUnicode_InternFromString("dtype");
  s_is_cpu = PyUnicode_InternFromString("is_cpu");
  s_shape = PyUnicode_InternFromString("shape");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  return s_dtype && s_is_cpu && s_shape && s_data_ptr && s_is_contiguous ? 0 : -1;
}

static PyObject* torchcall_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  unsigned long long main_addr, free_addr, params_addr;
  Py_ssize_t n_args;
  PyObject *kw_names, *order, *dtypes, *out_types, *outputs, *unflatten, *tensor_types;
  PyObject *from_numpy, *kernel_error;
  int form;
  if (intern_names() < 0) return NULL;
  if (!PyArg_ParseTuple(args, "KKKnO!O!O!O!O!iOO!OO", &main_addr, &free_addr, &params_addr,
                        &n_args, &PyTuple_Type, &kw_names, &PyTuple_Type, &order, &PyTuple_Type,
                        &dtypes, &PyTuple_Type, &out_types, &PyTuple_Type, &outputs, &form,
                        &unflatten, &PyTuple_Type, &tensor_types, &from_numpy, &kernel_error))
    return NULL;
  if (PyTuple_GET_SIZE(order) != PyTuple_GET_SIZE(dtypes) || PyTuple_GET_SIZE(order) > 64 ||
      PyTuple_GET_SIZE(out_types) > 64 || form < 0 || form > 2) {
    PyErr_SetString(PyExc_ValueError, "TorchCall: inconsistent signature");
    return NULL;
  }
  TorchCall* self = (TorchCall*)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->main = (as_main_fn)(uintptr_t)main_addr;
  self->free = (as_free_fn)(uintptr_t)free_addr;
  self->params = (const AsTensor*)(uintptr_t)params_addr;
  self->n_args = n_args;
  self->n_flat = n_args + PyTuple_GET_SIZE(kw_names);
  self->form = form;
  PyObject** fields[] = {&self->kw_names,  &self->order,        &self->dtypes,
                         &self->out_types, &self->outputs,      &self->unflatten,
                         &self->tensor_types, &self->from_numpy, &self->kernel_error};
  PyObject* values[] = {kw_names, order,        dtypes,     out_types,   outputs,
                        unflatten, tensor_types, from_numpy, kernel_error};
  for (size_t k = 0; k < sizeof(values) / sizeof(values[0]); ++k) {
    Py_INCREF(values[k]);
    *fields[k] = values[k];
  }
  self->vectorcall = torchcall_call;
  return (PyObject*)self;
}

static int torchcall_traverse(TorchCall* self, visitproc visit, void* arg) {
  Py_VISIT(self->kw_names);
  Py_VISIT(self->order);
  Py_VISIT(self->dtypes);
  Py_VISIT(self->out_types);
  Py_VISIT(self->outputs);
  Py_VISIT(self->unflatten);
  Py_VISIT(self->tensor_types);
  Py_VISIT(self->from_numpy);
  Py_VISIT(self->kernel_error);
  return 0;
}

static int torchcall_clear(TorchCall* self) {
  Py_CLEAR(self->kw_names);
  Py_CLEAR(self->order);
  Py_CLEAR(self->dtypes);
  Py_CLEAR(self->out_types);
  Py_CLEAR(self->outputs);
  Py_CLEAR(self->unflatten);
  Py_CLEAR(self->tensor_types);
  Py_CLEAR(self->from_numpy);
  Py_CLEAR(self->kernel_error);
  return 0;
}

static void torchcall_dealloc(TorchCall* self) {
  PyObject_GC_UnTrack(self);
  torchcall_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

#define NOT_HERE (Py_INCREF(Py_NotImplemented), Py_NotImplemented)

/* The call's inputs in flat order (borrowed), or 0 when it is not structured like the example. */
static int flatten_call(TorchCall* self, PyObject* const* args, size_t nargsf, PyObject* kwnames,
                        PyObject** flat) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs != self->n_args || nargs + nkw != self->n_flat) return 0;
  for (Py_ssize_t i = 0; i < nargs; ++i) flat[i] = args[i];
  for (Py_ssize_t i = nargs; i < self->n_flat; ++i) flat[i] = NULL;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    Py_ssize_t at = -1;
    for (Py_ssize_t j = 0; j < nkw && at < 0; ++j) {
      PyObject* want = PyTuple_GET_ITEM(self->kw_names, j);
      if (want == name || PyUnicode_Compare(want, name) == 0) at = j;
    }
    if (at < 0 || flat[nargs + at]) return 0;
    flat[nargs + at] = args[nargs + k];
  }
  return 1;
}

static int is_taken_tensor(TorchCall* self, PyObject* obj) {
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(self->tensor_types); ++k)
    if ((PyObject*)Py_TYPE(obj) == PyTuple_GET_ITEM(self->tensor_types, k)) return 1;
  return 0;
}

/* Describe one tensor: 1 done, 0 not on the fast path, -1 a Python error. */
static int describe_tensor(TorchCall* self, PyObject* t, PyObject* dtype, AsTensor* out) {
  if (!is_taken_tensor(self, t)) return 0;
  PyObject* got = PyObject_GetAttr(t, s_dtype);
  if (!got) return -1;
  Py_DECREF(got); /* torch.dtype objects are singletons that live as long as torch */
  if (got != dtype) return 0;
  PyObject* flag = PyObject_GetAttr(t, s_is_cpu);
  if (!flag) return -1;
  int ok = flag == Py_True;
  Py_DECREF(flag);
  if (!ok) return 0;
  flag = PyObject_CallMethodNoArgs(t, s_is_contiguous);
  if (!flag) return -1;
  ok = flag == Py_True;
  Py_DECREF(flag);
  if (!ok) return 0;
  PyObject* shape = PyObject_GetAttr(t, s_shape);
  if (!shape) return -1;
  if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > AS_MAX_RANK) {
    Py_DECREF(shape);
    return 0;
  }
  int64_t numel = 1;
  out->ndim = PyTuple_GET_SIZE(shape);
  for (Py_ssize_t d = 0; d < out->ndim; ++d) {
    out->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    numel *= out->shape[d];
  }
  Py_DECREF(shape);
  if (PyErr_Occurred()) return -1;
  PyObject* ptr = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (!ptr) return -1;
  out->data = numel ? PyLong_AsVoidPtr(ptr) : NULL;
  Py_DECREF(ptr);
  if (PyErr_Occurred()) return -1;
  out->dtype = 0; /* the library reads dtypes from its signature */
  return 1;
}

/* One returned buffer as a tensor that frees it with its last reference. */
static PyObject* adopt_output(TorchCall* self, AsTensor* o, Py_ssize_t slot) {
  npy_intp dims[AS_MAX_RANK];
  for (int d = 0; d < o->ndim; ++d) dims[d] = (npy_intp)o->shape[d];
  int typenum = (int)PyLong_AsLong(PyTuple_GET_ITEM(self->out_types, slot));
  PyObject* cap = PyCapsule_New(o->data, "anyshape.buffer", release);
  if (!cap) {
    self->free(o->data);
    return NULL;
  }
  if (PyCapsule_SetContext(cap, (void*)self->free) < 0) {
    Py_DECREF(cap);
    return NULL;
  }
  PyObject* arr = PyArray_SimpleNewFromData((int)o->ndim, dims, typenum, o->data);
  if (!arr || PyArray_SetBaseObject((PyArrayObject*)arr, cap) < 0) {
    Py_XDECREF(arr);
    Py_DECREF(cap);
    return NULL;
  }
  PyObject* tensor = PyObject_CallOneArg(self->from_numpy, arr);
  Py_DECREF(arr);
  return tensor;
}

static PyObject* build_result(TorchCall* self, PyObject** flat, PyObject** slots) {
  Py_ssize_t n = PyTuple_GET_SIZE(self->outputs);
  PyObject* values = PyList_New(n);
  if (!values) return NULL;
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* spec = PyTuple_GET_ITEM(self->outputs, k);
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    PyObject* v = PyTuple_GET_ITEM(spec, 1);
    PyObject* item = kind == 0   ? slots[PyLong_AsSsize_t(v)]
                     : kind == 1 ? flat[PyLong_AsSsize_t(v)]
                                 : v;
    Py_INCREF(item);
    PyList_SET_ITEM(values, k, item);
  }
  if (self->form == 0 && n == 1) {
    PyObject* only = PyList_GET_ITEM(values, 0);
    Py_INCREF(only);
    Py_DECREF(values);
    return only;
  }
  if (self->form == 1) {
    PyObject* tuple = PyList_AsTuple(values);
    Py_DECREF(values);
    return tuple;
  }
  PyObject* result = PyObject_CallOneArg(self->unflatten, values);
  Py_DECREF(values);
  return result;
}

static PyObject* torchcall_call(PyObject* callable, PyObject* const* args, size_t nargsf,
                                PyObject* kwnames) {
  TorchCall* self = (TorchCall*)callable;
  PyObject* flat[64];
  if (self->n_flat > 64 || !flatten_call(self, args, nargsf, kwnames, flat)) return NOT_HERE;
  Py_ssize_t n_in = PyTuple_GET_SIZE(self->order);
  AsTensor ins[64];
  for (Py_ssize_t k = 0; k < n_in; ++k) {
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(self->order, k));
    int r = describe_tensor(self, flat[at], PyTuple_GET_ITEM(self->dtypes, k), &ins[k]);
    if (r < 0) return NULL;
    if (r == 0) return NOT_HERE;
  }
  Py_ssize_t n_slots = PyTuple_GET_SIZE(self->out_types);
  AsTensor outs[64];
  char err[1024];
  err[0] = 0;
  int code;
  int64_t no_extra = 0;
  Py_BEGIN_ALLOW_THREADS
  code = self->main(ins, self->params, outs, &no_extra, err, (int64_t)sizeof(err));
  Py_END_ALLOW_THREADS
  if (code == 1) return NOT_HERE; /* the general path names the input and dim */
  if (code) {
    PyErr_SetString(self->kernel_error, err);
    return NULL;
  }
  PyObject* slots[64];
  Py_ssize_t made = 0;
  for (; made < n_slots; ++made) {
    slots[made] = adopt_output(self, &outs[made], made);
    if (!slots[made]) break;
  }
  PyObject* result = NULL;
  if (made == n_slots) {
    result = build_result(self, flat, slots);
  } else {
    for (Py_ssize_t j = made + 1; j < n_slots; ++j) self->free(outs[j].data);
  }
  for (Py_ssize_t j = 0; j < made; ++j) Py_DECREF(slots[j]);
  return result;
}

static PyTypeObject TorchCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_anyshape_fastcall.TorchCall",
    .tp_basicsize = sizeof(TorchCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A compiled model's call, torch tensors in and out (NotImplemented: take the "
              "general path).",
    .tp_new = torchcall_new,
    .tp_dealloc = (destructor)torchcall_dealloc,
    .tp_traverse = (traverseproc)torchcall_traverse,
    .tp_clear = (inquiry)torchcall_clear,
    .tp_vectorcall_offset = offsetof(TorchCall, vectorcall),
    .tp_call = PyVectorcall_Call,
};
