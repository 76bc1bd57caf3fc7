// Registers the native engine and its structs on the _native module (called by its composition root).
#pragma once

#include <nanobind/nanobind.h>

namespace ef::engine {
void bind_engine(nanobind::module_& m);
}
