package org.edgeflash.llm.tokenizer

import org.edgeflash.llm.Json
import org.edgeflash.llm.bool
import org.edgeflash.llm.int
import org.edgeflash.llm.list
import org.edgeflash.llm.obj
import org.edgeflash.llm.str
import java.io.File

/**
 * Text <-> token ids from the `tokenizer.json` an edgeflash export writes (format
 * "edgeflash.tokenizer", see runtime/tokenizer/spec.py): the same stages as the Python
 * tokenizer -- cut out added tokens, normalize, cut out normalized added tokens, pre-tokenize,
 * BPE each word, then the prefix (BOS) and suffix ids around the result.
 */
class Tokenizer private constructor(spec: Map<String, Any?>) {
    private val bpe: Bpe
    private val normalizer: ((String) -> String)?
    private val preTokenizer: ((Piece) -> List<Piece>)?
    private val decoder: (List<String>) -> String
    private val raw: AddedTokenMatcher
    private val normalizedMatcher: AddedTokenMatcher
    private val overlay = HashMap<Int, String>() // id -> text where an added token's text replaces the vocabulary's
    private val special = HashSet<Int>()
    private val prefixIds: List<Int>
    private val suffixIds: List<Int>
    val vocabSize: Int
    val bosId: Int?
    val eosIds: Set<Int>
    val specialTokens: Map<String, String?>
    /** "gemma", "chatml" or "plain": the turn format the vocabulary shows (see ChatFormat). */
    val chatFormat: String

    init {
        if (spec["format"] != "edgeflash.tokenizer") throw IllegalArgumentException("tokenizer: format = ${spec["format"]}, expected edgeflash.tokenizer")
        if ((spec["version"] as? Long) != 1L) throw IllegalArgumentException("tokenizer: version = ${spec["version"]}, this reader knows 1")
        val model = spec["model"].obj("tokenizer: model")
        if (model["type"] != "BPE") throw IllegalArgumentException("tokenizer: model.type = ${model["type"]}, expected BPE")
        val vocab = model["vocab"].list("tokenizer: model.vocab").map { it as String? }.toTypedArray()
        val merges = (model["merges"] as? List<*>)?.mapIndexed { i, m -> mergePair(m, i) }
        val scores = (model["scores"] as? List<*>)?.map { (it as Number).toDouble() }?.toDoubleArray()
        bpe = Bpe(vocab, model["merge_order"] as? String ?: "merges", merges, scores,
            model["byte_fallback"] as? Boolean ?: false, model["unk_token"] as? String,
            model["fuse_unk"] as? Boolean ?: false, model["ignore_merges"] as? Boolean ?: false)
        normalizer = Normalizers.build(spec["normalizer"])
        preTokenizer = PreTokenizers.build(spec["pre_tokenizer"])
        decoder = Decoders.build(spec["decoder"])
        val added = spec["added_tokens"].list("tokenizer: added_tokens").mapIndexed { i, raw ->
            val t = raw.obj("tokenizer: added_tokens[$i]")
            AddedToken(t["id"].int("added_tokens[$i].id"), t["content"].str("added_tokens[$i].content"),
                t["special"] as? Boolean ?: false, t["normalized"] as? Boolean ?: false,
                t["lstrip"] as? Boolean ?: false, t["rstrip"] as? Boolean ?: false, t["single_word"] as? Boolean ?: false)
        }
        val normalize = normalizer ?: { it }
        val asIs = added.filter { !it.normalized }.map { it.content to it }
        val normalized = added.filter { it.normalized }.map { normalize(it.content) to it }
        raw = AddedTokenMatcher(asIs)
        normalizedMatcher = AddedTokenMatcher(normalized)
        for ((text, t) in asIs + normalized) if (t.id >= vocab.size || vocab[t.id] != text) overlay[t.id] = text
        for (t in added) if (t.special) special.add(t.id)
        vocabSize = maxOf(vocab.size, (added.maxOfOrNull { it.id } ?: -1) + 1)
        prefixIds = spec["prefix_ids"].list("tokenizer: prefix_ids").mapIndexed { i, v -> v.int("prefix_ids[$i]") }
        suffixIds = spec["suffix_ids"].list("tokenizer: suffix_ids").mapIndexed { i, v -> v.int("suffix_ids[$i]") }
        @Suppress("UNCHECKED_CAST")
        specialTokens = spec["special_tokens"].obj("tokenizer: special_tokens") as Map<String, String?>
        bosId = tokenToId(specialTokens["bos_token"])
        val eos = tokenToId(specialTokens["eos_token"])
        eosIds = spec["end_ids"].list("tokenizer: end_ids").mapIndexed { i, v -> v.int("end_ids[$i]") }.toSet() + listOfNotNull(eos)
        chatFormat = when {
            tokenToId("<start_of_turn>") != null && tokenToId("<end_of_turn>") != null -> "gemma"
            tokenToId("<|im_start|>") != null && tokenToId("<|im_end|>") != null -> "chatml"
            else -> "plain"
        }
    }

    fun tokenToId(token: String?): Int? {
        if (token == null) return null
        val listed = overlay.entries.filter { it.value == token }.maxOfOrNull { it.key }
        val found = bpe.ids[token]?.takeIf { it !in overlay }
        return if (found == null || (listed != null && listed > found)) listed else found
    }

    fun idToToken(id: Int): String? = overlay[id] ?: bpe.vocab.getOrNull(id)

    fun isSpecial(id: Int): Boolean = id in special

    /**
     * Token ids of `text`. addBos: null uses the model's default (Gemma adds BOS, SmolLM2 does
     * not). parseSpecial = false encodes text such as "<start_of_turn>" as plain characters, so
     * user text cannot inject control tokens.
     */
    fun encode(text: String, addBos: Boolean? = null, parseSpecial: Boolean = true): IntArray {
        val ids = ArrayList<Int>()
        when (addBos) {
            null -> ids.addAll(prefixIds)
            true -> if (prefixIds.isNotEmpty()) ids.addAll(prefixIds) else ids.add(bosId ?: throw IllegalArgumentException("addBos = true but the tokenizer has no BOS token"))
            false -> {}
        }
        var offset = 0
        for ((piece, token) in if (raw.isEmpty) listOf(text to null) else raw.split(text, parseSpecial)) {
            if (token != null) ids.add(token.id) else if (piece.isNotEmpty()) encodePlain(piece, offset == 0, parseSpecial, ids)
            offset += piece.length
        }
        ids.addAll(suffixIds) // EOS-style suffixes, as the Python tokenizer's default
        return ids.toIntArray()
    }

    private fun encodePlain(input: String, atStart: Boolean, parseSpecial: Boolean, out: MutableList<Int>) {
        val text = normalizer?.invoke(input) ?: input
        val parts = if (normalizedMatcher.isEmpty) listOf(text to null) else normalizedMatcher.split(text, parseSpecial)
        for ((index, part) in parts.withIndex()) {
            val (piece, token) = part
            if (token != null) { out.add(token.id); continue }
            if (piece.isEmpty()) continue
            val first = atStart && index == 0
            val words = preTokenizer?.invoke(Piece(piece, first)) ?: listOf(Piece(piece, first))
            for ((word, _) in words) out.addAll(bpe.encodeWord(word))
        }
    }

    fun decode(ids: IntArray, skipSpecial: Boolean = false): String {
        val texts = ArrayList<String>(ids.size)
        for (id in ids) {
            require(id in 0 until vocabSize) { "token id $id is outside the vocabulary [0, $vocabSize)" }
            val text = idToToken(id) ?: continue
            if (skipSpecial && isSpecial(id)) continue
            texts.add(text)
        }
        return decoder(texts)
    }

    companion object {
        fun fromJson(text: String): Tokenizer = Tokenizer(Json.parse(text).obj("tokenizer"))

        fun fromFile(file: File): Tokenizer = try { fromJson(file.readText()) } catch (e: IllegalArgumentException) {
            throw IllegalArgumentException("${file.path}: ${e.message}")
        }

        private fun mergePair(m: Any?, index: Int): Pair<String, String> = when (m) {
            is String -> m.split(" ", limit = 2).takeIf { it.size == 2 && it[0].isNotEmpty() && it[1].isNotEmpty() && !it[1].contains(' ') }
                ?.let { it[0] to it[1] } ?: throw IllegalArgumentException("tokenizer: model.merges[$index] = '$m' is not 'left right'")
            is List<*> -> if (m.size == 2 && m.all { it is String }) m[0] as String to m[1] as String
            else throw IllegalArgumentException("tokenizer: model.merges[$index] is not [left, right]")
            else -> throw IllegalArgumentException("tokenizer: model.merges[$index] is not [left, right] or 'left right'")
        }
    }
}
