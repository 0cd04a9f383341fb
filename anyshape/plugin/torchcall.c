/* anyshape plugin mode: the whole model call in C, from torch tensors to torch tensors.
 *
 * Built into the fast-call extension after runtime/fastcall.c, whose call helpers it uses
 * (see runtime/fastcall.py).
 * A TorchCall is made once per compiled model whose graph is one native library
 * taking the model's own inputs (plugin/direct.py decides). Calling it with the
 * model's (*args, **kwargs) puts the inputs in order, checks each is a CPU,
 * contiguous tensor of the compiled dtype, calls the library's anyshape_main
 * (which checks shapes, ranges and guards in its prologue), wraps the outputs
 * as tensors without a copy and rebuilds the output structure.
 *
 * Anything off the common path -- a call structured unlike the example, a
 * non-tensor, another dtype or device, a tensor that requires grad in grad mode,
 * a non-contiguous tensor, or a shape the prologue refuses -- returns
 * NotImplemented, and the caller takes the general Python path, which either
 * handles it (warning once that compiled code carries no gradient) or raises
 * the error that names the input.
 */

#define TC_MAX 64 /* inputs, output slots and flat outputs a TorchCall takes */

/* The Python objects a TorchCall holds: one list for the struct, GC traversal and clearing. */
#define TC_OBJECTS(X)                                                                       \
  X(kw_names)     /* keyword inputs expected, in flat order after the positionals */       \
  X(dtypes)       /* per graph input: the torch.dtype compiled for */                      \
  X(outputs)      /* per flat output: (0, slot) | (1, flat input) | (2, constant) */       \
  X(unflatten)    /* form 2: list of flat outputs -> the model's output structure */       \
  X(tensor_types) /* the exact tensor types taken (subclasses go the general way) */       \
  X(from_numpy) X(kernel_error)                                                            \
  X(owner) /* what owns `main`, `free` and `params` (the loaded library): kept alive */

#define TC_FIELD(name) PyObject* name;
typedef struct {
  PyObject_HEAD vectorcallfunc vectorcall;
  as_main_fn main;
  as_free_fn free;
  const anyshape_tensor* params;
  Py_ssize_t n_args, n_flat; /* positional inputs; all inputs */
  Py_ssize_t n_in, n_slots, n_out;
  Py_ssize_t order[TC_MAX]; /* per graph input: its flat index */
  int out_types[TC_MAX];    /* per output slot: NumPy type number */
  int out_kind[TC_MAX];     /* per flat output: 0 slot, 1 flat input, 2 constant */
  Py_ssize_t out_at[TC_MAX];
  int form; /* 0: one leaf, 1: a tuple of leaves, 2: unflatten(list) */
  TC_OBJECTS(TC_FIELD)
} TorchCall;

static PyObject* torchcall_call(PyObject* callable, PyObject* const* args, size_t nargsf,
                                PyObject* kwnames);

static PyObject *s_dtype, *s_is_cpu, *s_requires_grad, *s_shape, *s_data_ptr, *s_is_contiguous;

static int intern_names(void) {
  if (s_dtype) return 0;
  s_dtype = PyUnicode_InternFromString("dtype");
  s_is_cpu = PyUnicode_InternFromString("is_cpu");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  s_shape = PyUnicode_InternFromString("shape");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  return s_dtype && s_is_cpu && s_requires_grad && s_shape && s_data_ptr && s_is_contiguous
             ? 0
             : -1;
}

/* The per-call integers, read once here rather than from tuples on every call. */
static int read_signature(TorchCall* self, PyObject* order, PyObject* out_types) {
  self->n_in = PyTuple_GET_SIZE(order);
  self->n_slots = PyTuple_GET_SIZE(out_types);
  self->n_out = PyTuple_GET_SIZE(self->outputs);
  if (self->n_in != PyTuple_GET_SIZE(self->dtypes) || self->n_in > TC_MAX ||
      self->n_slots > TC_MAX || self->n_out > TC_MAX || self->n_flat > TC_MAX ||
      self->form < 0 || self->form > 2) {
    PyErr_SetString(PyExc_ValueError, "TorchCall: inconsistent signature");
    return -1;
  }
  for (Py_ssize_t k = 0; k < self->n_in; ++k)
    self->order[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, k));
  for (Py_ssize_t k = 0; k < self->n_slots; ++k)
    self->out_types[k] = (int)PyLong_AsLong(PyTuple_GET_ITEM(out_types, k));
  for (Py_ssize_t k = 0; k < self->n_out; ++k) {
    PyObject* spec = PyTuple_GET_ITEM(self->outputs, k);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) {
      PyErr_SetString(PyExc_ValueError, "TorchCall: an output is not (kind, value)");
      return -1;
    }
    self->out_kind[k] = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    self->out_at[k] = self->out_kind[k] == 2 ? 0 : PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
    const Py_ssize_t bound = self->out_kind[k] == 0 ? self->n_slots : self->n_flat;
    if (self->out_kind[k] < 0 || self->out_kind[k] > 2 || self->out_at[k] < 0 ||
        (self->out_kind[k] < 2 && self->out_at[k] >= bound)) {
      PyErr_SetString(PyExc_ValueError, "TorchCall: an output refers outside the call");
      return -1;
    }
  }
  for (Py_ssize_t k = 0; k < self->n_in; ++k)
    if (self->order[k] < 0 || self->order[k] >= self->n_flat) {
      PyErr_SetString(PyExc_ValueError, "TorchCall: an input refers outside the call");
      return -1;
    }
  return PyErr_Occurred() ? -1 : 0;
}

static PyObject* torchcall_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  unsigned long long main_addr, free_addr, params_addr;
  Py_ssize_t n_args;
  PyObject *kw_names, *order, *dtypes, *out_types, *outputs, *unflatten, *tensor_types;
  PyObject *from_numpy, *kernel_error, *owner;
  int form;
  if (intern_names() < 0) return NULL;
  if (!PyArg_ParseTuple(args, "KKKnO!O!O!O!O!iOO!OOO", &main_addr, &free_addr, &params_addr,
                        &n_args, &PyTuple_Type, &kw_names, &PyTuple_Type, &order, &PyTuple_Type,
                        &dtypes, &PyTuple_Type, &out_types, &PyTuple_Type, &outputs, &form,
                        &unflatten, &PyTuple_Type, &tensor_types, &from_numpy, &kernel_error,
                        &owner))
    return NULL;
  TorchCall* self = (TorchCall*)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->main = (as_main_fn)(uintptr_t)main_addr;
  self->free = (as_free_fn)(uintptr_t)free_addr;
  self->params = (const anyshape_tensor*)(uintptr_t)params_addr;
  self->n_args = n_args;
  self->n_flat = n_args + PyTuple_GET_SIZE(kw_names);
  self->form = form;
#define TC_SET(name) \
  Py_INCREF(name);   \
  self->name = name;
  TC_OBJECTS(TC_SET)
#undef TC_SET
  if (read_signature(self, order, out_types) < 0) {
    Py_DECREF(self);
    return NULL;
  }
  self->vectorcall = torchcall_call;
  return (PyObject*)self;
}

AS_GC_SLOTS(torchcall, TorchCall, TC_OBJECTS)

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

/* torch.is_grad_enabled(): 1, 0, or -1 with a Python error. */
static int grad_enabled(void) {
  static PyObject* fn;
  if (!fn) {
    PyObject* torch = PyImport_ImportModule("torch");
    if (!torch) return -1;
    fn = PyObject_GetAttrString(torch, "is_grad_enabled");
    Py_DECREF(torch);
    if (!fn) return -1;
  }
  PyObject* on = PyObject_CallNoArgs(fn);
  if (!on) return -1;
  Py_DECREF(on);
  return on == Py_True;
}

/* Describe one tensor: 1 done, 0 not on the fast path, -1 a Python error. */
static int describe_tensor(TorchCall* self, PyObject* t, PyObject* dtype, anyshape_tensor* out) {
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
  flag = PyObject_GetAttr(t, s_requires_grad);
  if (!flag) return -1;
  ok = flag == Py_False;
  Py_DECREF(flag);
  if (!ok) { /* with grad mode on, the general path says no gradient comes back */
    int on = grad_enabled();
    if (on) return on < 0 ? -1 : 0;
  }
  flag = PyObject_CallMethodNoArgs(t, s_is_contiguous);
  if (!flag) return -1;
  ok = flag == Py_True;
  Py_DECREF(flag);
  if (!ok) return 0;
  PyObject* shape = PyObject_GetAttr(t, s_shape);
  if (!shape) return -1;
  if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > ANYSHAPE_MAX_RANK) {
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
static PyObject* adopt_output(TorchCall* self, anyshape_tensor* o, Py_ssize_t slot) {
  npy_intp dims[ANYSHAPE_MAX_RANK];
  for (int d = 0; d < o->ndim; ++d) dims[d] = (npy_intp)o->shape[d];
  PyObject* cap = PyCapsule_New(o->data, "anyshape.buffer", release);
  if (!cap) {
    self->free(o->data);
    return NULL;
  }
  if (PyCapsule_SetContext(cap, (void*)self->free) < 0) {
    Py_DECREF(cap);
    return NULL;
  }
  PyObject* arr = PyArray_SimpleNewFromData((int)o->ndim, dims, self->out_types[slot], o->data);
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
  Py_ssize_t n = self->n_out;
  PyObject* values = PyList_New(n);
  if (!values) return NULL;
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* item = self->out_kind[k] == 0   ? slots[self->out_at[k]]
                     : self->out_kind[k] == 1 ? flat[self->out_at[k]]
                                              : PyTuple_GET_ITEM(PyTuple_GET_ITEM(self->outputs, k), 1);
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
  PyObject* flat[TC_MAX];
  if (!flatten_call(self, args, nargsf, kwnames, flat)) return NOT_HERE;
  anyshape_tensor ins[TC_MAX];
  for (Py_ssize_t k = 0; k < self->n_in; ++k) {
    int r = describe_tensor(self, flat[self->order[k]], PyTuple_GET_ITEM(self->dtypes, k), &ins[k]);
    if (r < 0) return NULL;
    if (r == 0) return NOT_HERE;
  }
  const Py_ssize_t n_slots = self->n_slots;
  anyshape_tensor outs[TC_MAX];
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
  PyObject* slots[TC_MAX];
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
