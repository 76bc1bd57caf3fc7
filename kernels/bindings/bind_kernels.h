// Registers the kernel functions on the _native module (called by its composition root).
#pragma once

#include <nanobind/nanobind.h>

namespace ef {
void bind_kernels(nanobind::module_& m);
}
