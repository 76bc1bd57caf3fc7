package org.edgeflash.llm

import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.FloatBuffer

/**
 * The app-held caches of a kv = "io" export: per layer one K and one V buffer [Hkv, L, D]
 * (float32, entry of position p at index p of the L axis). Buffers are direct, so the
 * ExecuTorch tensors that wrap them share the memory instead of copying it on every pass.
 */
class KvCache(val nLayers: Int, val heads: Int, val length: Int, val headDim: Int) {
    val k: Array<FloatBuffer> = Array(nLayers) { direct(heads * length * headDim) }
    val v: Array<FloatBuffer> = Array(nLayers) { direct(heads * length * headDim) }

    /** Write the first `real` of the returned new entries `fresh` [Hkv, T, D] at positions pos..pos+real. */
    fun write(cache: FloatBuffer, fresh: FloatBuffer, tokens: Int, pos: Int, real: Int) {
        require(pos + real <= length) { "cache write at $pos + $real past the cache length $length" }
        require(fresh.capacity() >= heads * tokens * headDim) { "new entries hold ${fresh.capacity()} values, expected ${heads * tokens * headDim}" }
        for (h in 0 until heads) {
            for (t in 0 until real) {
                val src = (h * tokens + t) * headDim
                val dst = (h * length + pos + t) * headDim
                for (d in 0 until headDim) cache.put(dst + d, fresh.get(src + d))
            }
        }
    }

    companion object {
        fun direct(n: Int): FloatBuffer = ByteBuffer.allocateDirect(n * 4).order(ByteOrder.nativeOrder()).asFloatBuffer()

        fun forManifest(m: Manifest): KvCache {
            val s = m.cache.shape
            return KvCache(m.nLayers, s[0].toInt(), s[1].toInt(), s[2].toInt())
        }
    }
}
