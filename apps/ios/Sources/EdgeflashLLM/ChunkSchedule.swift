import Foundation

/// Which chunks stay loaded and which are loaded for each pass and released after it, so that
/// everything held fits one byte budget (the same rules as the Android app's ChunkSchedule.kt):
/// resident chunks + the largest streamed chunk + caches, activations, logits and tokenizer.
/// Streaming needs kv = "io": a chunk keeping its cache in Core ML states cannot be released.
public struct ChunkSchedule {
    public let resident: [Int]
    public let streamed: [Int]
    public let peakBytes: Int
    public let bytesLoadedPerPass: Int

    public static func fixedBytes(_ m: Manifest, tokenizerBytes: Int) -> Int {
        let caches = m.cache.mode == "io" ? 2 * m.spec.nLayers * m.cache.layerBytes : 0
        return caches + 2 * m.prefillTokens * m.spec.dModel * 4 + 2 * m.spec.vocabSize * 4 + tokenizerBytes
    }

    public static func chunkBytes(_ m: Manifest, _ c: ChunkEntry) -> Int {
        c.bytes + (m.cache.mode == "state" ? 2 * c.layerRange.count * m.cache.layerBytes : 0)
    }

    public static func plan(_ m: Manifest, budget: Int, tokenizerBytes: Int) throws -> ChunkSchedule {
        let fixed = fixedBytes(m, tokenizerBytes: tokenizerBytes)
        let sizes = m.chunks.map { chunkBytes(m, $0) }
        let all = sizes.reduce(0, +)
        let minimum = fixed + (m.cache.mode == "state" ? all : (sizes.max() ?? 0))
        guard budget >= minimum else {
            throw LLMError.budget(String(format: "memory budget %.1f MiB is too small: the minimum is %.1f MiB",
                                         Double(budget) / 1048576, Double(minimum) / 1048576))
        }
        let n = sizes.count
        if m.cache.mode == "state" || fixed + all <= budget {
            return ChunkSchedule(resident: Array(0..<n), streamed: [], peakBytes: fixed + all, bytesLoadedPerPass: 0)
        }
        // Exact search over which chunks stay (exports have a handful of chunks).
        var best = (mask: 0, streamed: Int.max, peak: 0)
        for mask in 0..<(1 << n) {
            var resident = 0, streamed = 0, largest = 0
            for i in 0..<n {
                if mask & (1 << i) != 0 { resident += sizes[i] } else { streamed += sizes[i]; largest = max(largest, sizes[i]) }
            }
            let peak = fixed + resident + largest
            if peak <= budget && streamed < best.streamed { best = (mask, streamed, peak) }
        }
        return ChunkSchedule(resident: (0..<n).filter { best.mask & (1 << $0) != 0 },
                             streamed: (0..<n).filter { best.mask & (1 << $0) == 0 },
                             peakBytes: best.peak, bytesLoadedPerPass: best.streamed)
    }
}

/// How appending `count` tokens at `pos` splits into passes (export/targets/runner.py's rule):
/// prefill pieces padded to the method's token count, decode for single tokens or near the end.
public struct Pass: Equatable {
    public let method: String
    public let pos: Int
    public let width: Int
    public let real: Int
}

public func feedPlan(pos: Int, count: Int, prefillTokens: Int, cacheLength: Int) -> [Pass] {
    var out: [Pass] = []
    var p = pos, i = 0
    while i < count {
        let rest = count - i
        let take = min(prefillTokens, rest)
        if rest == 1 || p + prefillTokens > cacheLength {
            out.append(Pass(method: "decode", pos: p, width: 1, real: 1)); p += 1; i += 1
        } else {
            out.append(Pass(method: "prefill", pos: p, width: prefillTokens, real: take)); p += take; i += take
        }
    }
    return out
}
