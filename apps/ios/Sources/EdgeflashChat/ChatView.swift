import SwiftUI

struct ChatView: View {
    @EnvironmentObject var chat: ChatModel
    @State private var draft = ""

    var body: some View {
        VStack(alignment: .leading, spacing: 8) {
            Text(chat.status).font(.caption).foregroundStyle(.secondary)
            ScrollViewReader { proxy in
                ScrollView {
                    LazyVStack(alignment: .leading, spacing: 12) {
                        ForEach(chat.lines) { line in
                            VStack(alignment: .leading) {
                                Text(line.role).font(.caption.bold())
                                Text(line.text).textSelection(.enabled)
                            }.id(line.id)
                        }
                    }
                }
                .onChange(of: chat.lines.last?.text) { proxy.scrollTo(chat.lines.last?.id, anchor: .bottom) }
            }
            HStack {
                TextField("Message", text: $draft, axis: .vertical).textFieldStyle(.roundedBorder)
                Button("Send") { chat.send(draft); draft = "" }.disabled(chat.busy || draft.isEmpty)
                Button("New chat") { chat.reset() }.disabled(chat.busy)
            }
        }
        .padding()
    }
}
