"""Function calling on the device, TinyAgent-style: a dozen tool signatures of a phone assistant
and twenty requests, each with the tool it needs and facts its arguments must hold.

  python benchmarks/tools/function_calling.py                          # qwen2.5-coder-0.5b
  python benchmarks/tools/function_calling.py -m qwen2.5-coder-1.5b -m path/to/model.gguf

For each model, every request runs twice, side by side: "constrained" (edgeflash's tool calling:
the model's chat template renders the tools and the reply is held to "text, or calls of these
tools with schema-valid arguments") and "free" (the same prompt, unconstrained, calls parsed out
of the text). Greedy decoding. Reported per model and mode, as shares of the 20 requests:
  call       the reply holds at least one tool call
  formed     its first call is well formed: JSON, a tool that exists, arguments valid under its schema
  tool       the first call names the expected tool
  arguments  ... and its arguments hold the expected facts (case-insensitive substrings)
Results go to benchmarks/results/tools/ (one JSON file per run).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "benchmarks" / "results" / "tools"


def tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


S = {"type": "string"}
TOOLS = [
    tool("get_weather", "Get the current weather and today's forecast for a city",
         {"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    tool("send_email", "Send an email", {"to": S, "subject": S, "body": S}, ["to", "subject", "body"]),
    tool("send_sms", "Send a text message to a phone number", {"phone_number": S, "message": S},
         ["phone_number", "message"]),
    tool("get_phone_number", "Look up a contact's phone number by name", {"name": S}, ["name"]),
    tool("get_email_address", "Look up a contact's email address by name", {"name": S}, ["name"]),
    tool("create_calendar_event", "Add an event to the calendar",
         {"title": S, "date": {"type": "string", "description": "YYYY-MM-DD"},
          "time": {"type": "string", "description": "HH:MM, 24-hour"}, "duration_minutes": {"type": "integer"}},
         ["title", "date", "time"]),
    tool("create_reminder", "Create a reminder", {"text": S, "due": {"type": "string", "description": "when"}},
         ["text", "due"]),
    tool("set_timer", "Start a countdown timer", {"minutes": {"type": "number"}}, ["minutes"]),
    tool("search_web", "Search the web", {"query": S}, ["query"]),
    tool("maps_show_directions", "Show directions between two places",
         {"start": S, "destination": S, "mode": {"type": "string", "enum": ["driving", "walking", "transit"]}},
         ["start", "destination"]),
    tool("create_note", "Create a note", {"title": S, "content": S}, ["title", "content"]),
    tool("play_music", "Play music by an artist or a song", {"artist": S, "song": S}, []),
    tool("translate_text", "Translate text into another language", {"text": S, "target_language": S},
         ["text", "target_language"]),
    tool("convert_currency", "Convert an amount of money between currencies",
         {"amount": {"type": "number"}, "from_currency": S, "to_currency": S},
         ["amount", "from_currency", "to_currency"]),
]
# (request, expected tool, {argument: substring its value must contain})
REQUESTS = [
    ("What's the weather in Tokyo today?", "get_weather", {"city": "tokyo"}),
    ("Send an email to alice@example.com with the subject 'Lunch' saying I'll be 10 minutes late.", "send_email",
     {"to": "alice@example.com", "subject": "lunch"}),
    ("Text +15551234567 that I'm on my way.", "send_sms", {"phone_number": "5551234567"}),
    ("What is Bob Smith's phone number?", "get_phone_number", {"name": "bob"}),
    ("Find the email address of Carol Jones.", "get_email_address", {"name": "carol"}),
    ("Schedule a meeting called 'Budget review' on 2026-03-02 at 14:00.", "create_calendar_event",
     {"title": "budget", "date": "2026-03-02", "time": "14"}),
    ("Remind me to call the dentist tomorrow at 9am.", "create_reminder", {"text": "dentist"}),
    ("Set a timer for 15 minutes.", "set_timer", {"minutes": "15"}),
    ("Search the web for the best hiking trails near Denver.", "search_web", {"query": "hiking"}),
    ("How do I get from the train station to the airport by bus?", "maps_show_directions",
     {"destination": "airport"}),
    ("Make a note titled 'Groceries' with milk, eggs and bread.", "create_note", {"title": "groceries"}),
    ("Play some music by Miles Davis.", "play_music", {"artist": "miles davis"}),
    ("Translate 'good morning' into Spanish.", "translate_text", {"text": "good morning", "target_language": "span"}),
    ("How much is 100 US dollars in euros?", "convert_currency", {"amount": "100"}),
    ("Is it going to rain in London?", "get_weather", {"city": "london"}),
    ("Email my boss at boss@corp.com that the report is done.", "send_email", {"to": "boss@corp.com"}),
    ("Start a 5 minute timer for the eggs.", "set_timer", {"minutes": "5"}),
    ("Give me walking directions from my office to the nearest pharmacy.", "maps_show_directions",
     {"destination": "pharmacy"}),
    ("Look up who won the 2022 World Cup.", "search_web", {"query": "world cup"}),
    ("Add a calendar event 'Dinner with Sam' on 2026-04-10 at 19:30.", "create_calendar_event",
     {"title": "dinner", "date": "2026-04-10"}),
]
SYSTEM = "You are a phone assistant. Call the tool that does what the user asks."
GREEDY = {"temperature": 0.0, "repetition_penalty": 1.0}


def judge(calls: list[dict], expected_tool: str, facts: dict[str, str]) -> dict[str, bool]:
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    out = {"call": bool(calls), "formed": False, "tool": False, "arguments": False}
    if not calls:
        return out
    name = calls[0]["function"]["name"]
    try:
        args = json.loads(calls[0]["function"]["arguments"])
        jsonschema.validate(args, schemas[name])
        out["formed"] = True
    except (json.JSONDecodeError, KeyError, jsonschema.ValidationError):
        return out
    out["tool"] = name == expected_tool
    out["arguments"] = out["tool"] and all(want in str(args.get(key, "")).lower() for key, want in facts.items())
    return out


def run_model(model_name: str, max_tokens: int) -> dict:
    import edgeflash as ef
    from edgeflash.runtime.structured.tool_calls import HERMES

    t0 = time.perf_counter()
    model = ef.load(model_name)
    load_s = time.perf_counter() - t0
    if model.tool_call_format is None:
        raise SystemExit(f"{model_name}: its chat template has no tool calling")
    rows = []
    for text, expected, facts in REQUESTS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        for mode in ("constrained", "free"):
            t = time.perf_counter()
            if mode == "constrained":
                r = model.chat(messages, max_tokens, tools=TOOLS, **GREEDY)
                calls, raw = r.tool_calls, r.text
            else:
                r = model.generate(model.chat_prompt(messages, TOOLS), max_tokens, **GREEDY)
                raw = r.text
                calls = HERMES.parse(r.text, TOOLS)[1]
            rows.append({"request": text, "mode": mode, "expected": expected, **judge(calls, expected, facts),
                         "calls": calls, "text": raw, "seconds": round(time.perf_counter() - t, 3),
                         "generated_tokens": len(r.tokens)})
            print(f"{mode:<11} {rows[-1]['tool']!s:<5} {text[:50]:<50} -> "
                  f"{[c['function']['name'] + c['function']['arguments'] for c in calls][:1] or raw[:60]!r}",
                  file=sys.stderr, flush=True)
    model.close()
    summary = {}
    for mode in ("constrained", "free"):
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {k: round(sum(r[k] for r in mine) / len(mine), 3) for k in ("call", "formed", "tool", "arguments")}
        summary[mode]["seconds_per_request"] = round(sum(r["seconds"] for r in mine) / len(mine), 2)
    return {"model": model_name, "load_s": round(load_s, 2), "summary": summary, "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", action="append", default=None, help="alias or path (repeatable)")
    p.add_argument("-n", "--max-tokens", type=int, default=96)
    args = p.parse_args()
    results = [run_model(m, args.max_tokens) for m in (args.model or ["qwen2.5-coder-0.5b"])]
    print(f"{'model':<28} {'mode':<12} {'call':>6} {'formed':>7} {'tool':>6} {'args':>6} {'s/request':>10}")
    for res in results:
        for mode, s in res["summary"].items():
            print(f"{Path(res['model']).name[:28]:<28} {mode:<12} {s['call']:>6.0%} {s['formed']:>7.0%} "
                  f"{s['tool']:>6.0%} {s['arguments']:>6.0%} {s['seconds_per_request']:>10.2f}")
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = OUT / f"{stamp}.json"
    path.write_text(json.dumps({"date": stamp, "machine": platform.machine(), "requests": len(REQUESTS),
                                "tools": len(TOOLS), "decoding": GREEDY, "results": results}, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
