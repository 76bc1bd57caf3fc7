"""Drive headless Chromium over the Chrome DevTools Protocol through a pipe (--remote-debugging-pipe):
JSON messages ending in NUL on file descriptors 3 (to the browser) and 4 (from it). No websocket,
no extra package."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-pipe"]


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("Chromium is not installed: run `make system-deps` (Debian package 'chromium')")


class Browser:
    def __init__(self, width: int = 960, height: int = 720):
        self.viewport = {"width": width, "height": height}
        self.profile = tempfile.mkdtemp(prefix="edgeflash-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def place_pipes() -> None:  # in the child: the protocol's fixed descriptors 3 and 4
            # copy both ends above 10 first, so placing one cannot overwrite the other
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=place_pipes, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self.session: str | None = None
        self.console: list[str] = []

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True,
             timeout: float = 60) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})
            if reply.get("method") == "Runtime.consoleAPICalled":
                args = reply["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            if reply.get("method") == "Runtime.exceptionThrown":
                self.console.append("exception: " + json.dumps(reply["params"]["exceptionDetails"])[:500])

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                data = os.read(self._from_browser, 1 << 20)
                if not data:
                    raise AssertionError(f"Chromium exited: {self.proc.stderr.read().decode()[-2000:]}")
                self._buffer += data
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def open(self, url: str) -> None:
        """A new tab on `url`; later calls go to it."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", {**self.viewport, "deviceScaleFactor": 1, "mobile": False})
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        guarded = f"(() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }})()"  # page may be loading
        while time.monotonic() < deadline:
            value = self.evaluate(guarded)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"{expression!r} stayed false for {timeout} s; console: {self.console[-5:]}")

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def press_enter(self) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                 "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13,
                                                 **({"text": "\r"} if kind == "keyDown" else {})})

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False, timeout=10)
        except AssertionError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)
