import CoreML
import Foundation

/// Numbers a reply reports (names as `edgeflash generate --json`).
public struct GenerationStats {
    public let promptTokens: Int
    public let generatedTokens: Int
    public let prefillSeconds: Double
    public let decodeSeconds: Double
    public let stopReason: String // "stop", "length" or "context"
    public var decodeTokS: Double { decodeSeconds > 0 && generatedTokens > 1 ? Double(generatedTokens - 1) / decodeSeconds : 0 }
    public var prefillTokS: Double { prefillSeconds > 0 ? Double(promptTokens) / prefillSeconds : 0 }
}

/// A chunked Core ML export (`edgeflash export ... --target coreml --chunks N`) as one model:
/// token ids into chunk 0 (it holds the embedding), the hidden state [T, d_model] from each chunk
/// to the next, logits [1, vocab] of the last real token out of the last chunk (the head), as
/// export/targets/runner.py chains them. With kv = "state" the caches live in each chunk's
/// MLState; with kv = "io" this class holds them and chunks can be loaded one at a time.
public final class ChunkedLLM: @unchecked Sendable {
    public let manifest: Manifest
    public let tokenizer: Tokenizer
    public let schedule: ChunkSchedule
    private let compiled: [URL]
    private var chunks: [CoreMLChunk?]
    private var caches: [[MLMultiArray]] = [] // kv = io: per layer [K, V], each [Hkv, L, D] float32
    private var fed: [Int] = [] // ids whose entries the caches hold
    private let computeUnits: MLComputeUnits
    public private(set) var pos = 0

    public static func open(directory: URL, budgetBytes: Int, computeUnits: MLComputeUnits = .cpuAndNeuralEngine) async throws -> ChunkedLLM {
        let manifest = try Manifest.read(from: directory)
        guard manifest.target == "coreml" else { throw LLMError.badInput("\(directory.path): target is \(manifest.target); this app runs Core ML exports") }
        let tokURL = directory.appendingPathComponent(manifest.tokenizer.file)
        let tokenizer = try Tokenizer(url: tokURL)
        let tokBytes = 2 * ((try? FileManager.default.attributesOfItem(atPath: tokURL.path)[.size] as? Int) ?? 0)
        let schedule = try ChunkSchedule.plan(manifest, budget: budgetBytes, tokenizerBytes: tokBytes)
        var compiled: [URL] = []
        for c in manifest.chunks { compiled.append(try await CoreMLChunk.compiledURL(for: directory.appendingPathComponent(c.file))) }
        return try ChunkedLLM(manifest, tokenizer, schedule, compiled, computeUnits)
    }

    private init(_ m: Manifest, _ t: Tokenizer, _ s: ChunkSchedule, _ compiled: [URL], _ units: MLComputeUnits) throws {
        (manifest, tokenizer, schedule, self.compiled, computeUnits) = (m, t, s, compiled, units)
        chunks = Array(repeating: nil, count: m.chunks.count)
        if m.cache.mode == "io" {
            caches = try (0..<m.spec.nLayers).map { _ in
                try (0..<2).map { _ in try MLMultiArray(shape: m.cache.shape.map { NSNumber(value: $0) }, dataType: .float32) }
            }
        }
        for i in s.resident { chunks[i] = chunk(i) }
    }

    private func chunk(_ i: Int) -> CoreMLChunk {
        chunks[i] ?? CoreMLChunk(compiled: compiled[i], usesState: manifest.cache.mode == "state", computeUnits: computeUnits)
    }

    /// A new conversation. Stale cache slots need no clearing: the chunks' masks hide every slot
    /// at or after the first new position until it is written again.
    public func reset() { pos = 0; fed = [] }

    /// Append `ids`; returns the logits after the last one.
    public func feed(_ ids: [Int]) throws -> [Float] {
        guard pos + ids.count <= manifest.cache.length else {
            throw LLMError.runtime("context full: \(pos) cached + \(ids.count) new tokens > \(manifest.cache.length)")
        }
        var logits: [Float] = []
        var i = 0
        for pass in feedPlan(pos: pos, count: ids.count, prefillTokens: manifest.prefillTokens, cacheLength: manifest.cache.length) {
            var tokens = [Int](repeating: 0, count: pass.width) // padding writes only slots not yet in use
            for t in 0..<pass.real { tokens[t] = ids[i + t] }
            logits = try call(pass, tokens)
            i += pass.real
        }
        fed += ids
        return logits
    }

    private func call(_ pass: Pass, _ tokens: [Int]) throws -> [Float] {
        let positions = (0..<pass.width).map { pass.pos + $0 }
        var hidden: MLMultiArray?
        for (i, entry) in manifest.chunks.enumerated() {
            let c = chunk(i)
            var inputs: [String: MLMultiArray] = [:]
            let first = entry.inputs[0].name // "tokens" or "hidden"
            inputs[first] = try hidden ?? MLMultiArray.make(tokens, shape: [pass.width], type: c.dataType(pass.method, input: first))
            inputs["input_pos"] = try MLMultiArray.make(positions, shape: [pass.width], type: c.dataType(pass.method, input: "input_pos"))
            if entry.head { inputs["last"] = try MLMultiArray.make([pass.real - 1], shape: [1], type: c.dataType(pass.method, input: "last")) }
            if manifest.cache.mode == "io" {
                for layer in entry.layerRange { inputs["k_cache.\(layer)"] = caches[layer][0]; inputs["v_cache.\(layer)"] = caches[layer][1] }
            }
            let out = try c.run(pass.method, inputs)
            let name = entry.outputs[0].name // "hidden" or "logits"
            guard let x = out.featureValue(for: name)?.multiArrayValue else { throw LLMError.runtime("\(entry.file): no output \(name)") }
            hidden = x
            if manifest.cache.mode == "io" {
                for layer in entry.layerRange {
                    for (k, kind) in ["k", "v"].enumerated() {
                        guard let fresh = out.featureValue(for: "\(kind)_new.\(layer)")?.multiArrayValue else {
                            throw LLMError.runtime("\(entry.file): no output \(kind)_new.\(layer)")
                        }
                        write(caches[layer][k], fresh.floats(), width: pass.width, pos: pass.pos, real: pass.real)
                    }
                }
            }
            if !schedule.resident.contains(i) { chunks[i] = nil } // streamed: released after its turn
            else { chunks[i] = c }
        }
        pos += pass.real
        return hidden!.floats()
    }

    /// cache[h, pos + t, :] = fresh[h, t, :] for the real rows t.
    private func write(_ cache: MLMultiArray, _ fresh: [Float], width: Int, pos: Int, real: Int) {
        let (heads, length, dim) = (manifest.cache.shape[0], manifest.cache.shape[1], manifest.cache.shape[2])
        cache.withUnsafeMutableBufferPointer(ofType: Float.self) { p, _ in
            for h in 0..<heads { for t in 0..<real { for d in 0..<dim { p[(h * length + pos + t) * dim + d] = fresh[(h * width + t) * dim + d] } } }
        }
    }

    /// Reply to a conversation; the cached prefix of the previous turn is reused.
    public func chat(_ messages: [Message], maxTokens: Int, params: SamplingParams,
                     onText: (String) -> Void) throws -> GenerationStats {
        let prompt = tokenizer.encode(ChatFormat.render(tokenizer.chatFormat, messages))
        var keep = 0
        while keep < fed.count && keep < prompt.count - 1 && fed[keep] == prompt[keep] { keep += 1 }
        pos = keep
        fed = Array(fed.prefix(keep))
        let t0 = Date()
        var logits = try feed(Array(prompt[keep...]))
        let t1 = Date()
        var sampler = Sampler(params)
        var history = prompt, out: [Int] = []
        var text = StreamDecoder(tokenizer)
        var reason = "length"
        while true {
            let id = sampler.sample(logits, history: history)
            out.append(id); history.append(id)
            if tokenizer.eosIds.contains(id) { reason = "stop"; break }
            let piece = text.add(id)
            if !piece.isEmpty { onText(piece) }
            if out.count >= maxTokens { break }
            if pos >= manifest.cache.length { reason = "context"; break }
            logits = try feed([id])
        }
        return GenerationStats(promptTokens: prompt.count, generatedTokens: out.count,
                               prefillSeconds: t1.timeIntervalSince(t0), decodeSeconds: Date().timeIntervalSince(t1), stopReason: reason)
    }
}
