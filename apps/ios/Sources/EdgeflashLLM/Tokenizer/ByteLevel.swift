import Foundation

/// The GPT-2 byte alphabet: byte-level vocabularies (SmolLM2, Llama 3, Qwen2) spell each byte as
/// one printable character; printable Latin-1 bytes spell themselves, the other 68 move to code
/// points 256 and up, in byte order.
enum ByteLevel {
    static let charOf: [Character] = {
        let printable = Set(Array(33...126) + Array(0xA1...0xAC) + Array(0xAE...0xFF))
        var shifted = 0
        return (0..<256).map { b in
            if printable.contains(b) { return Character(Unicode.Scalar(UInt8(b))) }
            defer { shifted += 1 }
            return Character(Unicode.Scalar(UInt32(256 + shifted))!)
        }
    }()
    static let byteOf: [Character: UInt8] = Dictionary(uniqueKeysWithValues: charOf.enumerated().map { ($1, UInt8($0)) })

    static func spell(_ text: String) -> String { String(text.utf8.map { charOf[Int($0)] }) }

    /// The bytes a token in the alphabet stands for; other tokens ("<|im_start|>") stand for their own text.
    static func unspell(_ token: String) -> [UInt8] {
        var out: [UInt8] = []
        for c in token {
            guard let b = byteOf[c] else { return Array(token.utf8) }
            out.append(b)
        }
        return out
    }
}
