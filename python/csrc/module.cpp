// The Python module perftrain._C. Importing it loads this library, whose
// static registrations (TORCH_LIBRARY_FRAGMENT in ops_*.cpp and the other
// files of this folder) put the perftrain:: operators into the dispatcher;
// the module itself holds nothing: Python reaches the ops as
// torch.ops.perftrain.* (python/perftrain/ops.py).
#include <Python.h>

namespace {

PyModuleDef module_def = {PyModuleDef_HEAD_INIT,
                          "_C",
                          "perftrain's custom operators (registered on import as torch.ops.perftrain.*)",
                          -1,
                          nullptr,
                          nullptr,
                          nullptr,
                          nullptr,
                          nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }
