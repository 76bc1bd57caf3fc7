package org.edgeflash.llm.tokenizer

/** A piece of text and whether it begins at the very start of the input (Metaspace "first" needs it). */
internal typealias Piece = Pair<String, Boolean>

/** tokenizer.json `pre_tokenizer` steps: cut normalized text into the words BPE encodes. */
internal typealias Pre = (Piece) -> List<Piece>

internal object PreTokenizers {
    private val gpt2 = Patterns.compile(Patterns.GPT2_SPLIT)

    private fun cut(piece: Piece, slices: List<IntArray>): List<Piece> =
        slices.filter { it[1] > it[0] }.map { Piece(piece.first.substring(it[0], it[1]), piece.second && it[0] == 0) }

    fun build(spec: Any?, where: String = "pre_tokenizer"): Pre? {
        if (spec == null) return null
        val m = spec as? Map<*, *> ?: throw IllegalArgumentException("$where: expected an object")
        return when (val type = m["type"]) {
            "ByteLevel" -> {
                val addPrefixSpace = m["add_prefix_space"] as? Boolean ?: true
                val useRegex = m["use_regex"] as? Boolean ?: true
                val f: Pre = { piece ->
                    val text = if (addPrefixSpace && !piece.first.startsWith(" ")) " " + piece.first else piece.first
                    val parts = if (useRegex) cut(Piece(text, piece.second), Patterns.applyBehavior(Patterns.spans(text, gpt2), "Isolated"))
                    else listOf(Piece(text, piece.second))
                    parts.map { Piece(ByteLevel.spell(it.first), it.second) }
                }
                f
            }
            "Split" -> {
                val pattern = Patterns.of(m["pattern"], "$where.pattern")
                val behavior = m["behavior"] as? String ?: "Isolated"
                val invert = m["invert"] as? Boolean ?: false
                val f: Pre = { piece -> cut(piece, Patterns.applyBehavior(Patterns.spans(piece.first, pattern, invert), behavior)) }
                f
            }
            "Metaspace" -> {
                val replacement = m["replacement"] as? String ?: "\u2581"
                var scheme = m["prepend_scheme"] as? String ?: "always"
                if (m["add_prefix_space"] == false) { scheme = "never" }
                val split = m["split"] as? Boolean ?: true
                val marker = java.util.regex.Pattern.compile(java.util.regex.Pattern.quote(replacement))
                val f: Pre = { piece ->
                    var text = piece.first.replace(" ", replacement)
                    if (!text.startsWith(replacement) && (scheme == "always" || (scheme == "first" && piece.second))) text = replacement + text
                    when {
                        !split -> if (text.isEmpty()) emptyList() else listOf(Piece(text, piece.second))
                        else -> cut(Piece(text, piece.second), Patterns.applyBehavior(Patterns.spans(text, marker), "MergedWithNext"))
                    }
                }
                f
            }
            "Digits" -> {
                val behavior = if (m["individual_digits"] == true) "Isolated" else "Contiguous"
                val digit = Patterns.compile("\\p{N}")
                val f: Pre = { piece -> cut(piece, Patterns.applyBehavior(Patterns.spans(piece.first, digit), behavior)) }
                f
            }
            "Whitespace" -> {
                val words = Patterns.compile("\\w+|[^\\w\\s]+")
                val f: Pre = { piece -> cut(piece, Patterns.applyBehavior(Patterns.spans(piece.first, words, invert = true), "Removed")) }
                f
            }
            "WhitespaceSplit" -> {
                val spaces = Patterns.compile("\\s+")
                val f: Pre = { piece -> cut(piece, Patterns.applyBehavior(Patterns.spans(piece.first, spaces), "Removed")) }
                f
            }
            "Sequence" -> {
                val steps = (m["pretokenizers"] as? List<*> ?: throw IllegalArgumentException("$where.pretokenizers: expected a list"))
                    .mapIndexed { i, s -> build(s, "$where.pretokenizers[$i]")!! }
                val f: Pre = { piece -> steps.fold(listOf(piece)) { pieces, step -> pieces.flatMap(step) } }
                f
            }
            else -> throw IllegalArgumentException("$where.type = $type is not supported (ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence)")
        }
    }
}
