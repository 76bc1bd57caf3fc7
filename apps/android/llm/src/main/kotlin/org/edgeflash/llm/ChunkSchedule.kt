package org.edgeflash.llm

/**
 * Which chunks stay loaded and which are loaded for each pass and released after it, so that
 * everything the app holds fits one byte budget.
 *
 * Held at once: the resident chunks, one streamed chunk (the largest, since any may be the one
 * loaded), the KV caches (with kv = "io" the app holds them; with "state" they live inside the
 * chunk programs, so they count with their chunk), the hidden state of a prefill pass, the
 * logits and the tokenizer. Streaming works only with kv = "io": a chunk that keeps its cache
 * inside cannot be released between passes.
 */
data class ChunkSchedule(
    val resident: List<Int>,
    val streamed: List<Int>,
    val budgetBytes: Long,
    val fixedBytes: Long,
    val peakBytes: Long,
    /** Chunk bytes read from storage on every forward pass (0 when everything is resident). */
    val bytesLoadedPerPass: Long = 0,
) {
    fun isResident(index: Int): Boolean = index in resident

    companion object {
        /** Bytes held besides the chunks: caches, activations, logits, tokenizer. */
        fun fixedBytes(m: Manifest, tokenizerBytes: Long): Long {
            val caches = if (m.cache.mode == "io") 2L * m.nLayers * m.cache.layerBytes else 0L
            val hidden = 2L * m.prefillTokens * m.dModel * 4 // the input and output of a chunk pass
            val logits = m.vocabSize.toLong() * 4 * 2 // the logits and the sampler's working copy
            return caches + hidden + logits + tokenizerBytes
        }

        /** Bytes a chunk holds while loaded: its file, plus its cache when the cache lives inside. */
        fun chunkBytes(m: Manifest, c: ChunkInfo): Long =
            c.bytes + if (m.cache.mode == "state") 2L * (c.layerStop - c.layerStart) * m.cache.layerBytes else 0L

        /** The smallest budget that works: everything resident for kv = state, else the fixed
         *  bytes and the largest chunk. */
        fun minimumBytes(m: Manifest, tokenizerBytes: Long): Long {
            val sizes = m.chunks.map { chunkBytes(m, it) }
            return fixedBytes(m, tokenizerBytes) + if (m.cache.mode == "state") sizes.sum() else sizes.max()
        }

        /**
         * The schedule that reads the fewest chunk bytes per pass within `budgetBytes`, or an
         * IllegalArgumentException naming the minimum budget. Exact search: exports have a
         * handful of chunks (at most one per layer), so 2^N subsets stay cheap up to N = 20.
         */
        fun plan(m: Manifest, budgetBytes: Long, tokenizerBytes: Long): ChunkSchedule {
            val fixed = fixedBytes(m, tokenizerBytes)
            val sizes = m.chunks.map { chunkBytes(m, it) }
            val minimum = minimumBytes(m, tokenizerBytes)
            if (budgetBytes < minimum) {
                val why = if (m.cache.mode == "state") "every chunk resident (kv = state keeps the cache inside the chunks; export with --kv io to stream them)"
                else "the largest chunk loaded alone"
                throw IllegalArgumentException("memory budget ${mib(budgetBytes)} is too small: the minimum is ${mib(minimum)} ($why)")
            }
            val n = sizes.size
            if (m.cache.mode == "state" || fixed + sizes.sum() <= budgetBytes) {
                return ChunkSchedule((0 until n).toList(), emptyList(), budgetBytes, fixed, fixed + sizes.sum())
            }
            require(n <= 20) { "$n chunks: too many to schedule (at most 20)" }
            var best = -1
            var bestStreamed = Long.MAX_VALUE
            var bestPeak = 0L
            for (mask in 0 until (1 shl n)) { // bit i set: chunk i resident
                var resident = 0L
                var streamed = 0L
                var largestStreamed = 0L
                for (i in 0 until n) {
                    if (mask and (1 shl i) != 0) resident += sizes[i]
                    else { streamed += sizes[i]; largestStreamed = maxOf(largestStreamed, sizes[i]) }
                }
                val peak = fixed + resident + largestStreamed
                if (peak <= budgetBytes && streamed < bestStreamed) { best = mask; bestStreamed = streamed; bestPeak = peak }
            }
            val resident = (0 until n).filter { best and (1 shl it) != 0 }
            val streamed = (0 until n).filter { best and (1 shl it) == 0 }
            return ChunkSchedule(resident, streamed, budgetBytes, fixed, bestPeak, bestStreamed)
        }

        fun mib(bytes: Long): String = String.format("%.1f MiB", bytes / 1048576.0)
    }
}
