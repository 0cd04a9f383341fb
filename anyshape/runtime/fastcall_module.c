/* anyshape runtime: the fast-call extension's module definition (built last,
 * after fastcall.c, plugin/torchcall.c and plugin/modulecall.c; see runtime/fastcall.py).
 * ``source_digest`` names the sources it was built from, so a module installed with the
 * package is used only while those sources are unchanged. */

#ifndef ANYSHAPE_FASTCALL_DIGEST
#define ANYSHAPE_FASTCALL_DIGEST ""
#endif

static PyMethodDef methods[] = {
    {"call", call, METH_VARARGS, "Run one compiled graph on NumPy arrays."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_anyshape_fastcall", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit__anyshape_fastcall(void) {
  import_array();
  if (PyType_Ready(&TorchCallType) < 0 || PyType_Ready(&ModuleCallType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (!m) return NULL;
  if (PyModule_AddType(m, &TorchCallType) < 0 || PyModule_AddType(m, &ModuleCallType) < 0 ||
      PyModule_AddStringConstant(m, "source_digest", ANYSHAPE_FASTCALL_DIGEST) < 0 ||
      PyModule_AddIntConstant(m, "torchcall_max", TC_MAX) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
