"""MPI (Debian's Open MPI through mpi4py) against torch.distributed with gloo, on this machine: what
importing and starting each costs a rank (time and RSS, which count inside a board's budget), and
all-reduce latency of a hidden-size float32 vector (896, 1536, 3584 values) on 2 and 4 ranks, over
loopback and between boards of the namespace harness (tests/distributed/boards.py).

    sudo .venv/bin/python benchmarks/distributed/transports.py [--iters 300] [--links none ethernet]

Each rank's cost is measured in its own fresh process after `import numpy` (what a rank has
anyway): RSS and wall time before the import, after it, and after the group is up. Latency is the
mean of `--iters` all-reduces issued back to back after a warm-up, timed on rank 0 (each needs
every rank's part before it completes, as in a forward pass), with rank 0's CPU time per
all-reduce beside it: Open MPI waits by spinning, which on shared cores takes time from the other
ranks; `mpi-poll` tests a non-blocking all-reduce and sleeps 20 us between tests instead. Records go to
benchmarks/results/scale-out-transports.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SIZES = (896, 1536, 3584)  # hidden sizes: Qwen2.5-0.5B, 1.5B, 7B
POLL_S = 20e-6  # mpi-poll: sleep between tests of a non-blocking all-reduce instead of spinning
BACKENDS = ("mpi", "mpi-poll", "gloo")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(backend: str, iters: int) -> None:
    import numpy as np

    t0, rss0 = time.perf_counter(), _rss()
    if backend in ("mpi", "mpi-poll"):
        from mpi4py import MPI

        t1, rss1 = time.perf_counter(), _rss()
        comm = MPI.COMM_WORLD
        rank, size = comm.rank, comm.size
        if backend == "mpi":
            def allreduce(x: np.ndarray, y: np.ndarray) -> None:
                comm.Allreduce(x, y, op=MPI.SUM)
        else:
            import ctypes

            ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK: short sleeps stay short

            def allreduce(x: np.ndarray, y: np.ndarray) -> None:
                req = comm.Iallreduce(x, y, op=MPI.SUM)
                while not req.Test():
                    time.sleep(POLL_S)

        barrier = comm.Barrier
    else:
        import torch
        import torch.distributed as dist

        t1, rss1 = time.perf_counter(), _rss()
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()

        def allreduce(x: np.ndarray, y: np.ndarray) -> None:  # in place on a tensor sharing y's memory
            y[:] = x
            dist.all_reduce(torch.from_numpy(y))

        barrier = dist.barrier
    allreduce(np.ones(4, np.float32), np.empty(4, np.float32))  # the group is up once data has moved
    t2, rss2 = time.perf_counter(), _rss()
    out = {"rank": rank, "size": size, "import_s": t1 - t0, "init_s": t2 - t1, "import_rss": rss1 - rss0,
           "init_rss": rss2 - rss1, "latency_us": {}}
    out["cpu_us"] = {}
    for n in SIZES:
        x, y = np.ones(n, np.float32), np.empty(n, np.float32)
        for _ in range(20):
            allreduce(x, y)
        barrier()
        # Back to back, as a forward pass issues them (each needs every rank's part before it ends).
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            allreduce(x, y)
        out["latency_us"][n] = (time.perf_counter() - start) / iters * 1e6
        out["cpu_us"][n] = (time.process_time() - cpu) / iters * 1e6
        if y[0] != size:
            raise SystemExit(f"all-reduce gave {y[0]}, expected {size}")
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _result(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError("no result line in:\n" + text[-3000:])


def run(backend: str, n: int, link: str, iters: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "distributed"))
    import boards

    me = [sys.executable, str(Path(__file__).resolve()), "--worker", backend, "--iters", str(iters)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if link == "loopback":
        if backend != "gloo":  # TCP over loopback, like gloo (shared memory would bypass the network)
            cmd = ["mpirun", "--allow-run-as-root", "-n", str(n), "--oversubscribe", "--mca", "btl", "tcp,self", *me]
            done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, env=env)
            return _result(done.stdout + done.stderr)
        procs = []
        for k in range(n):
            e = dict(env, RANK=str(k), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
            procs.append(subprocess.Popen(me, stdout=subprocess.PIPE, text=True, env=e))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        return _result(outs[0])
    boards.up(n, link)
    try:
        if backend != "gloo":
            done = subprocess.run(boards.mpirun_command(n, me), check=False, capture_output=True, text=True, timeout=600, env=env)
            return _result(done.stdout + done.stderr)
        procs = []
        for k in range(n):
            e = dict(env, RANK=str(k), WORLD_SIZE=str(n), MASTER_ADDR=boards.address(0), MASTER_PORT="29517",
                     GLOO_SOCKET_IFNAME="eth0")
            procs.append(subprocess.Popen(["ip", "netns", "exec", boards.namespace(k), *me], stdout=subprocess.PIPE,
                                          text=True, env=e))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        return _result(outs[0])
    finally:
        boards.down()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", choices=BACKENDS)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--links", nargs="+", default=["loopback", "ethernet"])
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.iters)
        return
    sys.path.insert(0, str(ROOT / "benchmarks" / "results"))
    sys.path.insert(0, str(ROOT / "tests" / "distributed"))
    import boards
    from record import append_result, new_run_id

    run_id, command = new_run_id(), " ".join(sys.argv)
    rows = []
    for link in args.links:
        rtt = None
        if link != "loopback":
            boards.up(2, link)
            rtt = boards.ping_ms(0, 1, count=50)
            boards.down()
        for n in args.ranks:
            for backend in BACKENDS:
                r = run(backend, n, link, args.iters)
                config = f"{backend} {n} ranks {link}"
                rows.append((config, r, rtt))
                notes = f"ping round trip {rtt:.3f} ms" if rtt is not None else "TCP over loopback"
                for size, us in r["latency_us"].items():
                    append_result("scale-out-transports", {"run": run_id, "config": config, "metric":
                                                           f"allreduce_us_{size}", "value": round(us, 1), "unit": "us",
                                                           "command": command, "notes": notes})
                for metric in ("import_s", "init_s"):
                    append_result("scale-out-transports", {"run": run_id, "config": config, "metric": metric,
                                                           "value": round(r[metric], 3), "unit": "s",
                                                           "command": command})
                for metric in ("import_rss", "init_rss"):
                    append_result("scale-out-transports", {"run": run_id, "config": config, "metric": metric + "_mib",
                                                           "value": round(r[metric] / 2**20, 1), "unit": "MiB",
                                                           "command": command})
                for size, us in r["cpu_us"].items():
                    append_result("scale-out-transports", {"run": run_id, "config": config, "metric":
                                                           f"allreduce_cpu_us_{size}", "value": round(us, 1),
                                                           "unit": "us", "command": command,
                                                           "notes": "rank 0's CPU time per all-reduce"})
                print(f"{config:<32} import {r['import_s']:.2f} s +{r['import_rss'] / 2**20:.1f} MiB, "
                      f"init {r['init_s']:.2f} s +{r['init_rss'] / 2**20:.1f} MiB, all-reduce µs (CPU µs) "
                      + " ".join(f"{k}: {v:.0f} ({r['cpu_us'][k]:.0f})" for k, v in r["latency_us"].items())
                      + (f" (ping {rtt:.3f} ms)" if rtt else ""), flush=True)


if __name__ == "__main__":
    main()
