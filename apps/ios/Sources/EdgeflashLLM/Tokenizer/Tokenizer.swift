import Foundation

/// Keys read from the export's tokenizer.json ("edgeflash.tokenizer" spec, runtime/tokenizer/spec.py).
/// tests/apps/test_ios_sources.py checks that each exists in a tokenizer file the exporter writes.
enum SpecKeys {
    static let format = "format", version = "version", model = "model", addedTokens = "added_tokens"
    static let normalizer = "normalizer", preTokenizer = "pre_tokenizer", decoder = "decoder"
    static let prefixIds = "prefix_ids", suffixIds = "suffix_ids", specialTokens = "special_tokens", endIds = "end_ids"
}

enum ModelKeys {
    static let vocab = "vocab", mergeOrder = "merge_order", merges = "merges", byteFallback = "byte_fallback"
    static let unkToken = "unk_token", fuseUnk = "fuse_unk"
}

/// Text <-> token ids with the stages of the Python tokenizer: cut out added tokens, normalize,
/// pre-tokenize, BPE each word, prefix (BOS) and suffix ids around the result.
public final class Tokenizer {
    private let bpe: BPE
    private let normalize: Normalize?
    private let preTokenize: PreTokenize?
    private let decoders: [DecodeStep]
    private let added: [String: (id: Int, special: Bool)] // content -> token (non-normalized added tokens)
    private let addedLengths: [Character: [Int]] // first character -> content lengths, longest first
    private let special: Set<Int>
    private let overlay: [Int: String]
    private let prefixIds: [Int], suffixIds: [Int]
    public let eosIds: Set<Int>
    public let bosId: Int?
    /// "gemma", "chatml" or "plain": the turn format the vocabulary shows.
    public let chatFormat: String

    public init(url: URL) throws {
        guard let spec = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any],
              spec[SpecKeys.format] as? String == "edgeflash.tokenizer" else {
            throw LLMError.badInput("\(url.path): not an edgeflash tokenizer (format edgeflash.tokenizer)")
        }
        let model = spec[SpecKeys.model] as? [String: Any] ?? [:]
        let vocab = (model[ModelKeys.vocab] as? [Any] ?? []).map { $0 as? String }
        let merges: [(String, String)]? = (model[ModelKeys.merges] as? [Any])?.compactMap { m in
            if let pair = m as? [String], pair.count == 2 { return (pair[0], pair[1]) }
            if let s = m as? String, let space = s.firstIndex(of: " ") { return (String(s[..<space]), String(s[s.index(after: space)...])) }
            return nil
        }
        bpe = try BPE(vocab: vocab, order: model[ModelKeys.mergeOrder] as? String ?? "merges", merges: merges,
                      scores: (model["scores"] as? [NSNumber])?.map { $0.doubleValue },
                      byteFallback: model[ModelKeys.byteFallback] as? Bool ?? false,
                      unkToken: model[ModelKeys.unkToken] as? String, fuseUnk: model[ModelKeys.fuseUnk] as? Bool ?? false)
        normalize = try Steps.normalizer(spec[SpecKeys.normalizer])
        preTokenize = try Steps.preTokenizer(spec[SpecKeys.preTokenizer])
        decoders = try Steps.decoder(spec[SpecKeys.decoder])
        var added: [String: (Int, Bool)] = [:], lengths: [Character: Set<Int>] = [:], special = Set<Int>(), overlay: [Int: String] = [:]
        for case let t as [String: Any] in spec[SpecKeys.addedTokens] as? [Any] ?? [] {
            guard let id = t["id"] as? Int, let content = t["content"] as? String, !content.isEmpty else { continue }
            let isSpecial = t["special"] as? Bool ?? false
            if isSpecial { special.insert(id) }
            // Normalized added tokens are matched by BPE's vocabulary after normalization here.
            if (t["normalized"] as? Bool ?? false) { continue }
            added[content] = (id, isSpecial)
            lengths[content.first!, default: []].insert(content.count)
            if id >= vocab.count || vocab[id] != content { overlay[id] = content }
        }
        self.added = added
        self.addedLengths = lengths.mapValues { $0.sorted(by: >) }
        self.special = special
        self.overlay = overlay
        prefixIds = spec[SpecKeys.prefixIds] as? [Int] ?? []
        suffixIds = spec[SpecKeys.suffixIds] as? [Int] ?? []
        let tokens = spec[SpecKeys.specialTokens] as? [String: Any] ?? [:]
        let ids = bpe.ids
        bosId = (tokens["bos_token"] as? String).flatMap { added[$0]?.0 ?? ids[$0] }
        let eos = (tokens["eos_token"] as? String).flatMap { added[$0]?.0 ?? ids[$0] }
        eosIds = Set(spec[SpecKeys.endIds] as? [Int] ?? []).union(eos.map { [$0] } ?? [])
        func has(_ t: String) -> Bool { added[t] != nil || ids[t] != nil }
        chatFormat = has("<start_of_turn>") && has("<end_of_turn>") ? "gemma" : has("<|im_start|>") && has("<|im_end|>") ? "chatml" : "plain"
    }

    /// Ids of `text`; parseSpecial = false keeps user text from injecting control tokens.
    public func encode(_ text: String, parseSpecial: Bool = true) -> [Int] {
        var ids = prefixIds
        var plain = ""
        var atStart = true
        func flush() {
            if !plain.isEmpty { encodePlain(plain, atStart: atStart, into: &ids) }
            plain = ""
        }
        let chars = Array(text)
        var i = 0
        while i < chars.count {
            var matched = false
            for len in addedLengths[chars[i]] ?? [] where i + len <= chars.count {
                if let t = added[String(chars[i..<(i + len)])], parseSpecial || !t.special {
                    flush(); atStart = false
                    ids.append(t.id); i += len; matched = true
                    break
                }
            }
            if !matched {
                if plain.isEmpty && i > 0 { atStart = false }
                plain.append(chars[i]); i += 1
            }
        }
        flush()
        return ids + suffixIds
    }

    private func encodePlain(_ input: String, atStart: Bool, into ids: inout [Int]) {
        let text = normalize?(input) ?? input
        let words = preTokenize?((text, atStart)) ?? [(text, atStart)]
        for (word, _) in words { ids += bpe.encode(word: word) }
    }

    public func decode(_ ids: [Int], skipSpecial: Bool = true) -> String {
        var texts: [String] = []
        for id in ids where !(skipSpecial && special.contains(id)) {
            if let t = overlay[id] ?? (id < bpe.vocab.count ? bpe.vocab[id] : nil) { texts.append(t) }
        }
        return decoders.reduce(texts) { $1($0) }.joined()
    }
}

/// Text of a growing reply, handed out once settled: a token may hold part of a UTF-8
/// character, so the reply is decoded whole and text ending in U+FFFD waits for the next token.
public struct StreamDecoder {
    private let tokenizer: Tokenizer
    private var ids: [Int] = []
    private var emitted = 0

    public init(_ tokenizer: Tokenizer) { self.tokenizer = tokenizer }

    public mutating func add(_ id: Int) -> String {
        ids.append(id)
        let text = tokenizer.decode(ids)
        guard !text.hasSuffix("\u{FFFD}"), text.count >= emitted else { return "" }
        defer { emitted = text.count }
        return String(text.dropFirst(emitted))
    }
}
