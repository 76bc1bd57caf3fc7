package org.edgeflash.llm

import kotlin.math.exp
import kotlin.random.Random

/** The same knobs and the same rules as runtime/sampler.py (temperature 0 = greedy). */
data class SamplingParams(
    val temperature: Double = 0.0,
    val topK: Int = 0, // 0 = no limit
    val topP: Double = 1.0,
    val minP: Double = 0.0, // drop tokens below minP * p(best token)
    val repetitionPenalty: Double = 1.0, // > 1 discourages tokens already in the context
    val seed: Long? = null,
) {
    init {
        require(temperature >= 0) { "temperature = $temperature: expected a number >= 0" }
        require(topK >= 0) { "topK = $topK: expected an integer >= 0" }
        require(topP > 0 && topP <= 1) { "topP = $topP: expected a number in (0, 1]" }
        require(minP >= 0 && minP < 1) { "minP = $minP: expected a number in [0, 1)" }
        require(repetitionPenalty > 0) { "repetitionPenalty = $repetitionPenalty: expected a number > 0" }
    }

    val greedy: Boolean get() = temperature == 0.0
}

class Sampler(val params: SamplingParams) {
    private val rng = params.seed?.let { Random(it) } ?: Random.Default

    /** Logits after the repetition penalty (CTRL-style: divide positive, multiply negative). */
    fun adjustedLogits(logits: FloatArray, history: IntArray = IntArray(0)): FloatArray {
        val penalty = params.repetitionPenalty.toFloat()
        if (penalty == 1.0f || history.isEmpty()) return logits
        val out = logits.copyOf()
        for (id in history.toSet()) {
            val v = out[id]
            out[id] = if (v > 0) v / penalty else v * penalty
        }
        return out
    }

    /** The distribution sampling draws from, after every filter (sums to 1). */
    fun probabilities(logits: FloatArray, history: IntArray = IntArray(0)): DoubleArray {
        val adjusted = adjustedLogits(logits, history)
        val n = adjusted.size
        val out = DoubleArray(n)
        if (params.greedy) { out[argmax(adjusted)] = 1.0; return out }
        val scaled = DoubleArray(n) { adjusted[it].toDouble() / params.temperature }
        val keep = BooleanArray(n) { true }
        if (params.topK in 1 until n) {
            val kth = scaled.sortedArrayDescending()[params.topK - 1] // ties with the k-th value are kept too
            for (i in 0 until n) if (scaled[i] < kth) keep[i] = false
        }
        val max = scaled.max()
        var sum = 0.0
        for (i in 0 until n) { out[i] = if (keep[i]) exp(scaled[i] - max) else 0.0; sum += out[i] }
        for (i in 0 until n) out[i] /= sum
        if (params.minP > 0) {
            val floor = params.minP * out.max()
            for (i in 0 until n) if (out[i] < floor) out[i] = 0.0
        }
        if (params.topP < 1.0) {
            // The smallest prefix of tokens, most probable first (stable order), reaching topP.
            val order = (0 until n).sortedByDescending { out[it] }
            var cumulative = 0.0
            var cut = n
            for ((rank, id) in order.withIndex()) {
                cumulative += out[id]
                if (cumulative >= params.topP) { cut = rank + 1; break }
            }
            for (rank in cut until n) out[order[rank]] = 0.0
        }
        val total = out.sum()
        for (i in 0 until n) out[i] /= total
        return out
    }

    fun sample(logits: FloatArray, history: IntArray = IntArray(0)): Int {
        if (params.greedy) return argmax(adjustedLogits(logits, history))
        val probs = probabilities(logits, history)
        var u = rng.nextDouble()
        var last = 0
        for (i in probs.indices) {
            if (probs[i] <= 0) continue
            last = i
            u -= probs[i]
            if (u < 0) return i
        }
        return last // rounding left u a hair above 0: the last token with any probability
    }

    companion object {
        /** Index of the largest value, the first one on ties (as numpy's argmax). */
        fun argmax(v: FloatArray): Int {
            var best = 0
            for (i in 1 until v.size) if (v[i] > v[best]) best = i
            return best
        }
    }
}
