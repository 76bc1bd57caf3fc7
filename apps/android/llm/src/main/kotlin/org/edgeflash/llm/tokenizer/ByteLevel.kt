package org.edgeflash.llm.tokenizer

/**
 * The GPT-2 byte alphabet: byte-level vocabularies (SmolLM2, Llama 3, Qwen2) spell every byte
 * as one printable character, so a token can hold part of a UTF-8 character. Printable Latin-1
 * bytes spell themselves; the other 68 move to code points 256 and up, in byte order.
 */
object ByteLevel {
    val charOf = CharArray(256)
    private val byteOf = HashMap<Char, Int>()

    init {
        val printable = (('!'.code..'~'.code) + (0xA1..0xAC) + (0xAE..0xFF)).toSet()
        var shifted = 0
        for (b in 0 until 256) {
            charOf[b] = if (b in printable) b.toChar() else (256 + shifted++).toChar()
            byteOf[charOf[b]] = b
        }
    }

    fun spell(text: String): String {
        val bytes = text.toByteArray(Charsets.UTF_8)
        val sb = StringBuilder(bytes.size)
        for (b in bytes) sb.append(charOf[b.toInt() and 0xFF])
        return sb.toString()
    }

    /** The bytes a token in the alphabet stands for; a token with other characters (an added
     *  token such as "<|im_start|>") stands for its own UTF-8 text. */
    fun unspell(token: String): ByteArray {
        val out = ByteArray(token.length)
        for ((i, c) in token.withIndex()) out[i] = (byteOf[c] ?: return token.toByteArray(Charsets.UTF_8)).toByte()
        return out
    }
}
