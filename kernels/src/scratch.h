// Per-thread scratch memory that only grows, so a kernel call allocates nothing once warm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ef {

// slot picks one of a few independent buffers of the calling thread.
inline float* scratch_floats(size_t n, int slot = 0) {
  thread_local std::vector<float> bufs[4];
  std::vector<float>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// Splits [0, n) into `parts` nearly equal ranges; returns range i.
inline void split_range(int64_t n, int64_t parts, int64_t i, int64_t* begin, int64_t* end) {
  const int64_t base = n / parts, extra = n % parts;
  *begin = i * base + (i < extra ? i : extra);
  *end = *begin + base + (i < extra ? 1 : 0);
}

}  // namespace ef
