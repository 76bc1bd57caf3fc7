"""Greedy output of a model split over ranks equals one process's, resident and streamed under each
rank's budget; splits that do not divide are refused with one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mpi_helpers import HERE, MPI_ENV, mpirun, worker_result

PROMPT = "The quick brown fox"
TOKENS = 24


def single_process_tokens(model) -> list[int]:
    import edgeflash as ef

    return ef.load(model).generate(PROMPT, max_tokens=TOKENS, temperature=0.0).tokens


def split(model, out, ranks: int):
    from edgeflash.export.shard import export_shards

    return export_shards(model, out, ranks, progress=False)


@pytest.mark.parametrize("case", ["llama-gqa-untied", "gemma3-local-global", "llama-mha-tied-llama3-rope"])
def test_two_ranks_equal_one_process(case, tiny_models, tmp_path):
    split(tiny_models[case], tmp_path / "split", 2)
    ranks = worker_result(mpirun(2, [str(HERE / "tp_worker.py"), str(tmp_path / "split"), "--prompt", PROMPT,
                                     "-n", str(TOKENS)]))
    expected = single_process_tokens(tiny_models[case])
    assert [r["tokens"] for r in ranks] == [expected, expected]
    layers = 3
    # two all-reduces a layer and one for the embedding rows, every forward pass (prompt + 23 decodes)
    assert ranks[0]["allreduces"] == (2 * layers + 1) * TOKENS


def test_four_ranks_share_kv_heads(tiny_models, tmp_path):
    """4 query heads and 2 KV heads on 4 ranks: each KV head on the two ranks of its group."""
    split(tiny_models["llama-gqa-untied"], tmp_path / "split", 4)
    ranks = worker_result(mpirun(4, [str(HERE / "tp_worker.py"), str(tmp_path / "split"), "--prompt", PROMPT,
                                     "-n", str(TOKENS)]))
    assert [r["tokens"] for r in ranks] == [single_process_tokens(tiny_models["llama-gqa-untied"])] * 4


def test_ranks_stream_under_their_budgets(tiny_models, tmp_path):
    """A budget below a rank's weights: each rank streams from its own bundle, stays inside its
    budget (the transport included) and gives the same tokens."""
    split(tiny_models["llama-gqa-untied"], tmp_path / "split", 2)
    budget = 24 * 2**20  # the embedding, head and layers stream (the minimum is about 23 MiB)
    ranks = worker_result(mpirun(2, [str(HERE / "tp_worker.py"), str(tmp_path / "split"), "--prompt", PROMPT,
                                     "-n", str(TOKENS), "--memory-budget", str(budget)]))
    expected = single_process_tokens(tiny_models["llama-gqa-untied"])
    for r in ranks:
        assert r["tokens"] == expected
        assert r["flash_bytes_read"] > 0  # something streamed
        assert r["resident_weight_bytes"] < r["weight_bytes"]
        assert r["memory_budget_bytes"] == budget
        assert 0 < r["budget_used"] <= budget, (r["budget_used"], budget)
        assert r["transport_rss_bytes"] > 0


def test_split_that_does_not_divide_is_refused(tiny_models, tmp_path):
    done = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "export", str(tiny_models["llama-gqa-untied"]),
                           "-o", str(tmp_path / "split"), "--ranks", "3"], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "do not split over 3 ranks" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "split").exists()


def test_wrong_rank_count_is_refused(tiny_models, tmp_path):
    split(tiny_models["llama-gqa-untied"], tmp_path / "split", 2)
    done = subprocess.run(["mpirun", "-n", "1", sys.executable, "-m", "edgeflash.cli.main", "generate", "-m",
                           str(tmp_path / "split"), "-p", PROMPT, "-n", "2"], check=False, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **MPI_ENV})
    assert done.returncode != 0
    assert "holds rank 0 of 2, but this is rank 0 of 1; launch it with mpirun -n 2" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_generate_under_mpirun(tiny_models, tmp_path):
    """`mpirun -n 2 edgeflash generate -m SPLIT --json`: rank 0 prints the text once and every rank's statistics."""
    import json

    split(tiny_models["llama-mha-tied-llama3-rope"], tmp_path / "split", 2)
    done = subprocess.run(["mpirun", "-n", "2", sys.executable, "-m", "edgeflash.cli.main", "generate", "-m",
                           str(tmp_path / "split"), "-p", PROMPT, "-n", "8", "--temp", "0", "--json"],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **MPI_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1  # one JSON object, from rank 0 only
    out = json.loads(lines[0])
    assert [r["rank"] for r in out["per_rank"]] == [0, 1]
    import edgeflash as ef

    expected = ef.load(tiny_models["llama-mha-tied-llama3-rope"]).generate(PROMPT, max_tokens=8, temperature=0.0)
    assert out["text"] == expected.text


def test_serve_on_rank_zero(tiny_models, tmp_path):
    """`mpirun -n 2 edgeflash serve -m SPLIT`: rank 0 answers HTTP, rank 1 follows its engine calls."""
    import json
    import signal
    import urllib.request

    split(tiny_models["llama-gqa-untied"], tmp_path / "split", 2)
    server = subprocess.Popen(["mpirun", "-n", "2", sys.executable, "-m", "edgeflash.cli.main", "serve", "-m",
                               str(tmp_path / "split"), "--port", "0", "--quiet", "--temp", "0", "--repeat-penalty", "1"],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, **MPI_ENV})
    try:
        line = server.stdout.readline()
        assert "listening on http://" in line, line + server.stderr.read()[-3000:]
        url = line.split("listening on ")[1].split()[0]
        answers = []
        for _ in range(2):  # the second request reuses the follower's cache the way the leader does
            body = json.dumps({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
            request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                answers.append(json.loads(response.read())["choices"][0]["text"])
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    import edgeflash as ef

    expected = ef.load(tiny_models["llama-gqa-untied"]).generate(PROMPT, max_tokens=8, temperature=0.0).text
    assert answers == [expected, expected]
