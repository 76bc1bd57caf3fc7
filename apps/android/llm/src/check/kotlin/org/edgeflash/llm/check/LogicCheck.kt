package org.edgeflash.llm.check

import org.edgeflash.llm.ChatFormat
import org.edgeflash.llm.ChunkChain
import org.edgeflash.llm.ChunkSchedule
import org.edgeflash.llm.ChunkedLlm
import org.edgeflash.llm.Json
import org.edgeflash.llm.Manifest
import org.edgeflash.llm.Message
import org.edgeflash.llm.Sampler
import org.edgeflash.llm.SamplingParams
import org.edgeflash.llm.tokenizer.StreamDecoder
import org.edgeflash.llm.tokenizer.Tokenizer
import java.io.DataOutputStream
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * Runs the plain-Kotlin logic on inputs a request file names and prints the results as one JSON
 * object, so that tests/apps/test_android_logic.py can compare them with the Python twins
 * (manifest reader, tokenizer, sampler, runner) on the same inputs. Arrays too large for JSON
 * (probabilities, logits, caches) go to little-endian files in the request's "out" directory.
 *
 *     java -cp llm.jar:check.jar org.edgeflash.llm.check.LogicCheckKt request.json
 */
fun main(args: Array<String>) {
    val request = Json.parse(File(args[0]).readText()) as Map<*, *>
    val out = File(request["out"] as String).apply { mkdirs() }
    val result = LinkedHashMap<String, Any?>()
    (request["manifests"] as? List<*>)?.let { list -> result["manifests"] = list.map { manifest(it as String) } }
    (request["tokenizers"] as? List<*>)?.let { list -> result["tokenizers"] = list.map { tokenizer(it as Map<*, *>) } }
    (request["sampling"] as? Map<*, *>)?.let { result["sampling"] = sampling(it, out) }
    (request["schedules"] as? List<*>)?.let { list -> result["schedules"] = list.map { schedules(it as Map<*, *>) } }
    (request["chain"] as? Map<*, *>)?.let { result["chain"] = chain(it, out) }
    (request["chat"] as? Map<*, *>)?.let { result["chat"] = chat(it) }
    (request["selfcheck"] as? Boolean)?.let { if (it) result["selfcheck"] = SelfCheck.run() }
    println(toJson(result))
}

private fun manifest(path: String): Any? = try {
    val m = Manifest.read(File(path).parentFile)
    mapOf(
        "target" to m.target, "n_layers" to m.nLayers, "d_model" to m.dModel, "vocab_size" to m.vocabSize,
        "tokenizer_file" to m.tokenizerFile, "bos_id" to m.bosId, "eos_ids" to m.eosIds,
        "cache" to mapOf("mode" to m.cache.mode, "length" to m.cache.length, "shape" to m.cache.shape, "windows" to m.cache.windows),
        "prefill_tokens" to m.prefillTokens, "static_shapes" to m.staticShapes, "total_bytes" to m.totalBytes,
        "chunks" to m.chunks.map { c ->
            mapOf("file" to c.file, "layers" to listOf(c.layerStart, c.layerStop), "embedding" to c.embedding, "head" to c.head,
                "inputs" to c.inputs.map { listOf(it.name, it.dtype, it.shape) }, "outputs" to c.outputs.map { listOf(it.name, it.dtype, it.shape) },
                "bytes" to c.bytes)
        },
    )
} catch (e: IllegalArgumentException) {
    mapOf("error" to e.message)
}

private fun tokenizer(req: Map<*, *>): Any {
    val t0 = System.nanoTime()
    val tok = Tokenizer.fromFile(File(req["path"] as String))
    val loadS = (System.nanoTime() - t0) / 1e9
    val texts = (req["texts"] as List<*>).map { it as String }
    val encoded = texts.map { tok.encode(it).toList() }
    val plain = texts.map { tok.encode(it, parseSpecial = false).toList() }
    val decoded = encoded.map { tok.decode(it.toIntArray()) }
    val streamed = encoded.map { ids -> val s = StreamDecoder(tok, skipSpecial = false); ids.joinToString("") { s.add(it) } + s.finish() }
    val chat = listOf(Message("system", "Be brief."), Message("user", "What is 2+2?"), Message("assistant", "4."), Message("user", "And 3+3?"))
    val chatText = ChatFormat.render(tok.chatFormat, chat)
    return mapOf("encoded" to encoded, "plain" to plain, "decoded" to decoded, "streamed" to streamed,
        "bos_id" to tok.bosId, "eos_ids" to tok.eosIds.sorted(), "vocab_size" to tok.vocabSize, "chat_format" to tok.chatFormat,
        "chat_text" to chatText, "chat_ids" to tok.encode(chatText).toList(), "load_s" to loadS)
}

private fun readF32(path: String): FloatArray {
    val bytes = File(path).readBytes()
    val buf = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
    return FloatArray(buf.capacity()) { buf.get(it) }
}

private fun writeF64(file: File, values: DoubleArray) {
    DataOutputStream(file.outputStream().buffered()).use { s ->
        val b = ByteBuffer.allocate(8 * values.size).order(ByteOrder.LITTLE_ENDIAN)
        for (v in values) b.putDouble(v)
        s.write(b.array())
    }
}

private fun writeF32(file: File, values: FloatArray) {
    val b = ByteBuffer.allocate(4 * values.size).order(ByteOrder.LITTLE_ENDIAN)
    for (v in values) b.putFloat(v)
    file.writeBytes(b.array())
}

private fun params(p: Map<*, *>) = SamplingParams(
    temperature = (p["temperature"] as? Number)?.toDouble() ?: 0.0, topK = (p["top_k"] as? Number)?.toInt() ?: 0,
    topP = (p["top_p"] as? Number)?.toDouble() ?: 1.0, minP = (p["min_p"] as? Number)?.toDouble() ?: 0.0,
    repetitionPenalty = (p["repetition_penalty"] as? Number)?.toDouble() ?: 1.0, seed = (p["seed"] as? Number)?.toLong())

private fun sampling(req: Map<*, *>, out: File): Any {
    val rows = (req["logits"] as List<*>).map { readF32(it as String) }
    return (req["cases"] as List<*>).mapIndexed { i, raw ->
        val case = raw as Map<*, *>
        val logits = rows[(case["row"] as Number).toInt()]
        val history = (case["history"] as List<*>).map { (it as Number).toInt() }.toIntArray()
        val sampler = Sampler(params(case["params"] as Map<*, *>))
        val probs = sampler.probabilities(logits, history)
        val file = File(out, "probs$i.f64")
        writeF64(file, probs)
        // Draws must land where the distribution has mass.
        val draws = List(200) { sampler.sample(logits, history) }
        mapOf("probs" to file.path, "pick" to sampler.sample(logits, history), "draws" to draws)
    }
}

private fun schedules(req: Map<*, *>): Any {
    val m = Manifest.read(File(req["manifest"] as String).parentFile)
    val tokenizerBytes = (req["tokenizer_bytes"] as Number).toLong()
    return mapOf(
        "fixed" to ChunkSchedule.fixedBytes(m, tokenizerBytes), "minimum" to ChunkSchedule.minimumBytes(m, tokenizerBytes),
        "chunk_bytes" to m.chunks.map { ChunkSchedule.chunkBytes(m, it) },
        "plans" to (req["budgets"] as List<*>).map { b ->
            try {
                val s = ChunkSchedule.plan(m, (b as Number).toLong(), tokenizerBytes)
                mapOf("resident" to s.resident, "streamed" to s.streamed, "peak" to s.peakBytes, "loaded_per_pass" to s.bytesLoadedPerPass)
            } catch (e: IllegalArgumentException) {
                mapOf("error" to e.message)
            }
        })
}

private fun chain(req: Map<*, *>, out: File): Any {
    val m = Manifest.read(File(req["manifest"] as String).parentFile)
    val budget = (req["budget"] as Number).toLong()
    val schedule = ChunkSchedule.plan(m, budget, 0)
    val trace = ArrayList<List<Any>>()
    val opened = ArrayList<Int>()
    val chain = ChunkChain(m, { c -> opened.add(c.index); SyntheticChunk(m, c, trace) }, schedule)
    val logits = ArrayList<String>()
    for ((i, step) in (req["steps"] as List<*>).withIndex()) {
        val s = step as Map<*, *>
        (s["rewind"] as? Number)?.let { chain.rewind(it.toInt()) }
        val ids = (s["feed"] as List<*>).map { (it as Number).toInt() }.toIntArray()
        val file = File(out, "chain_logits$i.f32")
        writeF32(file, chain.feed(ids))
        logits.add(file.path)
    }
    val caches = ArrayList<String>()
    chain.cache?.let { c ->
        for (layer in 0 until m.nLayers) for ((kind, arr) in listOf("k" to c.k, "v" to c.v)) {
            val buf = arr[layer]
            val file = File(out, "cache_${kind}_$layer.f32")
            writeF32(file, FloatArray(buf.capacity()) { buf.get(it) })
            caches.add(file.path)
        }
    }
    chain.close()
    return mapOf("trace" to trace, "logits" to logits, "caches" to caches, "pos" to chain.pos, "opened" to opened,
        "resident" to schedule.resident, "streamed" to schedule.streamed)
}

/** A conversation through ChunkedLlm, as the app holds one, with the formula chunks in place of ExecuTorch. */
private fun chat(req: Map<*, *>): Any {
    val dir = File(req["dir"] as String)
    val m = Manifest.read(dir)
    val budget = (req["budget"] as Number).toLong()
    val trace = ArrayList<List<Any>>()
    val refused = listOf("coreml" to budget, "executorch" to 1L).map { (target, b) ->
        try {
            ChunkedLlm.open(dir, target, b) { c -> SyntheticChunk(m, c, trace) }.close()
            null
        } catch (e: IllegalArgumentException) {
            e.message
        }
    }
    val llm = ChunkedLlm.open(dir, "executorch", budget) { c -> SyntheticChunk(m, c, trace) }
    val messages = ArrayList<Message>()
    val turns = (req["turns"] as List<*>).map { turn ->
        messages.add(Message("user", turn as String))
        val pieces = ArrayList<String>()
        val stats = llm.chat(messages, (req["max_tokens"] as Number).toInt(), SamplingParams(temperature = 0.0)) { pieces.add(it) }
        messages.add(Message("assistant", pieces.joinToString("").trim()))
        mapOf("pieces" to pieces, "prompt_tokens" to stats.promptTokens, "reused" to stats.reusedTokens,
            "generated" to stats.generatedTokens, "stop" to stats.stopReason)
    }
    val s = llm.schedule
    val counts = mapOf("loads" to llm.loads, "passes" to llm.passes, "resident" to s.resident, "streamed" to s.streamed)
    llm.close()
    return mapOf("turns" to turns, "trace" to trace, "refused" to refused) + counts
}

internal fun toJson(v: Any?): String = when (v) {
    null -> "null"
    is String -> buildString {
        append('"')
        for (c in v) when {
            c == '"' -> append("\\\""); c == '\\' -> append("\\\\"); c == '\n' -> append("\\n")
            c < ' ' -> append(String.format("\\u%04x", c.code))
            else -> append(c)
        }
        append('"')
    }
    is Boolean, is Int, is Long -> v.toString()
    is Number -> if (v.toDouble().isFinite()) v.toString() else "null"
    is Map<*, *> -> v.entries.joinToString(",", "{", "}") { toJson(it.key.toString()) + ":" + toJson(it.value) }
    is Iterable<*> -> v.joinToString(",", "[", "]") { toJson(it) }
    is IntArray -> toJson(v.toList())
    else -> toJson(v.toString())
}
