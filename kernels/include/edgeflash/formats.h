// Weight formats: names, block geometry and row sizes. A weight matrix [rows, cols] is stored
// row-major as `rows` rows of row_bytes(fmt, cols) bytes each (y = W @ x, like torch Linear).
// The GGML formats are bit-exact with GGUF files; q4_lut is edgeflash's own (docs/weight-formats.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ef {

// Every weight format a model file may hold. The ones after q4_lut are storage formats only: they
// are read from GGUF files and converted at load (the kernel table has no entry for them).
// kivi2 is a KV cache format only, never a weight (kernels.h: KvCache); Python's format table omits it.
enum class Format : int {
  f32 = 0, f16, q8_0, q4_0, q4_1, q5_0, q4_k, q6_k, q4_lut, bf16, q5_1, q2_k, q3_k, q5_k, kivi2, count
};
constexpr int kFormatCount = static_cast<int>(Format::count);

// q4_lut's row header (f32 row scale, 16 int8 levels) and block (scale code k, 16 nibble bytes):
// its entry in the format table, and the offsets its SIMD kernels address.
constexpr int kQ4LutHeaderBytes = 20, kQ4LutBlockBytes = 17;

// The one table of format geometry (formats.cpp); Python reads it through the bindings.
struct FormatInfo {
  const char* name;
  int ggml_type;     // GGML type id in GGUF files, -1 for edgeflash's own formats
  int block_elems;   // elements per block along a row
  int block_bytes;   // bytes per block
  int row_header;    // bytes before the first block of each row (q4_lut's level table)
  bool quantized;    // integer codes (runs on Q8 activations) rather than floats
};

const FormatInfo& format_info(Format f);
// Returns false when `name` is not a known format name.
bool parse_format(const std::string& name, Format* out);
// Throws std::invalid_argument when cols is not a positive multiple of the block size.
size_t row_bytes(Format f, int64_t cols);
void check_cols(Format f, int64_t cols, const char* what);

// Thrown for every bad argument; the Python bindings turn it into ValueError.
struct KernelError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// IEEE half <-> float, scalar (the SIMD paths have their own conversions).
inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even, like the hardware conversions (F16C, NEON) and numpy.
inline uint16_t f32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {                                              // subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// q3_k's 16 signed 6-bit scales from the 12 scale bytes of a super-block (as 3 little-endian
// words a0, a1, a2): bytes 0-3 of the result are the low nibbles of a0 with bit pairs 0-1 of a2
// on top, 4-7 those of a1 with bit pairs 2-3, 8-11 the high nibbles of a0 with bit pairs 4-5,
// 12-15 the high nibbles of a1 with bit pairs 6-7; each stored as scale + 32. The SIMD kernels
// decode the same words in registers; the scalar reference reads the bytes one by one instead.
inline void unpack_q3_k_scales(const uint8_t* s, int8_t out[16]) {
  uint32_t a[3];
  std::memcpy(a, s, 12);
  const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
  const uint32_t w[4] = {(a[0] & m4) | ((a[2] & m2) << 4), (a[1] & m4) | (((a[2] >> 2) & m2) << 4),
                         ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4), ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)};
  uint8_t b[16];
  std::memcpy(b, w, 16);
  for (int k = 0; k < 16; ++k) out[k] = static_cast<int8_t>(b[k] - 32);
}

inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

}  // namespace ef
