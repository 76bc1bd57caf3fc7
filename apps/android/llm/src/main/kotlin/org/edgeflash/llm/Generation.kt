package org.edgeflash.llm

import org.edgeflash.llm.tokenizer.StreamDecoder
import org.edgeflash.llm.tokenizer.Tokenizer

/** Numbers a reply reports, as `edgeflash generate --json` names them. */
data class GenerationStats(
    val promptTokens: Int,
    val reusedTokens: Int,
    val generatedTokens: Int,
    val prefillSeconds: Double,
    val decodeSeconds: Double,
    val stopReason: String, // "stop" (an end token), "length" (maxTokens) or "context" (cache full)
) {
    val prefillTokS: Double get() = if (prefillSeconds > 0) (promptTokens - reusedTokens) / prefillSeconds else 0.0
    val decodeTokS: Double get() = if (decodeSeconds > 0 && generatedTokens > 1) (generatedTokens - 1) / decodeSeconds else 0.0
}

/**
 * A conversation on a chunk chain: prefill the prompt, then decode token by token. The cache
 * keeps what was fed, so the next turn feeds only the ids after the longest common prefix.
 */
class Generator(val chain: ChunkChain, val tokenizer: Tokenizer) {
    private val fed = ArrayList<Int>() // the ids whose entries the cache holds, in order

    fun reset() { fed.clear(); chain.reset() }

    /** Generate after `prompt`; `onText` gets each settled piece of text; returns the ids and stats. */
    fun generate(prompt: IntArray, maxTokens: Int, sampler: Sampler, onText: (String) -> Unit = {}): Pair<IntArray, GenerationStats> {
        require(prompt.isNotEmpty()) { "the prompt has no tokens" }
        require(maxTokens >= 1) { "maxTokens = $maxTokens: expected >= 1" }
        val cacheLen = chain.manifest.cache.length
        require(prompt.size < cacheLen) { "the prompt has ${prompt.size} tokens; the cache holds $cacheLen" }
        // Reuse the cached prefix, but feed at least one token: its logits start the reply.
        var keep = 0
        while (keep < fed.size && keep < prompt.size - 1 && fed[keep] == prompt[keep]) keep++
        chain.rewind(keep)
        while (fed.size > keep) fed.removeAt(fed.size - 1)
        val t0 = System.nanoTime()
        var logits = chain.feed(prompt.copyOfRange(keep, prompt.size))
        prompt.copyOfRange(keep, prompt.size).forEach { fed.add(it) }
        val t1 = System.nanoTime()
        val history = ArrayList<Int>(prompt.toList())
        val out = ArrayList<Int>()
        val text = StreamDecoder(tokenizer)
        var reason = "length"
        while (true) {
            val id = sampler.sample(logits, history.toIntArray())
            out.add(id)
            history.add(id)
            if (id in tokenizer.eosIds) { reason = "stop"; break }
            text.add(id).takeIf { it.isNotEmpty() }?.let(onText)
            if (out.size >= maxTokens) break
            if (chain.pos >= cacheLen) { reason = "context"; break }
            logits = chain.feed(intArrayOf(id))
            fed.add(id)
        }
        text.finish().takeIf { it.isNotEmpty() }?.let(onText)
        val t2 = System.nanoTime()
        return out.toIntArray() to GenerationStats(prompt.size, keep, out.size, (t1 - t0) / 1e9, (t2 - t1) / 1e9, reason)
    }
}
