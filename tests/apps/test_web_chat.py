"""The web chat page end to end in headless Chromium: type a question, press Enter, wait for the
streamed answer, screenshot it, and check the answer is the model's, sensible and visible on screen.
The page talks to the default model, as `edgeflash serve` shows a new user."""

from __future__ import annotations

import json
from pathlib import Path

from cdp import Browser
from png import dark_pixels, decode

QUESTION = "What is the capital of France?"
MAX_TOKENS = 12
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
LAST_REPLY = "[...document.querySelectorAll('.msg.assistant')].at(-1)"


def test_web_chat_streams_an_answer_in_chromium(web_server):
    import edgeflash as ef

    oracle = ef.load("default")
    want = oracle.chat([{"role": "user", "content": QUESTION}], MAX_TOKENS, temperature=0.0)
    oracle.close()

    browser = Browser()
    try:
        browser.open(web_server.url + "/")
        browser.wait_for("document.body.dataset.state === 'idle'", timeout=60)
        assert web_server.model_id in browser.evaluate("document.getElementById('model').textContent")
        browser.evaluate(f"document.getElementById('max-tokens').value = '{MAX_TOKENS}'")
        browser.evaluate("document.getElementById('input').focus()")
        browser.type_text(QUESTION)
        browser.press_enter()
        browser.wait_for("document.body.dataset.state === 'busy'", timeout=10)
        browser.wait_for(f"document.body.dataset.state === 'idle' && {LAST_REPLY}.dataset.finish !== ''",
                         timeout=300)

        reply = browser.evaluate(f"""(() => {{ const r = {LAST_REPLY}; return {{
            text: r.querySelector('.text').textContent, finish: r.dataset.finish,
            pieces: Number(r.dataset.pieces), meta: r.querySelector('.meta')?.textContent,
            question: document.querySelector('.msg.user .text').textContent,
            stats: document.getElementById('stats').textContent }}; }})()""")
        assert reply["question"] == QUESTION
        assert reply["text"] == want.text and reply["finish"] == want.finish_reason
        assert "Paris" in reply["text"], reply["text"]
        assert reply["pieces"] >= 2, "the answer arrived in one piece: not streamed"
        assert "tok/s" in reply["stats"] and "MiB" in reply["stats"], reply["stats"]
        assert reply["meta"] == reply["stats"]
        assert not [line for line in browser.console if line.startswith("exception")], browser.console

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page = browser.screenshot()
        (ARTIFACTS / "web-chat.png").write_bytes(page)
        width, height, _ = decode(page)
        assert (width, height) == (960, 720)

        # The answer is on screen: its box holds dark text pixels, which vanish when its ink is hidden.
        box = browser.evaluate(f"""(() => {{ const b = {LAST_REPLY}.querySelector('.text').getBoundingClientRect();
            return {{x: b.x, y: b.y, width: b.width, height: b.height}}; }})()""")
        assert box["width"] > 20 and box["height"] > 8 and 0 <= box["y"] and box["y"] + box["height"] <= height, box
        with_text = dark_pixels(browser.screenshot(clip=box))
        browser.evaluate(f"{LAST_REPLY}.querySelector('.text').style.color = 'transparent'")
        without_text = dark_pixels(browser.screenshot(clip=box))
        assert with_text > 30 * len(want.text.split()) and without_text < with_text // 20, (with_text, without_text)
        (ARTIFACTS / "web-chat.json").write_text(json.dumps({"reply": reply, "box": box, "dark_pixels": with_text}))
    finally:
        browser.close()
