package org.edgeflash.llm

import java.nio.FloatBuffer
import java.nio.LongBuffer

/** A tensor on the host side of a chunk call: float32 or int64 data with its shape. */
sealed class HostTensor(val shape: LongArray) {
    class F32(shape: LongArray, val data: FloatBuffer) : HostTensor(shape)
    class I64(shape: LongArray, val data: LongBuffer) : HostTensor(shape)

    val size: Int get() = shape.fold(1L) { a, d -> a * d }.toInt()
}

/** One loaded chunk file; `run` calls one of its methods ("prefill" or "decode"). */
interface ChunkProgram : AutoCloseable {
    fun run(method: String, inputs: List<HostTensor>): List<HostTensor>
}

/** Opens a chunk file (ExecuTorch `Module` on Android, Core ML on iOS, anything on a JVM). */
fun interface ChunkOpener {
    fun open(chunk: ChunkInfo): ChunkProgram
}

/**
 * The chunks of an export chained into one model, as export/targets/runner.py does it: token
 * ids into the first chunk, the hidden state [T, d_model] from each chunk to the next, logits
 * [1, vocab] of the last real token out of the head; the app writes each chunk's new cache
 * entries (kv = "io"), or the chunks keep them (kv = "state"). Streamed chunks are opened right
 * before their turn and closed right after it.
 */
class ChunkChain(val manifest: Manifest, private val opener: ChunkOpener, val schedule: ChunkSchedule) : AutoCloseable {
    private val open = arrayOfNulls<ChunkProgram>(manifest.chunks.size)
    val cache: KvCache? = if (manifest.cache.mode == "io") KvCache.forManifest(manifest) else null
    var pos = 0
        private set
    /** Counters the app shows: chunk loads (streamed ones count every pass) and passes run. */
    var loads = 0
        private set
    var passes = 0
        private set

    init {
        require(manifest.cache.mode == "io" || schedule.streamed.isEmpty()) { "kv = state chunks cannot be streamed" }
        for (i in schedule.resident) program(i)
    }

    private fun program(i: Int): ChunkProgram {
        open[i]?.let { return it }
        val p = opener.open(manifest.chunks[i])
        loads++
        if (schedule.isResident(i)) open[i] = p
        return p
    }

    /** Start a new sequence. Stale cache slots need no clearing: the chunk's mask hides every
     *  slot at or after the first new position until it is written again. */
    fun reset() { pos = 0 }

    /** Keep the first `length` positions and continue from there (the same masking makes it safe). */
    fun rewind(length: Int) {
        require(length in 0..pos) { "rewind to $length: only $pos positions are cached" }
        pos = length
    }

    /** Append `ids`; returns the logits [vocab] after the last one. */
    fun feed(ids: IntArray): FloatArray {
        var logits: FloatArray? = null
        var i = 0
        for (pass in feedPlan(pos, ids.size, manifest.prefillTokens, manifest.cache.length, manifest.staticShapes)) {
            val tokens = LongArray(pass.width) // padding slots hold token 0 and only write slots not yet in use
            for (t in 0 until pass.real) tokens[t] = ids[i + t].toLong()
            logits = call(pass, tokens)
            i += pass.real
        }
        return logits!!
    }

    private fun call(pass: Pass, tokens: LongArray): FloatArray {
        val width = pass.width
        val positions = LongArray(width) { (pass.pos + it).toLong() }
        var x: HostTensor = HostTensor.I64(longArrayOf(width.toLong()), LongBuffer.wrap(tokens))
        for ((i, chunk) in manifest.chunks.withIndex()) {
            val inputs = ArrayList<HostTensor>()
            inputs.add(x)
            inputs.add(HostTensor.I64(longArrayOf(width.toLong()), LongBuffer.wrap(positions)))
            if (chunk.head) inputs.add(HostTensor.I64(longArrayOf(1), LongBuffer.wrap(longArrayOf((pass.real - 1).toLong()))))
            val cacheShape = manifest.cache.shape.toLongArray()
            if (cache != null) for (layer in chunk.layers) {
                inputs.add(HostTensor.F32(cacheShape, cache.k[layer]))
                inputs.add(HostTensor.F32(cacheShape, cache.v[layer]))
            }
            val program = program(i)
            val outputs = try { program.run(pass.method, inputs) } finally { if (!schedule.isResident(i)) program.close() }
            val expected = 1 + if (cache != null) 2 * (chunk.layerStop - chunk.layerStart) else 0
            check(outputs.size == expected) { "chunk ${chunk.file} ${pass.method} returned ${outputs.size} outputs, expected $expected" }
            x = outputs[0]
            if (cache != null) for ((j, layer) in chunk.layers.withIndex()) {
                cache.write(cache.k[layer], (outputs[1 + 2 * j] as HostTensor.F32).data, width, pass.pos, pass.real)
                cache.write(cache.v[layer], (outputs[2 + 2 * j] as HostTensor.F32).data, width, pass.pos, pass.real)
            }
        }
        passes++
        pos += pass.real
        val out = (x as? HostTensor.F32 ?: error("the head returned ${x.javaClass.simpleName}, expected float logits")).data
        return FloatArray(out.capacity()) { out.get(it) }
    }

    override fun close() {
        for (i in open.indices) { open[i]?.close(); open[i] = null }
    }
}
