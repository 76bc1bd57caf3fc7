package org.edgeflash.llm.tokenizer

/** An added token of tokenizer.json: matched in the text before BPE runs. */
data class AddedToken(
    val id: Int, val content: String, val special: Boolean, val normalized: Boolean,
    val lstrip: Boolean, val rstrip: Boolean, val singleWord: Boolean,
)

/**
 * Cuts text into plain pieces and added tokens: at each position the longest pattern wins,
 * scanning left to right (leftmost-longest), with the single_word / lstrip / rstrip rules of
 * runtime/tokenizer/added_tokens.py. A repeated pattern keeps the last token given for it.
 */
internal class AddedTokenMatcher(patterns: List<Pair<String, AddedToken>>) {
    private val byPattern = HashMap<String, AddedToken>()
    private val lengthsByFirst = HashMap<Char, IntArray>() // first char -> pattern lengths, longest first

    init {
        val lengths = HashMap<Char, MutableSet<Int>>()
        for ((p, t) in patterns) if (p.isNotEmpty()) { byPattern[p] = t; lengths.getOrPut(p[0]) { HashSet() }.add(p.length) }
        for ((c, set) in lengths) lengthsByFirst[c] = set.sortedDescending().toIntArray()
    }

    val isEmpty: Boolean get() = byPattern.isEmpty()

    private fun isWord(c: Char) = Character.isLetterOrDigit(c) || c == '_'

    /** (piece, token) parts; token is null for plain text. */
    fun split(text: String, parseSpecial: Boolean): List<Pair<String, AddedToken?>> {
        val parts = ArrayList<Pair<String, AddedToken?>>()
        var done = 0
        var pos = 0
        while (pos < text.length) {
            val lengths = lengthsByFirst[text[pos]]
            var matchEnd = -1
            var token: AddedToken? = null
            if (lengths != null) for (len in lengths) {
                if (pos + len <= text.length) {
                    val t = byPattern[text.substring(pos, pos + len)]
                    if (t != null) { matchEnd = pos + len; token = t; break }
                }
            }
            if (token == null) { pos++; continue }
            var start = pos
            var stop = matchEnd
            pos = matchEnd
            if (token.special && !parseSpecial) continue
            if (token.singleWord) {
                val leftOk = start == 0 || !isWord(text[start - 1])
                val rightOk = stop == text.length || !isWord(text[stop])
                if (!(leftOk && rightOk)) continue
            }
            if (token.lstrip) { while (start > done && text[start - 1].isWhitespace()) start-- }
            if (token.rstrip) { while (stop < text.length && text[stop].isWhitespace()) stop++ }
            if (done < start) parts.add(text.substring(done, start) to null)
            parts.add(text.substring(start, stop) to token)
            done = stop
            pos = maxOf(pos, stop)
        }
        if (done < text.length || parts.isEmpty()) parts.add(text.substring(done) to null)
        return parts
    }
}
