package org.edgeflash.llm

import java.io.File

/** One input or output of a chunk method; a shape entry of -1 stands for "T" (the method's token count). */
data class TensorInfo(val name: String, val dtype: String, val shape: List<Long>) {
    fun shapeFor(tokens: Int): LongArray = LongArray(shape.size) { if (shape[it] == T) tokens.toLong() else shape[it] }

    companion object {
        const val T = -1L
    }
}

/** One chunk file: layers [layerStart, layerStop), whether it holds the embedding and the head. */
data class ChunkInfo(
    val index: Int,
    val file: String,
    val layerStart: Int,
    val layerStop: Int,
    val embedding: Boolean,
    val head: Boolean,
    val inputs: List<TensorInfo>,
    val outputs: List<TensorInfo>,
    val bytes: Long,
) {
    val layers: IntRange get() = layerStart until layerStop
}

/** The cache layout: "state" (inside the chunk programs) or "io" (passed in, new entries returned). */
data class CacheInfo(val mode: String, val length: Int, val dtype: String, val shape: List<Long>, val windows: List<Int>) {
    /** Bytes of one layer's K or V cache. */
    val layerBytes: Long get() = shape.fold(4L) { acc, d -> acc * d }
}

/**
 * `manifest.json` of an `edgeflash export --target executorch|coreml --chunks N` directory
 * (written by export/targets/chunks.py; the keys read here are the ones the Python runner reads).
 */
data class Manifest(
    val target: String,
    val version: Int,
    val modelName: String,
    val nLayers: Int,
    val dModel: Int,
    val vocabSize: Int,
    val nKvHeads: Int,
    val headDim: Int,
    val tokenizerFile: String,
    val bosId: Int?,
    val eosIds: List<Int>,
    val cache: CacheInfo,
    val prefillTokens: Int,
    val decodeTokens: Int,
    val staticShapes: Boolean,
    val chunks: List<ChunkInfo>,
    val totalBytes: Long,
) {
    companion object {
        const val FILE = "manifest.json"
        const val FORMAT = "edgeflash-target"
        const val VERSION = 1

        fun read(dir: File): Manifest {
            val f = File(dir, FILE)
            if (!f.exists()) throw IllegalArgumentException("$dir: no $FILE (not an edgeflash target export)")
            return parse(f.readText(), f.path)
        }

        fun parse(text: String, where: String = FILE): Manifest {
            val root = try { Json.parse(text) } catch (e: IllegalArgumentException) {
                throw IllegalArgumentException("$where: not valid JSON (${e.message})")
            }.obj(where)
            val format = root["format"]
            if (format != FORMAT) throw IllegalArgumentException("$where: format is $format, expected $FORMAT")
            val version = root["version"].int("$where: version")
            if (version > VERSION) throw IllegalArgumentException("$where: version $version is newer than this app reads ($VERSION)")
            val spec = root["model"].obj("$where: model")["spec"].obj("$where: model.spec")
            val tok = root["tokenizer"].obj("$where: tokenizer")
            val cache = root["cache"].obj("$where: cache")
            val methods = root["methods"].obj("$where: methods")
            val chunks = root["chunks"].list("$where: chunks").mapIndexed { i, c -> chunk(i, c.obj("$where: chunks[$i]"), "$where: chunks[$i]") }
            val m = Manifest(
                target = root["target"].str("$where: target"),
                version = version,
                modelName = root["model"].obj("$where: model")["name"] as? String ?: "model",
                nLayers = spec["n_layers"].int("$where: model.spec.n_layers"),
                dModel = spec["d_model"].int("$where: model.spec.d_model"),
                vocabSize = spec["vocab_size"].int("$where: model.spec.vocab_size"),
                nKvHeads = spec["n_kv_heads"].int("$where: model.spec.n_kv_heads"),
                headDim = spec["head_dim"].int("$where: model.spec.head_dim"),
                tokenizerFile = tok["file"].str("$where: tokenizer.file"),
                bosId = (tok["bos_id"] as? Number)?.toInt(),
                eosIds = tok["eos_ids"].list("$where: tokenizer.eos_ids").mapIndexed { i, v -> v.int("$where: tokenizer.eos_ids[$i]") },
                cache = CacheInfo(
                    mode = cache["mode"].str("$where: cache.mode"),
                    length = cache["length"].int("$where: cache.length"),
                    dtype = cache["dtype"].str("$where: cache.dtype"),
                    shape = cache["shape"].list("$where: cache.shape").mapIndexed { i, v -> v.long("$where: cache.shape[$i]") },
                    windows = cache["windows"].list("$where: cache.windows").mapIndexed { i, v -> v.int("$where: cache.windows[$i]") },
                ),
                prefillTokens = methods["prefill"].obj("$where: methods.prefill")["tokens"].int("$where: methods.prefill.tokens"),
                decodeTokens = methods["decode"].obj("$where: methods.decode")["tokens"].int("$where: methods.decode.tokens"),
                staticShapes = root["static_shapes"] as? Boolean ?: true,
                chunks = chunks,
                totalBytes = root["total_bytes"].long("$where: total_bytes"),
            )
            m.check(where)
            return m
        }

        private fun chunk(index: Int, c: Map<String, Any?>, where: String): ChunkInfo {
            val layers = c["layers"].list("$where.layers")
            if (layers.size != 2) throw IllegalArgumentException("$where.layers: expected [start, stop]")
            return ChunkInfo(
                index = index,
                file = c["file"].str("$where.file"),
                layerStart = layers[0].int("$where.layers[0]"),
                layerStop = layers[1].int("$where.layers[1]"),
                embedding = c["embedding"].bool("$where.embedding"),
                head = c["head"].bool("$where.head"),
                inputs = tensors(c["inputs"].list("$where.inputs"), "$where.inputs"),
                outputs = tensors(c["outputs"].list("$where.outputs"), "$where.outputs"),
                bytes = c["bytes"].long("$where.bytes"),
            )
        }

        private fun tensors(items: List<Any?>, where: String): List<TensorInfo> = items.mapIndexed { i, raw ->
            val t = raw.obj("$where[$i]")
            TensorInfo(
                name = t["name"].str("$where[$i].name"),
                dtype = t["dtype"].str("$where[$i].dtype"),
                shape = t["shape"].list("$where[$i].shape").mapIndexed { j, d ->
                    if (d == "T") TensorInfo.T else d.long("$where[$i].shape[$j]")
                },
            )
        }
    }

    /** The chaining contract the runner relies on: chunks cover the layers in order, the first
     *  holds the embedding, the last the head, and inputs come in the order the runner passes them. */
    private fun check(where: String) {
        if (chunks.isEmpty()) throw IllegalArgumentException("$where: no chunks")
        if (cache.mode != "state" && cache.mode != "io") throw IllegalArgumentException("$where: cache.mode = ${cache.mode}, expected state or io")
        var next = 0
        for (c in chunks) {
            if (c.layerStart != next || c.layerStop <= c.layerStart) {
                throw IllegalArgumentException("$where: chunks[${c.index}].layers = [${c.layerStart}, ${c.layerStop}), expected to start at $next")
            }
            next = c.layerStop
            if (c.embedding != (c.index == 0)) throw IllegalArgumentException("$where: chunks[${c.index}].embedding must be true only for the first chunk")
            if (c.head != (c.index == chunks.size - 1)) throw IllegalArgumentException("$where: chunks[${c.index}].head must be true only for the last chunk")
            val expected = expectedInputs(c)
            if (c.inputs.map { it.name } != expected) {
                throw IllegalArgumentException("$where: chunks[${c.index}].inputs are ${c.inputs.map { it.name }}, expected $expected")
            }
        }
        if (next != nLayers) throw IllegalArgumentException("$where: chunks cover $next layers, the model has $nLayers")
    }

    /** Input names in call order: x, input_pos, [last], then k/v caches per layer when kv = io. */
    fun expectedInputs(c: ChunkInfo): List<String> {
        val names = mutableListOf(if (c.embedding) "tokens" else "hidden", "input_pos")
        if (c.head) names.add("last")
        if (cache.mode == "io") for (layer in c.layers) { names.add("k_cache.$layer"); names.add("v_cache.$layer") }
        return names
    }
}
