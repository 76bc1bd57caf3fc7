import EdgeflashLLM
import Foundation
#if os(iOS)
import os // os_proc_available_memory
#endif

/// The conversation and the model behind the chat screen. The model is a chunked Core ML export
/// copied into the app's Documents/model folder (Finder / Files app, or `xcrun devicectl`).
@MainActor
final class ChatModel: ObservableObject {
    struct Line: Identifiable { let id = UUID(); let role: String; var text: String }

    @Published var lines: [Line] = []
    @Published var status = "Loading…"
    @Published var busy = true
    private var llm: ChunkedLLM?
    private var messages: [Message] = []

    var modelDirectory: URL {
        FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0].appendingPathComponent("model")
    }

    /// Budget: what the OS lets this app allocate now, less a margin for the UI.
    private func budget() -> Int {
        #if os(iOS)
        return max(0, Int(os_proc_available_memory()) - 64 << 20)
        #else
        return Int(ProcessInfo.processInfo.physicalMemory / 2)
        #endif
    }

    func load() async {
        let dir = modelDirectory
        guard FileManager.default.fileExists(atPath: dir.appendingPathComponent(Manifest.file).path) else {
            status = "No export in \(dir.path). Export with: edgeflash export gemma3-270m -o gemma-cm --target coreml --chunks 2"
            return
        }
        do {
            let model = try await ChunkedLLM.open(directory: dir, budgetBytes: budget())
            llm = model
            status = "\(model.manifest.model.name): \(model.manifest.chunks.count) chunks, \(model.schedule.streamed.count) streamed"
            busy = false
        } catch {
            status = "Could not load the model: \(error)"
        }
    }

    func send(_ text: String) {
        guard let llm, !busy, !text.isEmpty else { return }
        busy = true
        messages.append(Message(role: "user", content: text))
        lines.append(Line(role: "You", text: text))
        lines.append(Line(role: "Model", text: ""))
        let conversation = messages
        Task.detached(priority: .userInitiated) {
            var reply = ""
            let result: String
            do {
                let stats = try llm.chat(conversation, maxTokens: 256, params: SamplingParams()) { piece in
                    reply += piece
                    let shown = reply
                    Task { @MainActor in self.lines[self.lines.count - 1].text = shown }
                }
                result = String(format: "%d tokens, prefill %.1f tok/s, decode %.1f tok/s (%@)",
                                stats.generatedTokens, stats.prefillTokS, stats.decodeTokS, stats.stopReason)
            } catch {
                result = "error: \(error)"
            }
            let final = reply
            await MainActor.run {
                self.messages.append(Message(role: "assistant", content: final.trimmingCharacters(in: .whitespacesAndNewlines)))
                self.status = result
                self.busy = false
            }
        }
    }

    func reset() {
        messages = []
        lines = []
        llm?.reset()
    }
}
