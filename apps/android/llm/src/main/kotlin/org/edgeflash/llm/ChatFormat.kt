package org.edgeflash.llm

/** One chat message; role is "system", "user" or "assistant". */
data class Message(val role: String, val content: String)

/**
 * The prompt text of a conversation in the turn format the vocabulary shows, with the same
 * text runtime/tokenizer/chat.py writes for "gemma", "chatml" and "plain". A model's Jinja
 * chat template is not run on the device; these formats are what the templates of the
 * supported families write.
 */
object ChatFormat {
    fun render(format: String, messages: List<Message>, addGenerationPrompt: Boolean = true): String = when (format) {
        "gemma" -> gemma(messages, addGenerationPrompt)
        "chatml" -> buildString {
            for (m in messages) append("<|im_start|>${m.role}\n${m.content}<|im_end|>\n")
            if (addGenerationPrompt) append("<|im_start|>assistant\n")
        }
        "plain" -> buildString {
            for (m in messages) append("${m.role.replaceFirstChar { it.uppercase() }}: ${m.content}\n")
            if (addGenerationPrompt) append("Assistant:")
        }
        else -> throw IllegalArgumentException("chat format '$format' is not gemma, chatml or plain")
    }

    private fun gemma(all: List<Message>, addGenerationPrompt: Boolean): String {
        var messages = all
        var system = ""
        if (messages.isNotEmpty() && messages[0].role == "system") { system = messages[0].content + "\n\n"; messages = messages.drop(1) }
        return buildString {
            for ((i, m) in messages.withIndex()) {
                val role = if (m.role == "assistant") "model" else m.role
                append("<start_of_turn>$role\n${if (i == 0) system else ""}${m.content.trim()}<end_of_turn>\n")
            }
            if (addGenerationPrompt) append("<start_of_turn>model\n")
        }
    }
}
