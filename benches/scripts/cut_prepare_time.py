#!/usr/bin/env python3
"""What cutting long functions costs in preparation: the multi-file code
cases compressed by two `scd serve` processes, one with functions whole
(`--long-function-bytes 0`) and one at the default, in the same run.

Usage: cut_prepare_time.py [--scd target/release/scd] [--data benches/data/agent/out/code.jsonl] [--rate 0.2]

Both servers run with their embedding caches off, so every case is embedded
in full by each (a case is posted once to each: the prepared-context cache
is never hit). The cases alternate which server goes first, so the two share
the machine's state alike. Prints progress every 10 cases, each server's
total wall time and their ratio. Needs SCD_ORT_LIB and SCD_MODELS_DIR as
`scd serve` does. Standard library only.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(scd, extra):
    port = free_port()
    cmd = [scd, "serve", "--addr", "127.0.0.1:0", "--http-addr", f"127.0.0.1:{port}",
           "--embedding-cache", "off", "--cache-bytes", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1)
            return proc, port
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"{' '.join(cmd)} exited with {proc.returncode}")
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"{' '.join(cmd)}: not ready after 120 s")


def post(port, case, rate):
    body = {"task": case["task"], "context": case["context"], "rate": rate, "budget_tokenizer": "cl100k"}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/compress", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        json.load(r)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scd", default="target/release/scd")
    ap.add_argument("--data", default="benches/data/agent/out/code.jsonl")
    ap.add_argument("--rate", type=float, default=0.2)
    a = ap.parse_args()
    if not os.environ.get("SCD_ORT_LIB"):
        sys.exit("set SCD_ORT_LIB (and SCD_MODELS_DIR) as for scd serve")
    cases = [json.loads(line) for line in open(a.data) if line.strip()]
    servers = {"whole": start(a.scd, ["--long-function-bytes", "0"]), "cut": start(a.scd, [])}
    total = {name: 0.0 for name in servers}
    t0 = time.perf_counter()
    try:
        for n, case in enumerate(cases, 1):
            order = list(servers) if n % 2 else list(reversed(servers))
            for name in order:
                total[name] += post(servers[name][1], case, a.rate)
            if n % 10 == 0 or n == len(cases):
                rate = n / (time.perf_counter() - t0)
                print(f"{n}/{len(cases)} cases, {rate:.2f} cases/s (both servers)", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.kill()
    for name, t in total.items():
        print(f"{name}: {len(cases)} cases in {t:.1f} s")
    print(f"cut / whole: {total['cut'] / total['whole']:.3f}")


if __name__ == "__main__":
    main()
