#include "edgeflash/formats.h"

namespace ef {

namespace {
// Indexed by Format. Block sizes and bytes are the GGML ones; q4_lut adds a 20-byte row header.
const FormatInfo kFormats[kFormatCount] = {
    {"f32", 0, 1, 4, 0, false},      {"f16", 1, 1, 2, 0, false},      {"q8_0", 8, 32, 34, 0, true},
    {"q4_0", 2, 32, 18, 0, true},    {"q4_1", 3, 32, 20, 0, true},    {"q5_0", 6, 32, 22, 0, true},
    {"q4_k", 12, 256, 144, 0, true}, {"q6_k", 14, 256, 210, 0, true},
    {"q4_lut", -1, 32, kQ4LutBlockBytes, kQ4LutHeaderBytes, true},
    {"bf16", 30, 1, 2, 0, false},    {"q5_1", 7, 32, 24, 0, true},    {"q2_k", 10, 256, 84, 0, true},
    {"q3_k", 11, 256, 110, 0, true}, {"q5_k", 13, 256, 176, 0, true},
    {"kivi2", -1, 32, 12, 0, true},  // a value row of the KV cache: per 32 values f16 scale, f16 min, 2-bit codes
};
}  // namespace

const FormatInfo& format_info(Format f) {
  const int i = static_cast<int>(f);
  if (i < 0 || i >= kFormatCount) throw KernelError("unknown weight format id " + std::to_string(i));
  return kFormats[i];
}

bool parse_format(const std::string& name, Format* out) {
  for (int i = 0; i < kFormatCount; ++i) {
    if (name == kFormats[i].name) {
      *out = static_cast<Format>(i);
      return true;
    }
  }
  return false;
}

void check_cols(Format f, int64_t cols, const char* what) {
  const FormatInfo& info = format_info(f);
  if (cols <= 0 || cols % info.block_elems != 0)
    throw KernelError(std::string(what) + ": format " + info.name + " needs a positive multiple of " +
                      std::to_string(info.block_elems) + " columns, got " + std::to_string(cols));
}

size_t row_bytes(Format f, int64_t cols) {
  check_cols(f, cols, "row_bytes");
  const FormatInfo& info = format_info(f);
  return static_cast<size_t>(info.row_header) +
         static_cast<size_t>(cols / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

}  // namespace ef
