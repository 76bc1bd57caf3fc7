"""`edgeflash chat` driven through a pseudo-terminal (as a person at a terminal) and through a pipe:
streamed answers equal the API's greedy chat replies, history carries over, /reset forgets it,
/stats reports, /exit and end of input leave cleanly."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

MAX_TOKENS = 8
Q1 = "What is the capital of France?"
Q2 = "And of Italy?"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")
# Plain greedy decoding (no penalty), as the API's defaults: the replies can be compared.
CHAT = [sys.executable, "-m", "edgeflash.cli.main", "chat", "-m", "smollm2-135m", "-n",
        str(MAX_TOKENS), "--temp", "0", "--repeat-penalty", "1"]


@pytest.fixture(scope="module")
def replies():
    """Greedy replies of the Python API for the conversations the tests hold."""
    import edgeflash as ef

    model = ef.load("smollm2-135m")
    a1 = model.chat([{"role": "user", "content": Q1}], MAX_TOKENS)
    a2 = model.chat([{"role": "user", "content": Q1}, {"role": "assistant", "content": a1.text},
                     {"role": "user", "content": Q2}], MAX_TOKENS)
    a2_alone = model.chat([{"role": "user", "content": Q2}], MAX_TOKENS)
    model.close()
    return {"a1": a1, "a2": a2, "a2_alone": a2_alone}


class Terminal:
    """A child process on a pseudo-terminal; `until` reads its screen output up to a marker."""

    def __init__(self, argv: list[str]):
        master, slave = pty.openpty()
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "200", "LINES": "50"}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                                     start_new_session=True)
        os.close(slave)
        self.master = master
        self.buffer = ""

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\r").encode())

    def until(self, marker: str, timeout: float = 300) -> str:
        """Everything up to and including `marker` (escape sequences removed, CRLF as LF)."""
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} within {timeout} s; screen so far: {self.buffer[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    data = os.read(self.master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                assert data, f"the program ended before {marker!r}: {self.buffer[-500:]!r}"
                self.buffer += ANSI.sub("", data.decode(errors="replace")).replace("\r\n", "\n")
        head, _, self.buffer = self.buffer.partition(marker)
        return head + marker

    def close(self) -> int:
        code = self.proc.wait(timeout=60)
        os.close(self.master)
        return code


def test_chat_through_a_pseudo_terminal(replies):
    term = Terminal(CHAT)
    try:
        banner = term.until("you> ")
        assert "/help lists commands" in banner
        term.send(Q1)
        screen = term.until("you> ")
        assert Q1 in screen  # the terminal echoed what was typed
        assert replies["a1"].text in screen

        term.send("/stats")
        stats = term.until("you> ")
        assert f"last reply: {len(replies['a1'].tokens)} tokens" in stats
        assert "conversation: 1 replies so far, 2 messages" in stats and "MiB resident" in stats

        term.send(Q2)  # answered with the first exchange as context
        assert replies["a2"].text in term.until("you> ")

        term.send("/reset")
        assert "(conversation cleared)" in term.until("you> ")
        term.send(Q2)  # answered as the first message of a new conversation
        assert replies["a2_alone"].text in term.until("you> ")
        term.send("/stats")
        assert "conversation: 1 replies so far, 2 messages" in term.until("you> ")

        term.send("/help")
        help_text = term.until("you> ")
        assert all(c in help_text for c in ("/reset", "/stats", "/exit"))
        term.send("/exit")
    except BaseException:
        term.proc.kill()
        raise
    assert term.close() == 0


def test_chat_through_a_pipe(replies):
    """Piped input: no prompts, stdout holds the replies (and /stats), end of input leaves."""
    proc = subprocess.run(CHAT, input=f"{Q1}\n/stats\n/nonsense\n", capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "you> " not in proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0] == replies["a1"].text
    assert lines[1].startswith(f"last reply: {len(replies['a1'].tokens)} tokens")
    assert "unknown command /nonsense" in proc.stdout


def test_the_default_model_answers_a_first_question():
    """The README's first command: the default model (an instruct model) with the default sampling
    answers with the capital, for several seeds."""
    edgeflash = os.path.join(os.path.dirname(sys.executable), "edgeflash")
    for seed in (1, 2, 3):
        proc = subprocess.run([edgeflash, "chat", "-n", "32", "--seed", str(seed)],
                              input="What is the capital of France?\n", capture_output=True, text=True,
                              check=False, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert "Paris" in proc.stdout, proc.stdout
