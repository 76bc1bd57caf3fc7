package org.edgeflash.llm

import org.edgeflash.llm.tokenizer.Tokenizer
import java.io.File

/**
 * A chunked export (`edgeflash export ... --chunks N`) as one chat model: reads manifest.json and
 * tokenizer.json, plans which chunks stay loaded within `budgetBytes` (the rest are loaded for
 * each pass and released after it; that needs an export with --kv io), and chains the chunk
 * programs `opener` opens. The app passes one that opens an ExecuTorch `Module`; everything else
 * lives here, in plain Kotlin, so it is compiled and run on a JVM without an Android SDK.
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
        /** Open the export in `dir`, whose manifest must name `target` ("executorch" in the app). */
        fun open(dir: File, target: String, budgetBytes: Long, opener: ChunkOpener): ChunkedLlm {
            val manifest = Manifest.read(dir)
            require(manifest.target == target) { "$dir: target is ${manifest.target}; this app runs $target exports" }
            val tokFile = File(dir, manifest.tokenizerFile)
            val tokenizer = Tokenizer.fromFile(tokFile)
            // The tokenizer's tables take about twice its JSON size once built.
            val schedule = ChunkSchedule.plan(manifest, budgetBytes, 2 * tokFile.length())
            return ChunkedLlm(dir, manifest, tokenizer, ChunkChain(manifest, opener, schedule))
        }
    }
}
