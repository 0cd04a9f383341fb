/* anyshape plugin mode: OptimizedModule.__call__ in C, so a small call runs no Python frame.
 *
 * Built into the fast-call extension after plugin/torchcall.c (see runtime/fastcall.py);
 * api.py installs one ModuleCall as the class's __call__ once the extension loads.
 * A call goes straight to the module's TorchCall (its `_native_call`) when nothing
 * needs nn.Module's own call path or the Python forward: an OptimizedModule itself
 * (not a subclass) with no forward of its own, no hooks on the module or global ones,
 * no weights to keep in step, no Module.compile(), no TorchScript tracing, and
 * nn.Module.__call__ not patched (torch.fx tracing patches it). Otherwise it calls
 * the Python `general(self, *args, **kwargs)`, which takes the same decisions in
 * Python; when the TorchCall declines (returns NotImplemented) it calls
 * `after_native`, forward's Python remainder, which raises the errors that name inputs.
 *
 * Python's type call slot passes `self` first without binding a method object
 * (Py_TPFLAGS_METHOD_DESCRIPTOR), so the fast path allocates nothing of its own.
 */

#include <structmember.h>

#define MC_NAMES(X)                                                                    \
  X(_native_call) X(_weights_watch) X(_compiled_call_impl) X(_forward_hooks)           \
  X(_forward_pre_hooks) X(_backward_hooks) X(_backward_pre_hooks) X(_global_forward_hooks) \
  X(_global_forward_pre_hooks) X(_global_backward_hooks) X(_global_backward_pre_hooks) \
  X(__call__) X(forward)

#define MC_DECLARE(name) static PyObject* mc_##name;
MC_NAMES(MC_DECLARE)
#undef MC_DECLARE

/* The Python objects a ModuleCall holds. */
#define MC_OBJECTS(X)                                                                   \
  X(module_class)  /* OptimizedModule: subclasses take the general path */            \
  X(general)       /* the Python path: general(self, *args, **kwargs) */              \
  X(after_native)  /* the Python path once the TorchCall declined (skips it) */      \
  X(hook_globals)  /* torch.nn.modules.module's globals (global hooks) */            \
  X(module_type)   /* torch.nn.Module */                                    \
  X(module_call)   /* torch.nn.Module.__call__ as torch defines it */       \
  X(tracing_state) /* torch._C._get_tracing_state */

#define MC_FIELD(name) PyObject* name;
typedef struct {
  PyObject_HEAD vectorcallfunc vectorcall;
  MC_OBJECTS(MC_FIELD)
} ModuleCall;
#undef MC_FIELD

static int mc_intern(void) {
#define MC_INTERN(name) \
  if (!mc_##name && !(mc_##name = PyUnicode_InternFromString(#name))) return -1;
  MC_NAMES(MC_INTERN)
#undef MC_INTERN
  return 0;
}

/* 1 when `dict[name]` is present and empty (an empty hook dict), 0 otherwise, -1 error. */
static int empty_entry(PyObject* dict, PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(dict, name);
  if (!v) return PyErr_Occurred() ? -1 : 0;
  return PyDict_Check(v) && PyDict_GET_SIZE(v) == 0;
}

/* 1 when `dict[name]` is None or absent (the class's None then), 0 otherwise, -1 error. */
static int none_entry(PyObject* dict, PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(dict, name);
  if (!v) return PyErr_Occurred() ? -1 : 1;
  return v == Py_None;
}

/* The module's TorchCall (a new reference) when the fast path may run; NULL when it may
 * not (with a Python error set only on failure). Torch's tracing state is asked first, so
 * no Python code runs between taking the TorchCall and holding it. */
static PyObject* fast_path(ModuleCall* self, PyObject* module, PyObject* dict) {
  if ((PyObject*)Py_TYPE(module) != self->module_class) return NULL;
  PyObject* tracing = PyObject_CallNoArgs(self->tracing_state);
  if (!tracing) return NULL;
  Py_DECREF(tracing);
  if (tracing != Py_None) return NULL;
  PyObject* current = PyDict_GetItemWithError(((PyTypeObject*)self->module_type)->tp_dict,
                                              mc___call__);
  if (current != self->module_call) return NULL;
  PyObject* const hooks[] = {mc__forward_hooks, mc__forward_pre_hooks, mc__backward_hooks,
                             mc__backward_pre_hooks};
  PyObject* const global_hooks[] = {mc__global_forward_hooks, mc__global_forward_pre_hooks,
                                    mc__global_backward_hooks, mc__global_backward_pre_hooks};
  for (int k = 0; k < 4; ++k) {
    if (empty_entry(dict, hooks[k]) != 1) return NULL;
    if (empty_entry(self->hook_globals, global_hooks[k]) != 1) return NULL;
  }
  if (none_entry(dict, mc__weights_watch) != 1) return NULL;
  if (none_entry(dict, mc__compiled_call_impl) != 1) return NULL;
  if (PyDict_GetItemWithError(dict, mc_forward) || PyErr_Occurred()) return NULL;
  PyObject* fast = PyDict_GetItemWithError(dict, mc__native_call);
  if (!fast || Py_TYPE(fast) != &TorchCallType) return NULL;
  Py_INCREF(fast);
  return fast;
}

static PyObject* modulecall_call(PyObject* callable, PyObject* const* args, size_t nargsf,
                                 PyObject* kwnames) {
  ModuleCall* self = (ModuleCall*)callable;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "OptimizedModule.__call__ needs the module");
    return NULL;
  }
  PyObject* dict = PyObject_GenericGetDict(args[0], NULL);
  if (!dict) return NULL;
  PyObject* fast = fast_path(self, args[0], dict);
  Py_DECREF(dict);
  if (!fast) {
    if (PyErr_Occurred()) return NULL;
    return PyObject_Vectorcall(self->general, args, (size_t)nargs, kwnames);
  }
  PyObject* result = torchcall_call(fast, args + 1, (size_t)(nargs - 1), kwnames);
  Py_DECREF(fast);
  if (result != Py_NotImplemented) return result; /* a result, or NULL with its error */
  Py_DECREF(result);
  return PyObject_Vectorcall(self->after_native, args, (size_t)nargs, kwnames);
}

static PyObject* modulecall_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  PyObject *module_class, *general, *after_native, *hook_globals, *module_type, *module_call,
      *tracing_state;
  if (mc_intern() < 0) return NULL;
  if (kw && PyDict_GET_SIZE(kw)) {
    PyErr_SetString(PyExc_TypeError, "ModuleCall takes positional arguments only");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "O!OOO!O!OO", &PyType_Type, &module_class, &general,
                        &after_native, &PyDict_Type, &hook_globals, &PyType_Type, &module_type,
                        &module_call, &tracing_state))
    return NULL;
  ModuleCall* self = (ModuleCall*)type->tp_alloc(type, 0);
  if (!self) return NULL;
#define MC_SET(name) \
  Py_INCREF(name);   \
  self->name = name;
  MC_OBJECTS(MC_SET)
#undef MC_SET
  self->vectorcall = modulecall_call;
  return (PyObject*)self;
}

/* As a class attribute read from an instance: a bound method, like a function's. */
static PyObject* modulecall_get(PyObject* self, PyObject* obj, PyObject* type) {
  if (!obj || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

/* What inspect and repr read from a function: the Python __call__ it stands for. */
static PyMemberDef modulecall_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(ModuleCall, general), READONLY, NULL}, {NULL}};

static PyObject* modulecall_general_attr(ModuleCall* self, void* name) {
  return PyObject_GetAttrString(self->general, (const char*)name);
}

static PyGetSetDef modulecall_getset[] = {
    {"__name__", (getter)modulecall_general_attr, NULL, NULL, "__name__"},
    {"__qualname__", (getter)modulecall_general_attr, NULL, NULL, "__qualname__"},
    {"__module__", (getter)modulecall_general_attr, NULL, NULL, "__module__"},
    {NULL}};

AS_GC_SLOTS(modulecall, ModuleCall, MC_OBJECTS)

static PyTypeObject ModuleCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_anyshape_fastcall.ModuleCall",
    .tp_basicsize = sizeof(ModuleCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "OptimizedModule.__call__: the module's TorchCall when nothing needs nn.Module's "
              "call path, else general(self, *args, **kwargs).",
    .tp_new = modulecall_new,
    .tp_dealloc = (destructor)modulecall_dealloc,
    .tp_traverse = (traverseproc)modulecall_traverse,
    .tp_clear = (inquiry)modulecall_clear,
    .tp_descr_get = modulecall_get,
    .tp_members = modulecall_members,
    .tp_getset = modulecall_getset,
    .tp_vectorcall_offset = offsetof(ModuleCall, vectorcall),
    .tp_call = PyVectorcall_Call,
};
