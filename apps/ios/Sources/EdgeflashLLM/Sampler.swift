import Foundation

/// The knobs and rules of runtime/sampler.py (temperature 0 = greedy).
public struct SamplingParams {
    public var temperature: Double = 0
    public var topK: Int = 0 // 0 = no limit
    public var topP: Double = 1
    public var minP: Double = 0 // drop tokens below minP * p(best token)
    public var repetitionPenalty: Double = 1 // > 1 discourages tokens already in the context

    public init(temperature: Double = 0, topK: Int = 0, topP: Double = 1, minP: Double = 0, repetitionPenalty: Double = 1) {
        precondition(temperature >= 0 && topK >= 0 && topP > 0 && topP <= 1 && minP >= 0 && minP < 1 && repetitionPenalty > 0)
        (self.temperature, self.topK, self.topP, self.minP, self.repetitionPenalty) = (temperature, topK, topP, minP, repetitionPenalty)
    }
}

public struct Sampler {
    public let params: SamplingParams
    private var rng = SystemRandomNumberGenerator()

    public init(_ params: SamplingParams) { self.params = params }

    /// Logits after the repetition penalty (CTRL-style: divide positive, multiply negative).
    public func adjusted(_ logits: [Float], history: [Int]) -> [Float] {
        let penalty = Float(params.repetitionPenalty)
        guard penalty != 1, !history.isEmpty else { return logits }
        var out = logits
        for id in Set(history) { out[id] = out[id] > 0 ? out[id] / penalty : out[id] * penalty }
        return out
    }

    /// The distribution sampling draws from, after every filter.
    public func probabilities(_ logits: [Float], history: [Int]) -> [Double] {
        let l = adjusted(logits, history: history)
        var out = [Double](repeating: 0, count: l.count)
        if params.temperature == 0 { out[Sampler.argmax(l)] = 1; return out }
        let scaled = l.map { Double($0) / params.temperature }
        var keep = [Bool](repeating: true, count: l.count)
        if params.topK > 0 && params.topK < l.count {
            let kth = scaled.sorted(by: >)[params.topK - 1] // ties with the k-th value stay
            for i in scaled.indices where scaled[i] < kth { keep[i] = false }
        }
        let top = scaled.max() ?? 0
        for i in scaled.indices where keep[i] { out[i] = exp(scaled[i] - top) }
        var sum = out.reduce(0, +)
        out = out.map { $0 / sum }
        if params.minP > 0 {
            let floor = params.minP * (out.max() ?? 0)
            out = out.map { $0 < floor ? 0 : $0 }
        }
        if params.topP < 1 {
            // The smallest prefix of tokens, most probable first (stable order), reaching topP.
            let order = out.indices.sorted { out[$0] != out[$1] ? out[$0] > out[$1] : $0 < $1 }
            var cumulative = 0.0, cut = order.count
            for (rank, id) in order.enumerated() {
                cumulative += out[id]
                if cumulative >= params.topP { cut = rank + 1; break }
            }
            for id in order[cut...] { out[id] = 0 }
        }
        sum = out.reduce(0, +)
        return out.map { $0 / sum }
    }

    public mutating func sample(_ logits: [Float], history: [Int]) -> Int {
        if params.temperature == 0 { return Sampler.argmax(adjusted(logits, history: history)) }
        let probs = probabilities(logits, history: history)
        var u = Double.random(in: 0..<1, using: &rng)
        var last = 0
        for (i, p) in probs.enumerated() where p > 0 {
            last = i
            u -= p
            if u < 0 { return i }
        }
        return last
    }

    /// Index of the largest value, the first on ties (numpy's argmax).
    public static func argmax(_ v: [Float]) -> Int {
        var best = 0
        for i in v.indices where v[i] > v[best] { best = i }
        return best
    }
}
