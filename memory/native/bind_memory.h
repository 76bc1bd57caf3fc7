// Registers the flash-streaming types on the _native module (called by its composition root).
#pragma once

#include <nanobind/nanobind.h>

namespace ef::memory {
void bind_memory(nanobind::module_& m);
}
