import Foundation

/// Byte-pair encoding of one word with the rules of runtime/tokenizer/bpe.py: the adjacent pair
/// of lowest rank merges first, leftmost on ties. Ranks come from the merge list ("merges"), or
/// from a SentencePiece vocabulary: a pair merges when a+b is a token, ranked by its id
/// ("token_order") or score ("scores"), then longer left piece first.
final class BPE {
    let vocab: [String?]
    var ids: [String: Int] = [:]
    private let order: String
    private var mergeRank: [Int64: (rank: Int, merged: Int)] = [:]
    private let scores: [Double]?
    private let byteFallback: Bool
    private let fuseUnk: Bool
    private let unkId: Int?
    private var byteIds = [Int](repeating: -1, count: 256)

    init(vocab: [String?], order: String, merges: [(String, String)]?, scores: [Double]?, byteFallback: Bool,
         unkToken: String?, fuseUnk: Bool) throws {
        self.vocab = vocab
        self.order = order
        self.scores = scores
        self.byteFallback = byteFallback
        self.fuseUnk = fuseUnk
        for (id, text) in vocab.enumerated() { if let t = text { ids[t] = id } } // a text listed twice keeps its larger id
        unkId = unkToken.flatMap { ids[$0] }
        for b in 0..<256 { if let id = ids[String(format: "<0x%02X>", b)] { byteIds[b] = id } }
        if order == "merges" {
            guard let merges else { throw LLMError.badInput("tokenizer: merge_order merges needs a merges list") }
            for (rank, (l, r)) in merges.enumerated() {
                guard let li = ids[l], let ri = ids[r], let m = ids[l + r] else {
                    throw LLMError.badInput("tokenizer: merge #\(rank) (\(l), \(r)) uses a piece not in the vocabulary")
                }
                let key = Int64(li) * Int64(vocab.count) + Int64(ri)
                if mergeRank[key] == nil { mergeRank[key] = (rank, m) }
            }
        }
    }

    /// (rank tuple, merged id); lower ranks merge first.
    private func pair(_ l: Int, _ lt: String, _ r: Int, _ rt: String) -> ([Double], Int)? {
        if order == "merges" {
            guard let found = mergeRank[Int64(l) * Int64(vocab.count) + Int64(r)] else { return nil }
            return ([Double(found.rank)], found.merged)
        }
        guard let merged = ids[lt + rt] else { return nil }
        let ll = Double(lt.unicodeScalars.count), rl = Double(rt.unicodeScalars.count)
        if let scores { return ([-scores[merged], -ll, -rl, Double(merged)], merged) }
        return ([Double(merged), -ll], merged)
    }

    func encode(word: String) -> [Int] {
        var symbols: [Int] = []
        var pendingUnk = false
        for scalar in word.unicodeScalars {
            let ch = String(scalar)
            if let id = ids[ch] {
                if pendingUnk, let u = unkId { symbols.append(u); pendingUnk = false }
                symbols.append(id)
                continue
            }
            if byteFallback {
                let bytes = Array(ch.utf8).map { byteIds[Int($0)] }
                if bytes.allSatisfy({ $0 >= 0 }) { symbols += bytes; continue }
            }
            guard let u = unkId else { continue } // no unknown token: dropped, as the reference does
            if pendingUnk && !fuseUnk { symbols.append(u) }
            pendingUnk = true
        }
        if pendingUnk, let u = unkId { symbols.append(u) }
        guard symbols.count > 1 else { return symbols }
        // Merge the best pair until none is left; a linear scan per merge is fine for word-sized input.
        var texts = symbols.map { vocab[$0] ?? "" }
        while true {
            var best: (rank: [Double], at: Int, merged: Int)?
            for i in 0..<(symbols.count - 1) {
                if let (rank, merged) = pair(symbols[i], texts[i], symbols[i + 1], texts[i + 1]),
                   best == nil || rank.lexicographicallyPrecedes(best!.rank) {
                    best = (rank, i, merged)
                }
            }
            guard let b = best else { return symbols }
            symbols[b.at] = b.merged
            texts[b.at] += texts[b.at + 1]
            symbols.remove(at: b.at + 1)
            texts.remove(at: b.at + 1)
        }
    }
}
