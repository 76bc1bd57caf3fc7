package org.edgeflash.llm.tokenizer

import java.util.PriorityQueue

/**
 * Byte-pair encoding of one pre-tokenized word, with the rules of runtime/tokenizer/bpe.py:
 * the adjacent pair with the lowest rank merges first, the leftmost on equal rank. Ranks come
 * from an explicit merge list ("merges"), or are implied by a SentencePiece vocabulary: a pair
 * merges when a+b is a token, ranked by the merged token's id ("token_order", Gemma) or its
 * score ("scores"), then longer left piece first.
 */
class Bpe(
    val vocab: Array<String?>,
    private val mergeOrder: String,
    merges: List<Pair<String, String>>?,
    private val scores: DoubleArray?,
    private val byteFallback: Boolean,
    unkToken: String?,
    private val fuseUnk: Boolean,
    private val ignoreMerges: Boolean,
) {
    /** Text -> id; a text listed twice keeps its larger id. */
    val ids = HashMap<String, Int>(vocab.size * 2)
    private val unkId: Int?
    private val byteIds = IntArray(256) { -1 }
    private val mergeRank = HashMap<Long, Long>() // (left, right) -> rank * N + merged id
    private val n = vocab.size.toLong()

    init {
        require(mergeOrder in listOf("merges", "token_order", "scores")) { "BPE merge_order '$mergeOrder' is not merges, token_order or scores" }
        for ((id, text) in vocab.withIndex()) if (text != null) ids[text] = id
        unkId = unkToken?.let { ids[it] ?: throw IllegalArgumentException("BPE unk_token '$it' is not in the vocabulary") }
        for (b in 0 until 256) ids[String.format("<0x%02X>", b)]?.let { byteIds[b] = it }
        if (mergeOrder == "merges") {
            requireNotNull(merges) { "BPE merge_order 'merges' needs a merges list" }
            for ((rank, m) in merges.withIndex()) {
                val l = ids[m.first]; val r = ids[m.second]; val merged = ids[m.first + m.second]
                require(l != null && r != null && merged != null) { "BPE merge #$rank (${m.first}, ${m.second}) uses a piece not in the vocabulary" }
                mergeRank.putIfAbsent(l.toLong() * n + r, rank * n + merged) // the first listing counts
            }
        }
        if (mergeOrder == "scores") require(scores != null && scores.size == vocab.size) { "BPE merge_order 'scores' needs one score per token" }
    }

    /** A comparable rank (lower merges first) and the merged id, or null when the pair does not merge. */
    private fun pair(leftId: Int, left: String, rightId: Int, right: String): Pair<Rank, Int>? {
        if (mergeOrder == "merges") {
            val packed = mergeRank[leftId.toLong() * n + rightId] ?: return null
            return Rank(packed / n, 0.0, 0, 0) to (packed % n).toInt()
        }
        val merged = ids[left + right] ?: return null
        return if (scores == null) Rank(merged.toLong(), 0.0, -cps(left), 0) to merged
        else Rank(0, -scores[merged], -cps(left), -cps(right), merged) to merged
    }

    data class Rank(val primary: Long, val score: Double, val leftLen: Int, val rightLen: Int, val id: Int = 0) : Comparable<Rank> {
        override fun compareTo(other: Rank): Int = compareValuesBy(this, other, { it.primary }, { it.score }, { it.leftLen }, { it.rightLen }, { it.id })
    }

    private fun initialSymbols(word: String): MutableList<Int> {
        val out = ArrayList<Int>()
        var pendingUnk = false
        var i = 0
        while (i < word.length) {
            val cp = word.codePointAt(i)
            val ch = String(Character.toChars(cp))
            i += ch.length
            val id = ids[ch]
            if (id != null) {
                if (pendingUnk) { out.add(unkId!!); pendingUnk = false }
                out.add(id)
                continue
            }
            if (byteFallback) {
                val bytes = ch.toByteArray(Charsets.UTF_8).map { byteIds[it.toInt() and 0xFF] }
                if (bytes.all { it >= 0 }) { out.addAll(bytes); continue }
            }
            if (unkId == null) continue // no unknown token: the character is dropped, as the reference does
            if (pendingUnk && !fuseUnk) out.add(unkId)
            pendingUnk = true
        }
        if (pendingUnk) out.add(unkId!!)
        return out
    }

    private class Entry(val rank: Rank, val pos: Int, val merged: Int, val left: Int, val right: Int)

    fun encodeWord(word: String): List<Int> {
        if (ignoreMerges) ids[word]?.let { return listOf(it) }
        val symbols = initialSymbols(word)
        val count = symbols.size
        if (count < 2) return symbols
        val texts = Array(count) { vocab[symbols[it]] ?: "" }
        val following = IntArray(count) { if (it + 1 < count) it + 1 else -1 }
        val preceding = IntArray(count) { it - 1 }
        val alive = BooleanArray(count) { true }
        val queue = PriorityQueue<Entry>(compareBy<Entry> { it.rank }.thenBy { it.pos })
        fun push(p: Int, q: Int) { pair(symbols[p], texts[p], symbols[q], texts[q])?.let { queue.add(Entry(it.first, p, it.second, symbols[p], symbols[q])) } }
        for (p in 0 until count - 1) push(p, p + 1)
        while (queue.isNotEmpty()) {
            val e = queue.poll()
            if (!alive[e.pos]) continue
            val right = following[e.pos]
            if (right < 0) continue
            if (symbols[e.pos] != e.left || symbols[right] != e.right) {
                // One side merged since this entry was queued: it stands only when the pair there now makes the same token.
                val now = pair(symbols[e.pos], texts[e.pos], symbols[right], texts[right])
                if (now == null || now.second != e.merged) continue
            }
            symbols[e.pos] = e.merged
            texts[e.pos] = texts[e.pos] + texts[right]
            alive[right] = false
            val after = following[right]
            following[e.pos] = after
            if (after >= 0) { preceding[after] = e.pos; push(e.pos, after) }
            val before = preceding[e.pos]
            if (before >= 0) push(before, e.pos)
        }
        return symbols.filterIndexed { i, _ -> alive[i] }
    }
}

/** Length in code points, as Python counts a string (ranks compare piece lengths). */
private fun cps(s: String): Int = s.codePointCount(0, s.length)
