package org.edgeflash.llm.tokenizer

/**
 * Text of a growing list of generated ids, piece by piece. A token may hold part of a UTF-8
 * character (byte-level and byte-fallback vocabularies), so the text is decoded whole and only
 * what is settled -- not ending in a replacement character -- is handed out.
 */
class StreamDecoder(private val tokenizer: Tokenizer, private val skipSpecial: Boolean = true) {
    private val ids = ArrayList<Int>()
    private var emitted = 0

    /** The new text after appending `id` (empty while a character is incomplete). */
    fun add(id: Int): String {
        ids.add(id)
        val text = tokenizer.decode(ids.toIntArray(), skipSpecial)
        if (text.endsWith('\uFFFD') || text.length < emitted) return ""
        val piece = text.substring(emitted)
        emitted = text.length
        return piece
    }

    /** Whatever is left at the end of a reply (a dangling partial character shows as U+FFFD). */
    fun finish(): String {
        val text = tokenizer.decode(ids.toIntArray(), skipSpecial)
        return if (text.length > emitted) text.substring(emitted) else ""
    }
}
