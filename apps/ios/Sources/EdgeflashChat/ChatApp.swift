import SwiftUI

@main
struct ChatApp: App {
    @StateObject private var chat = ChatModel()

    var body: some Scene {
        WindowGroup {
            ChatView().environmentObject(chat).task { await chat.load() }
        }
    }
}
