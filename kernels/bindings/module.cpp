#include <nanobind/nanobind.h>

NB_MODULE(_native, m) {
  m.attr("__version__") = "0.1.0";
}
