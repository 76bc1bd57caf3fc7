import Foundation

/// tokenizer.json pipeline steps (normalizer, pre_tokenizer, decoder): the kinds edgeflash's
/// tokenizer writes for Llama/Qwen2/Mistral (byte-level) and Gemma (SentencePiece) vocabularies.
typealias Normalize = (String) -> String
typealias PreTokenize = ((String, Bool)) -> [(String, Bool)] // (piece, begins the input)
typealias DecodeStep = ([String]) -> [String]

enum Steps {
    static let gpt2 = try! regex("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+")

    static func regex(_ p: String) throws -> NSRegularExpression { try NSRegularExpression(pattern: p) }

    static func pattern(_ spec: Any?, _ where_: String) throws -> NSRegularExpression {
        let m = spec as? [String: Any]
        if let s = m?["String"] as? String { return try regex(NSRegularExpression.escapedPattern(for: s)) }
        if let r = m?["Regex"] as? String { return try regex(r) }
        throw LLMError.badInput("tokenizer: \(where_): expected {\"String\": ...} or {\"Regex\": ...}")
    }

    /// The whole text as consecutive (start, end, isDelimiter) UTF-16 spans.
    static func spans(_ text: String, _ re: NSRegularExpression, invert: Bool = false) -> [(Int, Int, Bool)] {
        let ns = text as NSString
        var out: [(Int, Int, Bool)] = []
        var done = 0
        for m in re.matches(in: text, range: NSRange(location: 0, length: ns.length)) where m.range.length > 0 {
            if done != m.range.location { out.append((done, m.range.location, invert)) }
            out.append((m.range.location, m.range.location + m.range.length, !invert))
            done = m.range.location + m.range.length
        }
        if done != ns.length { out.append((done, ns.length, invert)) }
        return out
    }

    static func behave(_ spans: [(Int, Int, Bool)], _ behavior: String) -> [(Int, Int)] {
        switch behavior {
        case "Removed": return spans.filter { !$0.2 }.map { ($0.0, $0.1) }
        case "MergedWithNext":
            var slices: [(Int, Int)] = []
            var previous = false
            for (s, e, d) in spans.reversed() {
                if d && !previous && !slices.isEmpty { slices[slices.count - 1].0 = s } else { slices.append((s, e)) }
                previous = d
            }
            return slices.reversed()
        case "MergedWithPrevious", "Contiguous":
            var slices: [(Int, Int)] = []
            var previous = false
            for (s, e, d) in spans {
                let glue = behavior == "MergedWithPrevious" ? (d && !previous) : (d == previous)
                if glue && !slices.isEmpty { slices[slices.count - 1].1 = e } else { slices.append((s, e)) }
                previous = d
            }
            return slices
        default: return spans.map { ($0.0, $0.1) } // Isolated
        }
    }

    static func cut(_ piece: (String, Bool), _ slices: [(Int, Int)]) -> [(String, Bool)] {
        let ns = piece.0 as NSString
        return slices.filter { $0.1 > $0.0 }.map { (ns.substring(with: NSRange(location: $0.0, length: $0.1 - $0.0)), piece.1 && $0.0 == 0) }
    }

    static func normalizer(_ spec: Any?) throws -> Normalize? {
        guard let m = spec as? [String: Any] else { return nil }
        switch m["type"] as? String {
        case "Replace":
            let content = m["content"] as? String ?? ""
            if let literal = (m["pattern"] as? [String: Any])?["String"] as? String {
                return { $0.replacingOccurrences(of: literal, with: content) }
            }
            let re = try pattern(m["pattern"], "normalizer.pattern")
            return { re.stringByReplacingMatches(in: $0, range: NSRange(location: 0, length: ($0 as NSString).length),
                                                 withTemplate: NSRegularExpression.escapedTemplate(for: content)) }
        case "Prepend":
            let p = m["prepend"] as? String ?? ""
            return { $0.isEmpty ? $0 : p + $0 }
        case "NFC": return { $0.precomposedStringWithCanonicalMapping }
        case "NFKC": return { $0.precomposedStringWithCompatibilityMapping }
        case "Sequence":
            let steps = try (m["normalizers"] as? [Any] ?? []).compactMap { try normalizer($0) }
            return { text in steps.reduce(text) { $1($0) } }
        default: throw LLMError.badInput("tokenizer: normalizer type \(m["type"] ?? "nil") is not supported")
        }
    }

    static func preTokenizer(_ spec: Any?) throws -> PreTokenize? {
        guard let m = spec as? [String: Any] else { return nil }
        switch m["type"] as? String {
        case "ByteLevel":
            let addPrefix = m["add_prefix_space"] as? Bool ?? true
            let useRegex = m["use_regex"] as? Bool ?? true
            return { piece in
                let text = addPrefix && !piece.0.hasPrefix(" ") ? " " + piece.0 : piece.0
                let parts = useRegex ? cut((text, piece.1), behave(spans(text, gpt2), "Isolated")) : [(text, piece.1)]
                return parts.map { (ByteLevel.spell($0.0), $0.1) }
            }
        case "Split":
            let re = try pattern(m["pattern"], "pre_tokenizer.pattern")
            let behavior = m["behavior"] as? String ?? "Isolated"
            let invert = m["invert"] as? Bool ?? false
            return { cut($0, behave(spans($0.0, re, invert: invert), behavior)) }
        case "Metaspace":
            let r = m["replacement"] as? String ?? "\u{2581}"
            var scheme = m["prepend_scheme"] as? String ?? "always"
            if (m["add_prefix_space"] as? Bool) == false { scheme = "never" }
            let split = m["split"] as? Bool ?? true
            let marker = try regex(NSRegularExpression.escapedPattern(for: r))
            return { piece in
                var text = piece.0.replacingOccurrences(of: " ", with: r)
                if !text.hasPrefix(r) && (scheme == "always" || (scheme == "first" && piece.1)) { text = r + text }
                if !split { return text.isEmpty ? [] : [(text, piece.1)] }
                return cut((text, piece.1), behave(spans(text, marker), "MergedWithNext"))
            }
        case "Digits":
            let re = try regex("\\p{N}")
            let behavior = (m["individual_digits"] as? Bool) == true ? "Isolated" : "Contiguous"
            return { cut($0, behave(spans($0.0, re), behavior)) }
        case "Sequence":
            let steps = try (m["pretokenizers"] as? [Any] ?? []).compactMap { try preTokenizer($0) }
            return { piece in steps.reduce([piece]) { pieces, step in pieces.flatMap(step) } }
        default: throw LLMError.badInput("tokenizer: pre_tokenizer type \(m["type"] ?? "nil") is not supported")
        }
    }

    static func decoder(_ spec: Any?) throws -> [DecodeStep] {
        guard let m = spec as? [String: Any] else { return [{ [$0.joined()] }] }
        switch m["type"] as? String {
        case "Sequence": return try (m["decoders"] as? [Any] ?? []).flatMap { try decoder($0) }
        case "Replace":
            let literal = (m["pattern"] as? [String: Any])?["String"] as? String ?? ""
            let content = m["content"] as? String ?? ""
            return [{ $0.map { $0.replacingOccurrences(of: literal, with: content) } }]
        case "ByteFallback": return [byteFallback]
        case "Fuse": return [{ [$0.joined()] }]
        case "Strip":
            let c = Character(m["content"] as? String ?? " ")
            let start = m["start"] as? Int ?? 0, stop = m["stop"] as? Int ?? 0
            return [{ $0.map { t in
                var s = Substring(t)
                var n = 0
                while n < start, s.first == c { s = s.dropFirst(); n += 1 }
                n = 0
                while n < stop, s.last == c { s = s.dropLast(); n += 1 }
                return String(s)
            } }]
        case "Metaspace":
            let r = m["replacement"] as? String ?? "\u{2581}"
            let dropsFirst = (m["prepend_scheme"] as? String ?? "always") != "never" && (m["add_prefix_space"] as? Bool) != false
            return [{ $0.enumerated().map { $1.replacingOccurrences(of: r, with: $0 == 0 && dropsFirst ? "" : " ") } }]
        case "ByteLevel":
            return [{ tokens in [String(decoding: tokens.flatMap { ByteLevel.unspell($0) }, as: UTF8.self)] }]
        default: throw LLMError.badInput("tokenizer: decoder type \(m["type"] ?? "nil") is not supported")
        }
    }

    /// <0xXX> tokens back to bytes, decoded as UTF-8 (one U+FFFD per byte when invalid, as the reference).
    static func byteFallback(_ tokens: [String]) -> [String] {
        var out: [String] = []
        var pending: [UInt8] = []
        func flush() {
            guard !pending.isEmpty else { return }
            if let s = String(bytes: pending, encoding: .utf8) { out.append(s) } else { out += pending.map { _ in "\u{FFFD}" } }
            pending = []
        }
        for t in tokens {
            let u = Array(t.utf8)
            if u.count == 6, t.hasPrefix("<0x"), t.hasSuffix(">"), let b = UInt8(String(t.dropFirst(3).prefix(2)), radix: 16) {
                pending.append(b)
            } else { flush(); out.append(t) }
        }
        flush()
        return out
    }
}
