import Foundation

public struct Message {
    public let role: String // "system", "user" or "assistant"
    public let content: String
    public init(role: String, content: String) { self.role = role; self.content = content }
}

/// The prompt text of a conversation in the turn format the vocabulary shows: the text
/// runtime/tokenizer/chat.py writes for "gemma", "chatml" and "plain" (a model's Jinja template
/// is not run on the device).
public enum ChatFormat {
    public static func render(_ format: String, _ all: [Message], addGenerationPrompt: Bool = true) -> String {
        var s = ""
        switch format {
        case "gemma":
            var messages = all[...]
            var system = ""
            if let first = messages.first, first.role == "system" { system = first.content + "\n\n"; messages = messages.dropFirst() }
            for (i, m) in messages.enumerated() {
                let role = m.role == "assistant" ? "model" : m.role
                s += "<start_of_turn>\(role)\n\(i == 0 ? system : "")\(m.content.trimmingCharacters(in: .whitespacesAndNewlines))<end_of_turn>\n"
            }
            if addGenerationPrompt { s += "<start_of_turn>model\n" }
        case "chatml":
            for m in all { s += "<|im_start|>\(m.role)\n\(m.content)<|im_end|>\n" }
            if addGenerationPrompt { s += "<|im_start|>assistant\n" }
        default:
            for m in all { s += "\(m.role.prefix(1).uppercased() + m.role.dropFirst()): \(m.content)\n" }
            if addGenerationPrompt { s += "Assistant:" }
        }
        return s
    }
}
