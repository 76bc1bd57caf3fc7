package org.edgeflash.llm.tokenizer

/** tokenizer.json `decoder` steps: token texts back to one string, as runtime/tokenizer/decoders.py. */
internal object Decoders {
    private fun byteToken(t: String): Int? =
        if (t.length == 6 && t.startsWith("<0x") && t.endsWith(">")) t.substring(3, 5).toIntOrNull(16) else null

    fun build(spec: Any?, where: String = "decoder"): (List<String>) -> String {
        if (spec == null) return { it.joinToString("") } // no decoder: the texts joined as they are
        val steps = flatten(spec, where)
        return { tokens -> steps.fold(tokens) { t, step -> step(t) }.joinToString("") }
    }

    private fun flatten(spec: Any?, where: String): List<(List<String>) -> List<String>> {
        val m = spec as? Map<*, *> ?: throw IllegalArgumentException("$where: expected an object")
        return when (val type = m["type"]) {
            "Sequence" -> (m["decoders"] as? List<*> ?: throw IllegalArgumentException("$where.decoders: expected a list"))
                .flatMapIndexed { i, s -> flatten(s, "$where.decoders[$i]") }
            "Replace" -> {
                val content = m["content"] as? String ?: throw IllegalArgumentException("$where.content: expected a string")
                val literal = (m["pattern"] as? Map<*, *>)?.get("String") as? String
                val p = if (literal == null) Patterns.of(m["pattern"], "$where.pattern") else null
                listOf({ tokens -> tokens.map { if (literal != null) it.replace(literal, content) else p!!.matcher(it).replaceAll(java.util.regex.Matcher.quoteReplacement(content)) } })
            }
            "ByteFallback" -> listOf(::byteFallback)
            "Fuse" -> listOf({ tokens -> listOf(tokens.joinToString("")) })
            "Strip" -> {
                val c = (m["content"] as? String)?.singleOrNull() ?: throw IllegalArgumentException("$where.content: expected one character")
                val start = (m["start"] as? Number)?.toInt() ?: 0
                val stop = (m["stop"] as? Number)?.toInt() ?: 0
                listOf({ tokens -> tokens.map { strip(it, c, start, stop) } })
            }
            "Metaspace" -> {
                val r = m["replacement"] as? String ?: "\u2581"
                val dropsFirst = (m["prepend_scheme"] ?: "always") != "never" && m["add_prefix_space"] != false
                // The reference drops every replacement character of the first token, not just one.
                listOf({ tokens -> tokens.mapIndexed { i, t -> t.replace(r, if (i == 0 && dropsFirst) "" else " ") } })
            }
            "ByteLevel" -> listOf({ tokens ->
                val out = java.io.ByteArrayOutputStream()
                for (t in tokens) out.write(ByteLevel.unspell(t))
                listOf(String(out.toByteArray(), Charsets.UTF_8))
            })
            else -> throw IllegalArgumentException("$where.type = $type is not supported (Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel, Sequence)")
        }
    }

    private fun byteFallback(tokens: List<String>): List<String> {
        val out = ArrayList<String>()
        val pending = java.io.ByteArrayOutputStream()
        fun flush() {
            if (pending.size() == 0) return
            val bytes = pending.toByteArray()
            val decoder = Charsets.UTF_8.newDecoder()
            try { out.add(decoder.decode(java.nio.ByteBuffer.wrap(bytes)).toString()) }
            catch (e: java.nio.charset.CharacterCodingException) { repeat(bytes.size) { out.add("\uFFFD") } } // one per byte, as the reference
            pending.reset()
        }
        for (t in tokens) {
            val b = byteToken(t)
            if (b == null) { flush(); out.add(t) } else pending.write(b)
        }
        flush()
        return out
    }

    private fun strip(t: String, c: Char, start: Int, stop: Int): String {
        var begin = 0
        while (begin < minOf(start, t.length) && t[begin] == c) begin++
        var end = t.length
        while (t.length - end < minOf(stop, t.length) && end > begin && t[end - 1] == c) end--
        return t.substring(begin, end)
    }
}
