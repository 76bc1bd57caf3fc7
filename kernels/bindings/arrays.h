// Array helpers shared by every binding file of the _native module: typed, checked views of the
// numpy arrays Python passes. Each check raises KernelError (ValueError in Python), so no call can
// reach native code with a buffer too small, misaligned or of the wrong type.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "edgeflash/kernels.h"

namespace ef::bind {

namespace nb = nanobind;
// Inputs may be read-only (e.g. a memory-mapped GGUF file); outputs must be writable.
using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;

inline Format fmt_of(const std::string& name) {
  Format f;
  if (!parse_format(name, &f)) throw KernelError("unknown weight format '" + name + "'");
  return f;
}

inline Activation act_of(const std::string& name) {
  if (name == "silu") return Activation::silu;
  if (name == "gelu_tanh") return Activation::gelu_tanh;
  throw KernelError("unknown activation '" + name + "', expected silu or gelu_tanh");
}

template <class A>
size_t nbytes(const A& a) { return a.size() * a.itemsize(); }

template <class A>
bool c_contiguous(const A& a) {
  if (a.size() == 0) return true;
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

// Returns a typed pointer after checking dtype, contiguity, alignment and element count.
template <class T, class A>
T* ptr(const A& a, size_t need, const char* name) {
  if (a.dtype() != nb::dtype<T>()) throw KernelError(std::string(name) + " has the wrong dtype");
  if (!c_contiguous(a)) throw KernelError(std::string(name) + " must be C-contiguous");
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(T))
    throw KernelError(std::string(name) + " is not aligned to " + std::to_string(alignof(T)) + " bytes");
  if (a.size() < need)
    throw KernelError(std::string(name) + " holds " + std::to_string(a.size()) + " elements, need " +
                      std::to_string(need));
  return static_cast<T*>(const_cast<void*>(static_cast<const void*>(a.data())));
}

// The same, requiring exactly `count` elements.
template <class T, class A>
const T* exact(const A& a, size_t count, const char* name) {
  if (a.size() != count)
    throw KernelError(std::string(name) + " has " + std::to_string(a.size()) + " elements, expected " +
                      std::to_string(count));
  return ptr<T>(a, count, name);
}

// Raw bytes of any contiguous array (weights and caches may come as uint8, float16 or float32).
template <class A>
const uint8_t* bytes(const A& a, const char* name) {
  if (!c_contiguous(a)) throw KernelError(std::string(name) + " must be C-contiguous");
  return static_cast<const uint8_t*>(static_cast<const void*>(a.data()));
}

}  // namespace ef::bind
