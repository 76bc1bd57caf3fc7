package org.edgeflash.llm.tokenizer

import java.text.Normalizer as JavaNormalizer

/** tokenizer.json `normalizer` steps (the ones edgeflash's tokenizer reads). */
internal typealias Norm = (String) -> String

internal object Normalizers {
    fun build(spec: Any?, where: String = "normalizer"): Norm? {
        if (spec == null) return null
        val m = spec as? Map<*, *> ?: throw IllegalArgumentException("$where: expected an object")
        return when (val type = m["type"]) {
            "Replace" -> {
                val content = m["content"] as? String ?: throw IllegalArgumentException("$where.content: expected a string")
                val literal = (m["pattern"] as? Map<*, *>)?.get("String") as? String
                val p = if (literal == null) Patterns.of(m["pattern"], "$where.pattern") else null
                val f: Norm = { text -> if (literal != null) text.replace(literal, content) else p!!.matcher(text).replaceAll(java.util.regex.Matcher.quoteReplacement(content)) }
                f
            }
            "Prepend" -> { val p = m["prepend"] as? String ?: ""; val f: Norm = { text -> if (text.isEmpty()) text else p + text }; f }
            "Strip" -> {
                val left = m["strip_left"] as? Boolean ?: true
                val right = m["strip_right"] as? Boolean ?: true
                val f: Norm = { text -> var t = text; if (left) t = t.trimStart(); if (right) t = t.trimEnd(); t }
                f
            }
            "NFC", "NFD", "NFKC", "NFKD" -> { val form = JavaNormalizer.Form.valueOf(type as String); val f: Norm = { text -> JavaNormalizer.normalize(text, form) }; f }
            "Sequence" -> {
                val steps = (m["normalizers"] as? List<*> ?: throw IllegalArgumentException("$where.normalizers: expected a list"))
                    .mapIndexedNotNull { i, s -> build(s, "$where.normalizers[$i]") }
                val f: Norm = { text -> steps.fold(text) { t, step -> step(t) } }
                f
            }
            else -> throw IllegalArgumentException("$where.type = $type is not supported (Replace, Prepend, Strip, NFC, NFD, NFKC, NFKD, Sequence)")
        }
    }
}
