// swift-tools-version:6.0
// EdgeflashLLM: a chunked Core ML export (`edgeflash export ... --target coreml --chunks N`) as
// one chat model. EdgeflashChat: a SwiftUI chat app on it (runs with `swift run` on macOS; on
// iOS, add both to an app target in Xcode, see README.md).
// Tools 6.0 (Xcode 16): the first PackageDescription that knows .iOS(.v18) and .macOS(.v15).
import PackageDescription

let package = Package(
    name: "EdgeflashChat",
    platforms: [.iOS(.v18), .macOS(.v15)], // MLState and multifunction models (what the exporter writes) need them
    products: [
        .library(name: "EdgeflashLLM", targets: ["EdgeflashLLM"]),
        .executable(name: "EdgeflashChat", targets: ["EdgeflashChat"]),
    ],
    targets: [
        .target(name: "EdgeflashLLM"),
        .executableTarget(name: "EdgeflashChat", dependencies: ["EdgeflashLLM"]),
    ],
    // Swift 5 language mode: the code was written before Swift 6's strict concurrency checking.
    swiftLanguageModes: [.v5]
)
