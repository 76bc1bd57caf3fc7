package org.edgeflash.llm

/**
 * A small JSON reader: manifests and tokenizer files are read on the device without a JSON
 * library (Android's org.json is not on a plain JVM, and this module must build on both).
 * Objects become LinkedHashMap<String, Any?>, arrays List<Any?>, numbers Long or Double.
 */
object Json {
    fun parse(text: String): Any? {
        val reader = Reader(text)
        val value = reader.value()
        reader.skipSpace()
        if (reader.pos != text.length) reader.fail("text after the JSON value")
        return value
    }

    private class Reader(val s: String) {
        var pos = 0

        fun fail(what: String): Nothing = throw IllegalArgumentException("JSON: $what at offset $pos")

        fun skipSpace() {
            while (pos < s.length && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\r' || s[pos] == '\t')) pos++
        }

        fun value(): Any? {
            skipSpace()
            if (pos >= s.length) fail("unexpected end")
            return when (val c = s[pos]) {
                '{' -> obj()
                '[' -> arr()
                '"' -> str()
                't' -> word("true", true)
                'f' -> word("false", false)
                'n' -> word("null", null)
                else -> if (c == '-' || c in '0'..'9') num() else fail("unexpected '$c'")
            }
        }

        private fun word(w: String, v: Any?): Any? {
            if (!s.startsWith(w, pos)) fail("expected $w")
            pos += w.length
            return v
        }

        private fun obj(): Map<String, Any?> {
            val out = LinkedHashMap<String, Any?>()
            pos++
            skipSpace()
            if (s[pos] == '}') { pos++; return out }
            while (true) {
                skipSpace()
                if (pos >= s.length || s[pos] != '"') fail("expected a key")
                val key = str()
                skipSpace()
                if (pos >= s.length || s[pos] != ':') fail("expected ':'")
                pos++
                out[key] = value()
                skipSpace()
                if (pos >= s.length) fail("unterminated object")
                when (s[pos++]) {
                    ',' -> continue
                    '}' -> return out
                    else -> { pos--; fail("expected ',' or '}'") }
                }
            }
        }

        private fun arr(): List<Any?> {
            val out = ArrayList<Any?>()
            pos++
            skipSpace()
            if (pos < s.length && s[pos] == ']') { pos++; return out }
            while (true) {
                out.add(value())
                skipSpace()
                if (pos >= s.length) fail("unterminated array")
                when (s[pos++]) {
                    ',' -> continue
                    ']' -> return out
                    else -> { pos--; fail("expected ',' or ']'") }
                }
            }
        }

        private fun str(): String {
            pos++ // opening quote
            val sb = StringBuilder()
            while (true) {
                if (pos >= s.length) fail("unterminated string")
                val c = s[pos++]
                when (c) {
                    '"' -> return sb.toString()
                    '\\' -> {
                        when (val e = s[pos++]) {
                            '"' -> sb.append('"'); '\\' -> sb.append('\\'); '/' -> sb.append('/')
                            'b' -> sb.append('\b'); 'f' -> sb.append('\u000c'); 'n' -> sb.append('\n')
                            'r' -> sb.append('\r'); 't' -> sb.append('\t')
                            'u' -> { sb.append(s.substring(pos, pos + 4).toInt(16).toChar()); pos += 4 }
                            else -> fail("bad escape '\\$e'")
                        }
                    }
                    else -> sb.append(c)
                }
            }
        }

        private fun num(): Any {
            val start = pos
            if (s[pos] == '-') pos++
            var isDouble = false
            while (pos < s.length) {
                val c = s[pos]
                if (c in '0'..'9') pos++
                else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { isDouble = true; pos++ }
                else break
            }
            val text = s.substring(start, pos)
            return if (isDouble) text.toDouble() else text.toLongOrNull() ?: text.toDouble()
        }
    }
}

// Typed access with errors that name the field ("manifest.json: chunks[1].file: ...").
@Suppress("UNCHECKED_CAST")
internal fun Any?.obj(where: String): Map<String, Any?> =
    this as? Map<String, Any?> ?: throw IllegalArgumentException("$where: expected an object, got ${describe(this)}")

@Suppress("UNCHECKED_CAST")
internal fun Any?.list(where: String): List<Any?> =
    this as? List<Any?> ?: throw IllegalArgumentException("$where: expected a list, got ${describe(this)}")

internal fun Any?.long(where: String): Long = when (this) {
    is Long -> this
    is Double -> if (this == Math.floor(this)) this.toLong() else throw IllegalArgumentException("$where: expected an integer, got $this")
    else -> throw IllegalArgumentException("$where: expected an integer, got ${describe(this)}")
}

internal fun Any?.int(where: String): Int = long(where).toInt()

internal fun Any?.double(where: String): Double =
    (this as? Number)?.toDouble() ?: throw IllegalArgumentException("$where: expected a number, got ${describe(this)}")

internal fun Any?.str(where: String): String =
    this as? String ?: throw IllegalArgumentException("$where: expected a string, got ${describe(this)}")

internal fun Any?.bool(where: String): Boolean =
    this as? Boolean ?: throw IllegalArgumentException("$where: expected true or false, got ${describe(this)}")

private fun describe(v: Any?): String = when (v) {
    null -> "null"
    is Map<*, *> -> "an object"
    is List<*> -> "a list"
    is String -> "\"${v.take(40)}\""
    else -> v.toString()
}
