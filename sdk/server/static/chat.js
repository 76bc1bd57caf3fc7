// edgeflash web chat: talks to the OpenAI-compatible API of the server that serves this page.
// Replies stream over server-sent events from POST /v1/chat/completions; the last chunk carries
// the server's own statistics (tokens/s, memory) in its "edgeflash" field.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];  // [{role, content}] sent with every request: the server keeps no history
let modelId = null;
let controller = null;    // aborts the running request (the server then cancels the generation)

function setState(state) {
  document.body.dataset.state = state;
  const busy = state === "busy";
  $("send").disabled = busy || modelId === null;
  $("stop").hidden = !busy;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

const mib = (bytes) => (bytes / 1048576).toFixed(0) + " MiB";

function addMessage(role, text) {
  $("empty")?.remove();
  const el = document.createElement("div");
  el.className = "msg " + role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  el.appendChild(body);
  $("messages").appendChild(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw new Error(await errorMessage(response));
    const card = (await response.json()).data[0];
    modelId = card.id;
    const info = card.edgeflash || {};
    $("model").textContent = `${card.id} · ${info.engine || "?"} engine · context ${info.context_length || "?"}`;
    const sampling = info.sampling_defaults || {};
    if (sampling.temperature != null) $("temperature").placeholder = `server default: ${sampling.temperature}`;
    if (info.chat_template === false && !$("no-template")) {
      addMessage("error", "This model has no chat template (a base model?): its replies may not make sense. " +
                          "Serve an instruct model for chat.").id = "no-template";
    }
    const health = await (await fetch("/health")).json();
    $("stats").textContent = `ready · memory ${mib(health.rss_bytes)} resident`;
    setState("idle");
  } catch (err) {
    $("model").textContent = "not connected";
    $("stats").textContent = String(err.message || err);
    setState("error");
  }
}

// Yields the parsed JSON of each "data:" event of a server-sent-event response, until [DONE].
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function describe(stats, usage) {
  const parts = [`${usage ? usage.completion_tokens : stats.generated_tokens} tokens`];
  if (stats.decode_tok_s != null) parts.push(`${stats.decode_tok_s.toFixed(1)} tok/s`);
  if (stats.prefill_tok_s != null) parts.push(`prompt ${stats.prompt_tokens} tok at ${stats.prefill_tok_s.toFixed(1)} tok/s`);
  if (stats.ttft_s != null) parts.push(`first token ${stats.ttft_s.toFixed(2)} s`);
  parts.push(`memory ${mib(stats.rss_bytes)} (peak ${mib(stats.peak_rss_bytes)})`);
  if (stats.memory_budget_bytes) parts.push(`budget ${mib(stats.memory_budget_bytes)}`);
  return parts.join(" · ");
}

// The request body; sampling fields left empty in the settings take the server's defaults.
function request(system) {
  const body = {
    model: modelId,
    messages: system ? [{ role: "system", content: system }, ...conversation] : conversation,
    max_tokens: Number($("max-tokens").value) || 128,
    stream: true,
    stream_options: { include_usage: true },
  };
  const temperature = $("temperature").value.trim();
  if (temperature !== "") body.temperature = Number(temperature);
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  return body;
}

async function send(text) {
  const system = $("system").value.trim();
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  reply.dataset.finish = "";
  const replyText = reply.querySelector(".text");
  setState("busy");
  $("stats").textContent = "waiting for the model…";
  controller = new AbortController();
  const started = performance.now();
  let pieces = 0;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      signal: controller.signal,
      body: JSON.stringify(request(system)),
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    let stats = null, usage = null, finish = null;
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices[0];
      if (!choice) continue;
      if (choice.delta && choice.delta.content) {
        replyText.textContent += choice.delta.content;
        pieces += 1;
        const seconds = (performance.now() - started) / 1000;
        $("stats").textContent = `streaming… ${pieces} pieces in ${seconds.toFixed(1)} s`;
        reply.scrollIntoView({ block: "end" });
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      if (chunk.edgeflash) stats = chunk.edgeflash;
    }
    conversation.push({ role: "assistant", content: replyText.textContent });
    reply.dataset.pieces = String(pieces);
    reply.dataset.finish = finish || "unknown";
    if (stats) {
      const line = describe(stats, usage);
      $("stats").textContent = line;
      const meta = document.createElement("span");
      meta.className = "meta";
      meta.textContent = line;
      reply.appendChild(meta);
    }
  } catch (err) {
    const stopped = err.name === "AbortError";
    reply.dataset.finish = stopped ? "stopped" : "error";
    conversation.push({ role: "assistant", content: replyText.textContent });
    if (!stopped) addMessage("error", String(err.message || err));
    $("stats").textContent = stopped ? "stopped" : "error";
  } finally {
    controller = null;
    setState("idle");
    $("input").focus();
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("input").value.trim();
  if (!text || document.body.dataset.state !== "idle") return;
  $("input").value = "";
  send(text);
});

$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => controller && controller.abort());

$("new-chat").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation.length = 0;
  $("messages").replaceChildren();
  $("stats").textContent = "new chat";
});

$("api-key").addEventListener("change", loadModel);

loadModel();
