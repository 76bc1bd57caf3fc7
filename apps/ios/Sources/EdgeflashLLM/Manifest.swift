import Foundation

/// `manifest.json` of an edgeflash target export, as export/targets/chunks.py writes it.
/// Every key is spelled out in CodingKeys (tests/apps/test_ios_sources.py checks them against
/// a manifest the exporter writes).
public struct Manifest: Decodable {
    public static let file = "manifest.json"
    public static let format = "edgeflash-target"
    public static let version = 1

    public let format: String
    public let version: Int
    public let target: String
    public let model: ModelInfo
    public let tokenizer: TokenizerInfo
    public let cache: CacheInfo
    public let methods: [String: MethodInfo]
    public let staticShapes: Bool
    public let chunks: [ChunkEntry]
    public let totalBytes: Int

    enum CodingKeys: String, CodingKey {
        case format = "format", version = "version", target = "target", model = "model", tokenizer = "tokenizer"
        case cache = "cache", methods = "methods", staticShapes = "static_shapes", chunks = "chunks"
        case totalBytes = "total_bytes"
    }

    public var prefillTokens: Int { methods["prefill"]?.tokens ?? 1 }
    public var spec: SpecInfo { model.spec }

    /// Reads and checks `dir/manifest.json`; errors name the file and what was expected.
    public static func read(from dir: URL) throws -> Manifest {
        let url = dir.appendingPathComponent(file)
        guard let data = try? Data(contentsOf: url) else {
            throw LLMError.badInput("\(dir.path): no \(file) (not an edgeflash target export)")
        }
        let m: Manifest
        do { m = try JSONDecoder().decode(Manifest.self, from: data) } catch {
            throw LLMError.badInput("\(url.path): \(error)")
        }
        guard m.format == format else { throw LLMError.badInput("\(url.path): format is \(m.format), expected \(format)") }
        guard m.version <= version else { throw LLMError.badInput("\(url.path): version \(m.version) is newer than this app reads (\(version))") }
        var next = 0
        for (i, c) in m.chunks.enumerated() {
            guard c.layers.count == 2, c.layers[0] == next, c.layers[1] > next else {
                throw LLMError.badInput("\(url.path): chunks[\(i)].layers = \(c.layers), expected to start at \(next)")
            }
            next = c.layers[1]
        }
        guard next == m.spec.nLayers else { throw LLMError.badInput("\(url.path): chunks cover \(next) layers of \(m.spec.nLayers)") }
        return m
    }
}

public struct ModelInfo: Decodable {
    public let name: String
    public let spec: SpecInfo
    enum CodingKeys: String, CodingKey { case name = "name", spec = "spec" }
}

/// The part of the model spec the app needs (the manifest holds the full ModelSpec).
public struct SpecInfo: Decodable {
    public let nLayers: Int
    public let dModel: Int
    public let vocabSize: Int
    public let nKvHeads: Int
    public let headDim: Int
    enum CodingKeys: String, CodingKey {
        case nLayers = "n_layers", dModel = "d_model", vocabSize = "vocab_size", nKvHeads = "n_kv_heads", headDim = "head_dim"
    }
}

public struct TokenizerInfo: Decodable {
    public let file: String
    public let bosId: Int?
    public let eosIds: [Int]
    enum CodingKeys: String, CodingKey { case file = "file", bosId = "bos_id", eosIds = "eos_ids" }
}

/// "state": the cache lives in the chunk (Core ML states, shared by prefill and decode);
/// "io": the app passes each layer's cache in and writes the returned new entries.
public struct CacheInfo: Decodable {
    public let mode: String
    public let length: Int
    public let shape: [Int] // [Hkv, length, head_dim]
    enum CodingKeys: String, CodingKey { case mode = "mode", length = "length", shape = "shape" }
    public var layerBytes: Int { shape.reduce(4, *) }
}

public struct MethodInfo: Decodable {
    public let tokens: Int
    enum CodingKeys: String, CodingKey { case tokens = "tokens" }
}

public struct ChunkEntry: Decodable {
    public let file: String
    public let layers: [Int] // [start, stop)
    public let embedding: Bool
    public let head: Bool
    public let inputs: [TensorEntry]
    public let outputs: [TensorEntry]
    public let bytes: Int
    enum CodingKeys: String, CodingKey {
        case file = "file", layers = "layers", embedding = "embedding", head = "head", inputs = "inputs"
        case outputs = "outputs", bytes = "bytes"
    }
    public var layerRange: Range<Int> { layers[0]..<layers[1] }
}

/// A method input or output; "T" in a shape stands for the method's token count (-1 here).
public struct TensorEntry: Decodable {
    public let name: String
    public let dtype: String
    public let shape: [Int]
    enum CodingKeys: String, CodingKey { case name = "name", dtype = "dtype", shape = "shape" }

    public init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        name = try c.decode(String.self, forKey: .name)
        dtype = try c.decode(String.self, forKey: .dtype)
        var dims = try c.nestedUnkeyedContainer(forKey: .shape)
        var out: [Int] = []
        while !dims.isAtEnd {
            if let n = try? dims.decode(Int.self) { out.append(n) } else { _ = try dims.decode(String.self); out.append(-1) }
        }
        shape = out
    }

    public func shape(tokens: Int) -> [Int] { shape.map { $0 == -1 ? tokens : $0 } }
}

public enum LLMError: Error, CustomStringConvertible {
    case badInput(String)
    case budget(String)
    case runtime(String)

    public var description: String {
        switch self {
        case .badInput(let s), .budget(let s), .runtime(let s): return s
        }
    }
}
