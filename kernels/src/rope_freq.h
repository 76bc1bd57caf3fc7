// The inverse frequencies of one set of RoPE parameters. rope() rotates queries and keys with them
// and the kivi2 cache rotates its unrotated keys back on read with them: both must turn a position
// through the same angles, so both make them here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "edgeflash/kernels.h"

namespace ef {

struct RopeFrequencies {
  int64_t rot_dim = -1;  // -1: not made yet
  float theta = 0.0f, scale = 0.0f;
  std::vector<float> factors;
  std::vector<double> inv_freq;  // [rot_dim / 2]

  bool made_from(const RopeParams& p) const {
    const int64_t half = p.rot_dim / 2;
    return rot_dim == p.rot_dim && theta == p.theta_base && scale == p.linear_scale &&
           factors.size() == static_cast<size_t>(p.freq_factors ? half : 0) &&
           (!p.freq_factors || std::equal(factors.begin(), factors.end(), p.freq_factors));
  }

  void make(const RopeParams& p) {
    const int64_t half = p.rot_dim / 2;
    rot_dim = p.rot_dim, theta = p.theta_base, scale = p.linear_scale;
    factors.assign(p.freq_factors, p.freq_factors ? p.freq_factors + half : p.freq_factors);
    inv_freq.resize(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      double f = std::pow(static_cast<double>(p.theta_base), -2.0 * static_cast<double>(i) / static_cast<double>(p.rot_dim));
      if (p.freq_factors) f /= p.freq_factors[i];
      inv_freq[i] = f / p.linear_scale;
    }
  }
};

}  // namespace ef
