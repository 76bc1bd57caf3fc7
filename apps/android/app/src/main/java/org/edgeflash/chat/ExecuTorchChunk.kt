package org.edgeflash.chat

import org.edgeflash.llm.ChunkInfo
import org.edgeflash.llm.ChunkProgram
import org.edgeflash.llm.HostTensor
import org.pytorch.executorch.DType
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor
import java.io.File
import java.nio.ByteOrder
import java.nio.FloatBuffer
import java.nio.LongBuffer

/**
 * One chunk `.pte` through ExecuTorch's Android `Module` (org.pytorch:executorch-android 1.5.1,
 * whose classes are Kotlin: tensor data is read through properties such as `dataAsFloatArray`).
 * Both methods ("prefill", "decode") live in the same program; each loads on first use. The
 * file is memory-mapped, so a chunk's weights are paged in from storage as they are read and
 * released with the module.
 */
class ExecuTorchChunk(dir: File, chunk: ChunkInfo, threads: Int) : ChunkProgram {
    private val module: Module = Module.load(File(dir, chunk.file).absolutePath, Module.LOAD_MODE_MMAP, threads)

    override fun run(method: String, inputs: List<HostTensor>): List<HostTensor> {
        val values = Array(inputs.size) { EValue.from(toTensor(inputs[it])) }
        // A failed load or run throws ExecutorchRuntimeException carrying the runtime's error code.
        val outputs = module.execute(method, *values)
        // Output tensors point into the method's own memory, which its next run overwrites: copy now.
        return outputs.map { fromTensor(it.toTensor()) }
    }

    override fun close() = module.close()

    private fun toTensor(t: HostTensor): Tensor = when (t) {
        // The KV caches are direct, native-order buffers of exactly the tensor's size: ExecuTorch
        // reads them in place. Anything else (the hidden state of the previous chunk) is copied.
        is HostTensor.F32 ->
            if (t.data.isDirect && t.data.order() == ByteOrder.nativeOrder() && t.data.capacity() == t.size) {
                Tensor.fromBlob(t.data, t.shape)
            } else {
                Tensor.fromBlob(FloatArray(t.size) { t.data.get(it) }, t.shape)
            }
        is HostTensor.I64 -> Tensor.fromBlob(LongArray(t.size) { t.data.get(it) }, t.shape)
    }

    private fun fromTensor(t: Tensor): HostTensor = when (t.dtype()) {
        DType.FLOAT -> HostTensor.F32(t.shape(), FloatBuffer.wrap(t.dataAsFloatArray))
        DType.INT64 -> HostTensor.I64(t.shape(), LongBuffer.wrap(t.dataAsLongArray))
        else -> error("unexpected output dtype ${t.dtype()} (the exporter writes float32 outputs)")
    }
}
