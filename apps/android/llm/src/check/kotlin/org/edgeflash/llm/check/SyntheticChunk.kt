package org.edgeflash.llm.check

import org.edgeflash.llm.ChunkInfo
import org.edgeflash.llm.ChunkProgram
import org.edgeflash.llm.HostTensor
import org.edgeflash.llm.KvCache
import org.edgeflash.llm.Manifest
import java.nio.LongBuffer

/**
 * A chunk program computed by a fixed formula, so that the Kotlin chain and the Python runner
 * (export/targets/runner.py, driven with the same formula by tests/apps/test_android_logic.py)
 * can be compared call by call on a JVM where no ExecuTorch runtime exists. The formula reads
 * the previous position's cache entry, so a cache entry the chain failed to write shows up in
 * every later output.
 */
class SyntheticChunk(private val m: Manifest, private val chunk: ChunkInfo, private val trace: MutableList<List<Any>>) : ChunkProgram {
    override fun run(method: String, inputs: List<HostTensor>): List<HostTensor> {
        val x = inputs[0]
        val pos = (inputs[1] as HostTensor.I64).data
        val width = pos.capacity()
        val d = m.dModel
        var next = 2
        val last = if (chunk.head) (inputs[next++] as HostTensor.I64).data.get(0).toInt() else -1
        trace.add(listOf(chunk.index, method, pos.get(0), width, last))
        val hidden = FloatArray(width * d)
        for (t in 0 until width) for (j in 0 until d) {
            hidden[t * d + j] = if (chunk.embedding) (x as HostTensor.I64).data.get(t).toFloat() * 0.001f + j.toFloat() * 0.01f
            else (x as HostTensor.F32).data.get(t * d + j) + 1.0f
        }
        val outputs = ArrayList<HostTensor>()
        val (heads, length, headDim) = m.cache.shape.map { it.toInt() }
        val fresh = ArrayList<HostTensor>()
        if (m.cache.mode == "io") for (layer in chunk.layers) for (kind in 0..1) {
            val cache = (inputs[next++] as HostTensor.F32).data
            val out = KvCache.direct(heads * width * headDim)
            for (h in 0 until heads) for (t in 0 until width) for (e in 0 until headDim) {
                val p = pos.get(t).toInt()
                val previous = if (p > 0 && p - 1 < length) cache.get((h * length + p - 1) * headDim + e) else 0.0f
                out.put((h * width + t) * headDim + e, p.toFloat() + layer * 10.0f + kind * 5.0f + h + e * 0.01f + previous * 0.5f)
            }
            fresh.add(HostTensor.F32(longArrayOf(heads.toLong(), width.toLong(), headDim.toLong()), out))
            // Fold the cache into the hidden state too, as attention does.
            for (t in 0 until width) hidden[t * d] += out.get(t * headDim) * 0.001f
        }
        if (chunk.head) {
            val logits = KvCache.direct(m.vocabSize)
            for (v in 0 until m.vocabSize) logits.put(v, hidden[last * d + v % d] + v.toFloat() * 1e-4f)
            outputs.add(HostTensor.F32(longArrayOf(1, m.vocabSize.toLong()), logits))
        } else {
            val buf = KvCache.direct(width * d)
            buf.put(hidden); buf.rewind()
            outputs.add(HostTensor.F32(longArrayOf(width.toLong(), d.toLong()), buf))
        }
        outputs.addAll(fresh)
        return outputs
    }

    override fun close() {}

    @Suppress("unused")
    private fun LongBuffer.toList(): List<Long> = List(capacity()) { get(it) }
}
