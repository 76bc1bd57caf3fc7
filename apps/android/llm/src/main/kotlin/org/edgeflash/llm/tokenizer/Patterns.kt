package org.edgeflash.llm.tokenizer

import java.util.regex.Pattern

/** tokenizer.json patterns as java.util.regex, with Unicode classes as Python's `regex` has them. */
internal object Patterns {
    const val GPT2_SPLIT = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

    fun compile(regex: String): Pattern = try {
        // On a JVM, \s and \w are ASCII-only unless asked; Python's `regex` is Unicode-aware.
        Pattern.compile(regex, Pattern.UNICODE_CHARACTER_CLASS)
    } catch (e: IllegalArgumentException) {
        // Android's ICU-based regex rejects the flag and is Unicode-aware already.
        Pattern.compile(regex)
    }

    /** A tokenizer.json pattern: {"String": s} (literal) or {"Regex": r}. */
    fun of(spec: Any?, where: String): Pattern {
        val m = spec as? Map<*, *> ?: throw IllegalArgumentException("$where: expected {\"String\": ...} or {\"Regex\": ...}")
        (m["String"] as? String)?.let { return Pattern.compile(Pattern.quote(it)) }
        (m["Regex"] as? String)?.let { return compile(it) }
        throw IllegalArgumentException("$where: expected {\"String\": ...} or {\"Regex\": ...}")
    }

    /** The whole text as consecutive (start, end, isDelimiter) spans. */
    fun spans(text: String, pattern: Pattern, invert: Boolean = false): List<Triple<Int, Int, Boolean>> {
        val out = ArrayList<Triple<Int, Int, Boolean>>()
        var done = 0
        val m = pattern.matcher(text)
        while (m.find()) {
            if (m.end() == m.start()) continue // an empty match delimits nothing
            if (done != m.start()) out.add(Triple(done, m.start(), invert))
            out.add(Triple(m.start(), m.end(), !invert))
            done = m.end()
        }
        if (done != text.length) out.add(Triple(done, text.length, invert))
        return out
    }

    /** Which (start, end) slices survive a split with the given delimiter behavior. */
    fun applyBehavior(spans: List<Triple<Int, Int, Boolean>>, behavior: String): List<IntArray> = when (behavior) {
        "Removed" -> spans.filter { !it.third }.map { intArrayOf(it.first, it.second) }
        "Isolated" -> spans.map { intArrayOf(it.first, it.second) }
        "MergedWithNext" -> {
            val slices = ArrayList<IntArray>()
            var previous = false
            for ((start, end, delim) in spans.asReversed()) {
                if (delim && !previous && slices.isNotEmpty()) slices.last()[0] = start else slices.add(intArrayOf(start, end))
                previous = delim
            }
            slices.reverse()
            slices
        }
        "MergedWithPrevious", "Contiguous" -> {
            val slices = ArrayList<IntArray>()
            var previous = false
            for ((start, end, delim) in spans) {
                val glue = if (behavior == "MergedWithPrevious") delim && !previous else delim == previous
                if (glue && slices.isNotEmpty()) slices.last()[1] = end else slices.add(intArrayOf(start, end))
                previous = delim
            }
            slices
        }
        else -> throw IllegalArgumentException("split behavior '$behavior' is not Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous")
    }
}
