package org.edgeflash.chat

import org.edgeflash.llm.ChunkInfo
import org.edgeflash.llm.ChunkProgram
import org.edgeflash.llm.HostTensor
import org.pytorch.executorch.DType
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor
import java.io.File
import java.nio.FloatBuffer

/**
 * One chunk `.pte` through ExecuTorch's Android `Module`. Both methods ("prefill", "decode")
 * live in the same program; each loads on first use. The file is memory-mapped, so a chunk's
 * weights are paged in from storage as they are read and released with the module.
 */
class ExecuTorchChunk(dir: File, chunk: ChunkInfo, threads: Int) : ChunkProgram {
    private val module: Module = Module.load(File(dir, chunk.file).absolutePath, Module.LOAD_MODE_MMAP, threads)

    override fun run(method: String, inputs: List<HostTensor>): List<HostTensor> {
        val values = inputs.map { EValue.from(toTensor(it)) }.toTypedArray()
        val outputs = module.execute(method, *values)
        check(outputs.isNotEmpty()) { "ExecuTorch returned nothing for $method (see logcat tag ExecuTorch)" }
        return outputs.map { fromTensor(it.toTensor()) }
    }

    override fun close() = module.destroy()

    private fun toTensor(t: HostTensor): Tensor = when (t) {
        // KV caches are direct buffers already: ExecuTorch reads them in place.
        is HostTensor.F32 -> Tensor.fromBlob(if (t.data.isDirect) t.data else copyDirect(t.data), t.shape)
        is HostTensor.I64 -> Tensor.fromBlob(LongArray(t.data.capacity()) { t.data.get(it) }, t.shape)
    }

    private fun copyDirect(src: FloatBuffer): FloatBuffer {
        val dst = Tensor.allocateFloatBuffer(src.capacity())
        for (i in 0 until src.capacity()) dst.put(i, src.get(i))
        return dst
    }

    private fun fromTensor(t: Tensor): HostTensor = when (t.dtype()) {
        DType.FLOAT -> HostTensor.F32(t.shape(), FloatBuffer.wrap(t.getDataAsFloatArray()))
        DType.INT64 -> HostTensor.I64(t.shape(), java.nio.LongBuffer.wrap(t.getDataAsLongArray()))
        else -> error("unexpected output dtype ${t.dtype()}")
    }
}
