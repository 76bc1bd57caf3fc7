// The composition root of the _native extension module: the one place that knows every native
// layer. Kernels, then the flash-streaming types, then the engine register their bindings, in
// the order they depend on each other (each may use the types the ones before it bound).
#include <nanobind/nanobind.h>

#include "bind_engine.h"
#include "bind_kernels.h"
#include "bind_memory.h"
#include "edgeflash/kernels.h"

NB_MODULE(_native, m) {
  m.attr("__version__") = "0.1.0";
  m.doc() = "edgeflash native code: kernels, flash streaming and the engine (use the Python wrappers)";
  ef::bind_kernels(m);
  ef::memory::bind_memory(m);
  ef::engine::bind_engine(m);
}
