// The kivi2 KV cache (kernels.h: KvCache): writing positions, sealing blocks into the 2-bit store,
// and reading slots back as the f16 vectors the attention chunk kernels take.
#pragma once

#include <cstdint>

#include "edgeflash/kernels.h"

namespace ef::kivi {

// kv_write for a kivi2 cache (arguments already checked against the capacity).
void write(const KvCache& c, const float* k, const float* v, int64_t n, const int32_t* slots, const int32_t* positions);
// Slots [j0, j0 + count) of KV head g as f16 [count, head_dim] keys and values (zeros for empty slots).
void rows_f16(const KvCache& c, int64_t g, int64_t j0, int64_t count, uint16_t* k, uint16_t* v);
void check(const KvCache& c, const char* what);

}  // namespace ef::kivi
