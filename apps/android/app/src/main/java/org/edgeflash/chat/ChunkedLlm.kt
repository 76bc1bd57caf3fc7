package org.edgeflash.chat

import org.edgeflash.llm.ChatFormat
import org.edgeflash.llm.ChunkChain
import org.edgeflash.llm.ChunkSchedule
import org.edgeflash.llm.GenerationStats
import org.edgeflash.llm.Generator
import org.edgeflash.llm.Manifest
import org.edgeflash.llm.Message
import org.edgeflash.llm.Sampler
import org.edgeflash.llm.SamplingParams
import org.edgeflash.llm.tokenizer.Tokenizer
import java.io.File

/**
 * A chunked ExecuTorch export (`edgeflash export ... --target executorch --chunks N`) as one
 * chat model: reads manifest.json and tokenizer.json, plans which chunks stay loaded within
 * `budgetBytes` (the rest are loaded for each pass and released after it; that needs an export
 * with --kv io), and chains the chunks' `Module`s for prefill and decode.
 */
class ChunkedLlm private constructor(
    val dir: File,
    val manifest: Manifest,
    val tokenizer: Tokenizer,
    private val chain: ChunkChain,
) : AutoCloseable {
    private val generator = Generator(chain, tokenizer)
    val schedule: ChunkSchedule get() = chain.schedule

    /** Reply to `messages`, streaming text to `onText`. Earlier turns stay in the KV cache. */
    fun chat(messages: List<Message>, maxTokens: Int, params: SamplingParams, onText: (String) -> Unit): GenerationStats {
        val prompt = tokenizer.encode(ChatFormat.render(tokenizer.chatFormat, messages))
        return generator.generate(prompt, maxTokens, Sampler(params), onText).second
    }

    fun reset() = generator.reset()

    /** Chunk loads so far (a streamed chunk counts on every pass) and forward passes. */
    val loads: Int get() = chain.loads
    val passes: Int get() = chain.passes

    override fun close() = chain.close()

    companion object {
        fun open(dir: File, budgetBytes: Long, threads: Int): ChunkedLlm {
            val manifest = Manifest.read(dir)
            require(manifest.target == "executorch") { "${dir}: target is ${manifest.target}; this app runs ExecuTorch exports" }
            val tokFile = File(dir, manifest.tokenizerFile)
            val tokenizer = Tokenizer.fromFile(tokFile)
            // The tokenizer's tables take about twice its JSON size once built.
            val schedule = ChunkSchedule.plan(manifest, budgetBytes, 2 * tokFile.length())
            val chain = ChunkChain(manifest, { chunk -> ExecuTorchChunk(dir, chunk, threads) }, schedule)
            return ChunkedLlm(dir, manifest, tokenizer, chain)
        }
    }
}
