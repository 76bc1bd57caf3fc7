package org.edgeflash.chat

import android.app.ActivityManager
import android.os.Bundle
import android.widget.Button
import android.widget.EditText
import android.widget.ScrollView
import android.widget.TextView
import androidx.appcompat.app.AppCompatActivity
import org.edgeflash.llm.ChunkSchedule
import org.edgeflash.llm.ChunkedLlm
import org.edgeflash.llm.Message
import org.edgeflash.llm.SamplingParams
import java.io.File
import java.util.concurrent.Executors

/**
 * A chat screen on a chunked ExecuTorch export pushed to the app's files directory
 * (/sdcard/Android/data/org.edgeflash.chat/files/model). The model runs on one background
 * thread; the reply streams into the transcript with tokens/s under it.
 */
class MainActivity : AppCompatActivity() {
    private val worker = Executors.newSingleThreadExecutor()
    private var llm: ChunkedLlm? = null
    private val messages = ArrayList<Message>()
    private lateinit var status: TextView
    private lateinit var transcript: TextView
    private lateinit var scroll: ScrollView
    private lateinit var input: EditText
    private lateinit var send: Button

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        status = findViewById(R.id.status)
        transcript = findViewById(R.id.transcript)
        scroll = findViewById(R.id.scroll)
        input = findViewById(R.id.input)
        send = findViewById(R.id.send)
        send.setOnClickListener { onSend() }
        findViewById<Button>(R.id.reset).setOnClickListener {
            messages.clear(); transcript.text = ""
            worker.execute { llm?.reset() }
        }
        load()
    }

    /** Budget: what the system says is available, less a margin for the app and the UI. */
    private fun budgetBytes(): Long {
        val info = ActivityManager.MemoryInfo()
        (getSystemService(ACTIVITY_SERVICE) as ActivityManager).getMemoryInfo(info)
        return maxOf(0L, info.availMem - info.threshold - 64L * 1024 * 1024)
    }

    private fun load() {
        val dir = File(getExternalFilesDir(null), "model")
        if (!File(dir, "manifest.json").exists()) {
            status.text = getString(R.string.no_model, dir.absolutePath)
            return
        }
        status.text = getString(R.string.loading, dir.absolutePath)
        val budget = budgetBytes()
        val threads = Runtime.getRuntime().availableProcessors().coerceIn(1, 4)
        worker.execute {
            val text = try {
                val model = ChunkedLlm.open(dir, "executorch", budget) { chunk -> ExecuTorchChunk(dir, chunk, threads) }
                llm = model
                val s = model.schedule
                "${model.manifest.modelName}: ${model.manifest.chunks.size} chunks, ${s.resident.size} resident, " +
                    "${s.streamed.size} streamed; budget ${ChunkSchedule.mib(budget)}, peak ${ChunkSchedule.mib(s.peakBytes)}"
            } catch (e: Exception) {
                "Could not load the model: ${e.message}"
            }
            runOnUiThread { status.text = text; send.isEnabled = llm != null }
        }
    }

    private fun onSend() {
        val model = llm ?: return
        val text = input.text.toString().trim()
        if (text.isEmpty()) return
        input.setText("")
        send.isEnabled = false
        messages.add(Message("user", text))
        transcript.append("You: $text\n\nModel: ")
        worker.execute {
            val reply = StringBuilder()
            val line = try {
                val stats = model.chat(messages, maxTokens = 256, params = SamplingParams(temperature = 0.0)) { piece ->
                    reply.append(piece)
                    runOnUiThread { transcript.append(piece); scroll.post { scroll.fullScroll(ScrollView.FOCUS_DOWN) } }
                }
                String.format("%d tokens, prefill %.1f tok/s, decode %.1f tok/s (%s), %d chunk loads",
                    stats.generatedTokens, stats.prefillTokS, stats.decodeTokS, stats.stopReason, model.loads)
            } catch (e: Exception) {
                "error: ${e.message}"
            }
            messages.add(Message("assistant", reply.toString().trim()))
            runOnUiThread { transcript.append("\n\n"); status.text = line; send.isEnabled = true }
        }
    }

    override fun onDestroy() {
        worker.execute { llm?.close() }
        worker.shutdown()
        super.onDestroy()
    }
}
