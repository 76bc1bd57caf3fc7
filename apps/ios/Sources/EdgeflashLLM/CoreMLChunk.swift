import CoreML
import Foundation

/// One chunk `.mlpackage` through Core ML: its functions "prefill" and "decode" share weights
/// and, with kv = "state", the KV-cache states, so one MLState (made once) goes to both, as
/// export/targets/sessions.py does on macOS.
final class CoreMLChunk {
    private let compiled: URL
    private var models: [String: MLModel] = [:]
    private(set) var state: MLState?
    private let usesState: Bool
    private let computeUnits: MLComputeUnits

    init(compiled: URL, usesState: Bool, computeUnits: MLComputeUnits) {
        self.compiled = compiled
        self.usesState = usesState
        self.computeUnits = computeUnits
    }

    /// The compiled form of a package (`.mlmodelc`), compiled once and kept in Caches.
    static func compiledURL(for package: URL) async throws -> URL {
        let caches = try FileManager.default.url(for: .cachesDirectory, in: .userDomainMask, appropriateFor: nil, create: true)
        let attributes = try FileManager.default.attributesOfItem(atPath: package.path)
        let stamp = Int((attributes[.modificationDate] as? Date)?.timeIntervalSince1970 ?? 0)
        let target = caches.appendingPathComponent("\(package.deletingPathExtension().lastPathComponent)-\(stamp).mlmodelc")
        if FileManager.default.fileExists(atPath: target.path) { return target }
        let built = try await MLModel.compileModel(at: package)
        try? FileManager.default.removeItem(at: target)
        try FileManager.default.moveItem(at: built, to: target)
        return target
    }

    private func model(_ function: String) throws -> MLModel {
        if let m = models[function] { return m }
        let config = MLModelConfiguration()
        config.functionName = function
        config.computeUnits = computeUnits
        let m = try MLModel(contentsOf: compiled, configuration: config)
        models[function] = m
        if usesState && state == nil { state = m.makeState() }
        return m
    }

    func run(_ function: String, _ inputs: [String: MLMultiArray]) throws -> MLFeatureProvider {
        let m = try model(function)
        let provider = try MLDictionaryFeatureProvider(dictionary: inputs.mapValues { MLFeatureValue(multiArray: $0) })
        if let state { return try m.prediction(from: provider, using: state, options: MLPredictionOptions()) }
        return try m.prediction(from: provider)
    }

    /// The element type the model declares for an input (Core ML takes int64 ids as int32).
    func dataType(_ function: String, input: String) throws -> MLMultiArrayDataType {
        try model(function).modelDescription.inputDescriptionsByName[input]?.multiArrayConstraint?.dataType ?? .float32
    }
}

extension MLMultiArray {
    /// Values as Float, whatever the array's element type.
    func floats() -> [Float] {
        switch dataType {
        case .float16: return withUnsafeBufferPointer(ofType: Float16.self) { $0.map { Float($0) } }
        case .double: return withUnsafeBufferPointer(ofType: Double.self) { $0.map { Float($0) } }
        default: return withUnsafeBufferPointer(ofType: Float.self) { Array($0) }
        }
    }

    static func make(_ values: [Int], shape: [Int], type: MLMultiArrayDataType) throws -> MLMultiArray {
        let a = try MLMultiArray(shape: shape.map { NSNumber(value: $0) }, dataType: type)
        for (i, v) in values.enumerated() { a[i] = NSNumber(value: v) }
        return a
    }

    static func make(_ values: [Float], shape: [Int]) throws -> MLMultiArray {
        let a = try MLMultiArray(shape: shape.map { NSNumber(value: $0) }, dataType: .float32)
        a.withUnsafeMutableBufferPointer(ofType: Float.self) { p, _ in for i in values.indices { p[i] = values[i] } }
        return a
    }
}
