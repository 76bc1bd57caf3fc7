// Scalar decoding of every quantized format into 32-element units: element k of a unit is
//   w = a[h] * (c[k] - o) + b[h],  h = k / 16 (the half; q6_k and q3_k have two different halves).
// This one description feeds the reference GEMM, the reference dequantizer and the tests.
#pragma once

#include <cstdint>
#include <cstring>

#include "edgeflash/formats.h"

namespace ef::ref {

struct Unit {
  int32_t c[32];
  int32_t o;
  float a[2], b[2];
};

// Unpacks the 6-bit scale and minimum of sub-block j of a q4_k super-block.
inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The signed 6-bit scale k (0..15) of a q3_k super-block from its 12 scale bytes: the low 4 bits
// are nibble k / 8 of byte k % 8, the high 2 bits are bits 2 (k / 4) of byte 8 + k % 4; stored
// with an offset of 32.
inline int q3k_scale(const uint8_t* s, int k) {
  const int low = (s[k % 8] >> (4 * (k / 8))) & 15;
  const int high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Calls fn(const Unit&) for each of the cols / 32 units of one row, in order.
template <class Fn>
void for_each_unit(Format f, const uint8_t* row, int64_t cols, Fn&& fn) {
  Unit u;
  const int64_t n_units = cols / 32;
  switch (f) {
    case Format::q8_0:
      for (int64_t b = 0; b < n_units; ++b, row += 34) {
        const float d = load_fp16(row);
        for (int k = 0; k < 32; ++k) u.c[k] = static_cast<int8_t>(row[2 + k]);
        u.o = 0, u.a[0] = u.a[1] = d, u.b[0] = u.b[1] = 0.0f;
        fn(u);
      }
      break;
    case Format::q4_0:
      for (int64_t b = 0; b < n_units; ++b, row += 18) {
        const float d = load_fp16(row);
        for (int k = 0; k < 16; ++k) u.c[k] = row[2 + k] & 15, u.c[k + 16] = row[2 + k] >> 4;
        u.o = 8, u.a[0] = u.a[1] = d, u.b[0] = u.b[1] = 0.0f;
        fn(u);
      }
      break;
    case Format::q4_1:
      for (int64_t b = 0; b < n_units; ++b, row += 20) {
        const float d = load_fp16(row), m = load_fp16(row + 2);
        for (int k = 0; k < 16; ++k) u.c[k] = row[4 + k] & 15, u.c[k + 16] = row[4 + k] >> 4;
        u.o = 0, u.a[0] = u.a[1] = d, u.b[0] = u.b[1] = m;
        fn(u);
      }
      break;
    case Format::q5_0:
      for (int64_t b = 0; b < n_units; ++b, row += 22) {
        const float d = load_fp16(row);
        uint32_t qh;
        std::memcpy(&qh, row + 2, 4);
        for (int k = 0; k < 16; ++k) {
          u.c[k] = (row[6 + k] & 15) | (((qh >> k) & 1) << 4);
          u.c[k + 16] = (row[6 + k] >> 4) | (((qh >> (k + 16)) & 1) << 4);
        }
        u.o = 16, u.a[0] = u.a[1] = d, u.b[0] = u.b[1] = 0.0f;
        fn(u);
      }
      break;
    case Format::q4_k:
      for (int64_t b = 0; b < n_units / 8; ++b, row += 144) {
        const float d = load_fp16(row), dmin = load_fp16(row + 2);
        const uint8_t* scales = row + 4;
        const uint8_t* qs = row + 16;
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          q4k_scale_min(scales, j, &sc, &m);
          const uint8_t* q = qs + 32 * (j / 2);
          for (int k = 0; k < 32; ++k) u.c[k] = (j & 1) ? (q[k] >> 4) : (q[k] & 15);
          u.o = 0, u.a[0] = u.a[1] = d * sc, u.b[0] = u.b[1] = -(dmin * m);
          fn(u);
        }
      }
      break;
    case Format::q6_k:
      for (int64_t b = 0; b < n_units / 8; ++b, row += 210) {
        const uint8_t* ql = row;
        const uint8_t* qh = row + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192);
        const float d = load_fp16(row + 208);
        for (int half = 0; half < 2; ++half) {
          for (int v = 0; v < 4; ++v) {
            for (int k = 0; k < 32; ++k) {
              const int lo = (ql[64 * half + k + 32 * (v & 1)] >> (4 * (v >> 1))) & 15;
              const int hi = (qh[32 * half + k] >> (2 * v)) & 3;
              u.c[k] = lo | (hi << 4);
            }
            u.o = 32;
            u.a[0] = d * sc[8 * half + 2 * v];
            u.a[1] = d * sc[8 * half + 2 * v + 1];
            u.b[0] = u.b[1] = 0.0f;
            fn(u);
          }
        }
      }
      break;
    case Format::q3_k:
      // hmask[32] (bit 4h + j: the high bit of unit j of half h), qs[64] (2-bit fields, half h in
      // bytes 32h..32h+31, unit j in bits 2j..2j+1), 12 scale bytes, d; codes 0..7 with offset 4.
      for (int64_t b = 0; b < n_units / 8; ++b, row += 110) {
        const uint8_t* hmask = row;
        const uint8_t* qs = row + 32;
        const float d = load_fp16(row + 108);
        for (int half = 0; half < 2; ++half) {
          for (int j = 0; j < 4; ++j) {
            for (int k = 0; k < 32; ++k) {
              const int low = (qs[32 * half + k] >> (2 * j)) & 3;
              const int high = (hmask[k] >> (4 * half + j)) & 1;
              u.c[k] = low | (high << 2);
            }
            u.o = 4;
            u.a[0] = d * static_cast<float>(q3k_scale(row + 96, 8 * half + 2 * j));
            u.a[1] = d * static_cast<float>(q3k_scale(row + 96, 8 * half + 2 * j + 1));
            u.b[0] = u.b[1] = 0.0f;
            fn(u);
          }
        }
      }
      break;
    case Format::q4_lut: {
      const float scale = load_f32(row);
      const int8_t* levels = reinterpret_cast<const int8_t*>(row + 4);
      row += 20;
      for (int64_t b = 0; b < n_units; ++b, row += 17) {
        const uint8_t* q = row + 1;
        for (int k = 0; k < 16; ++k) u.c[k] = levels[q[k] & 15], u.c[k + 16] = levels[q[k] >> 4];
        const float code = static_cast<float>(row[0]);
        u.o = 0, u.a[0] = u.a[1] = scale * (code * code), u.b[0] = u.b[1] = 0.0f;
        fn(u);
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace ef::ref
