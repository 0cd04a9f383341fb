/* anyshape runtime: the fast-call extension's module definition (built last,
 * after fastcall.c and torchcall.c; see runtime/fastcall.py). */

static PyMethodDef methods[] = {
    {"call", call, METH_VARARGS, "Run one compiled graph on NumPy arrays."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_anyshape_fastcall", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit__anyshape_fastcall(void) {
  import_array();
  if (PyType_Ready(&TorchCallType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&TorchCallType);
  if (PyModule_AddObject(m, "TorchCall", (PyObject*)&TorchCallType) < 0) {
    Py_DECREF(&TorchCallType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
