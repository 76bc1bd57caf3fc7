// Extension point of the _native module: other C++ code of this repo (the native engine) is
// compiled into the same module by adding its sources to the `_native` target
//   target_sources(_native PRIVATE ...) ; target_link_libraries(_native PRIVATE ...)
// and registers its Python bindings by defining this function (a weak no-op default exists).
#pragma once

#include <nanobind/nanobind.h>

void ef_bind_extensions(nanobind::module_& m);
