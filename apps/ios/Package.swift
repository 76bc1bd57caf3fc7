// swift-tools-version:5.10
// EdgeflashLLM: a chunked Core ML export (`edgeflash export ... --target coreml --chunks N`) as
// one chat model. EdgeflashChat: a SwiftUI chat app on it (runs with `swift run` on macOS; on
// iOS, add both to an app target in Xcode, see README.md).
import PackageDescription

let package = Package(
    name: "EdgeflashChat",
    platforms: [.iOS(.v18), .macOS(.v15)], // MLState (KV caches kept by Core ML) needs iOS 18 / macOS 15
    products: [
        .library(name: "EdgeflashLLM", targets: ["EdgeflashLLM"]),
        .executable(name: "EdgeflashChat", targets: ["EdgeflashChat"]),
    ],
    targets: [
        .target(name: "EdgeflashLLM"),
        .executableTarget(name: "EdgeflashChat", dependencies: ["EdgeflashLLM"]),
    ]
)
