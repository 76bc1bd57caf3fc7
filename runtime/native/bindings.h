// Registers the native engine class on the extension module (called from its init function).
#pragma once

#include <nanobind/nanobind.h>

namespace ef::engine {
void register_engine(nanobind::module_& m);
}
