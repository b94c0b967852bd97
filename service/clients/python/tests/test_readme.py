"""README.md's "One example per surface", run as written against real processes.

Each block is read from the README, so the README cannot drift from what
works. The shell blocks run under bash in a scratch folder that links the
repository's `service/`, `docs/` and `fixtures/`, with `scd` and `scd-dev`
first on PATH and the README's two variables set; the one thing changed is
the port: the README's fixed ports (50051, 9090) become free ones, so a
server already running on this machine cannot break the test. A line that
ends in ` &` starts a server: the test starts it, waits until its port
answers (as a person would before typing the next line), runs the rest of
the block, and stops it. The MCP text block is compared with what the
official MCP client gets for the same call; the Python block runs against
a real `scd serve`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EVIDENCE, FIXTURE, ROOT, SECRET, START_TIMEOUT_S, paths, unavailable

README = ROOT / "README.md"
SECTION = "## One example per surface"
GRPC_PORT = "50051"
HTTP_PORT = "9090"


def blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced block in the README's examples section."""
    text = README.read_text()
    assert text.count(SECTION) == 1, f"{README}: no single {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.S | re.M)


def block(lang: str, needle: str) -> str:
    """The one `lang` block holding `needle`."""
    found = [b for (l, b) in blocks() if l == lang and needle in b]
    assert len(found) == 1, f"{README}: {len(found)} {lang} blocks hold {needle!r}"
    return found[0]


# the block each test below runs or checks: (language, a text only it holds)
COVERED = [
    ("sh", "scd compress --files"),
    ("sh", "scd client compress"),
    ("text", "[SCD: "),
    ("json", "mcpServers"),
    ("sh", ".well-known/agent-card.json"),
    ("python", "import scd_client"),
    ("sh", "scd-dev atp demo"),
]


def test_every_block_of_the_examples_is_run_or_checked():
    """A block added to the README later must get its test here, not go unrun."""
    for lang, body in blocks():
        hits = [n for (l, n) in COVERED if l == lang and n in body]
        assert len(hits) == 1, f"README block not covered by test_readme.py ({lang}):\n{body}"
    assert len(blocks()) == len(COVERED)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def shell(tmp_path):
    """Runs README shell blocks in a scratch folder; yields the runner, stops what it started."""
    scd, models, ort = paths()
    dev = scd.parent / "scd-dev"
    if not (dev.is_file() and os.access(dev, os.X_OK)):
        unavailable(f"no scd-dev beside {scd} (cargo build -p scd-dev)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in (("scd", scd), ("scd-dev", dev)):
        (bin_dir / name).symlink_to(target)
    work = tmp_path / "work"
    work.mkdir()
    for name in ("service", "docs", "fixtures"):
        (work / name).symlink_to(ROOT / name)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SCD_MODELS_DIR=str(models), SCD_ORT_LIB=str(ort))
    for var in ("SCD_ADDR", "SCD_HTTP_ADDR", "SCD_CLIENT_ADDR", "SCD_SESSION_TOKEN", "SCD_URL"):
        env.pop(var, None)
    runner = Shell(work, env)
    try:
        yield runner
    finally:
        runner.stop()


class Shell:
    def __init__(self, work: Path, env: dict):
        self.work, self.env, self.servers = work, env, []

    def run(self, body: str, ports: dict[str, int], timeout: float = 600) -> subprocess.CompletedProcess:
        """`body` with each `:<README port>` made `:<free port>`; servers started and awaited first."""
        for old, new in ports.items():
            assert f":{old}" in body, f"the block no longer names port {old}:\n{body}"
            body = body.replace(f":{old}", f":{new}")
        lines = body.splitlines()
        rest = []
        for line in lines:
            if line.rstrip().endswith(" &"):
                self.start(line.rstrip()[:-2], re.search(r":(\d+)\b", line).group(1))
            else:
                rest.append(line)
        script = "set -euo pipefail\n" + "\n".join(rest) + "\n"
        return subprocess.run(
            ["bash", "-c", script], cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self, command: str, port: str) -> None:
        log = open(self.work / f"server-{port}.log", "w")
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.work, env=self.env, stdout=log, stderr=log, start_new_session=True
        )
        self.servers.append(proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{command!r} exited {proc.returncode}:\n{self.log(port)}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", int(port))) == 0:
                    return
            time.sleep(0.2)
        pytest.fail(f"{command!r} did not listen on {port} in {START_TIMEOUT_S} s:\n{self.log(port)}")

    def log(self, port: str) -> str:
        return (self.work / f"server-{port}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout ---\n{r.stdout[-4000:]}\n--- stderr ---\n{r.stderr[-4000:]}"
    return r.stdout


def test_the_cli_example_fits_its_budget_and_names_its_files(shell, o200k):
    ok(shell.run(block("sh", "scd compress --files"), {}))
    text = (shell.work / "context.txt").read_text()
    assert 0 < len(o200k.encode(text)) <= 1500, len(o200k.encode(text))
    # every piece names the file it came from
    headers = re.findall(r"^\[([^\]\s:]+):\d", text, flags=re.M)
    assert headers and all(h.startswith(("service/src/grpc/", "docs/operations.md")) for h in headers), headers
    ctx = json.loads((shell.work / "ctx.json").read_text())
    names = {f["name"] for f in ctx["fields"]}
    assert "docs/operations.md" in names and any(n.startswith("service/src/grpc/") for n in names), names


def test_the_grpc_example_opens_a_session_and_its_follow_up_sends_new_chunks(shell):
    port = free_port()
    shell.env["SCD_CLIENT_ADDR"] = f"http://127.0.0.1:{port}"  # `scd client`'s default is the README's port
    out = ok(shell.run(block("sh", "scd client compress"), {GRPC_PORT: port}))
    first = json.loads((shell.work / "t1.json").read_text())
    assert first["session_id"] == "t1" and len(first["session_token"]) >= 32, first
    more = json.loads(out)
    sent = {c["id"] for c in first["chunks"]}
    assert more["chunks"] and not sent & {c["id"] for c in more["chunks"]}, (sent, more)
    assert SECRET not in out and SECRET not in json.dumps(first)


def test_the_mcp_text_in_the_readme_is_what_the_official_client_gets():
    shown = block("text", "[SCD: ")
    task = re.search(r'`"task": "([^"]+)"', README.read_text().replace("\n", " ").replace("  ", " "))
    assert task, "the README names the task of its MCP example"
    python = ROOT / ".tools" / "venv" / "bin" / "python"
    if not python.is_file():
        unavailable(f"no {python} with the mcp package: models/setup.sh makes it")
    scd, models, ort = paths()
    env = dict(os.environ, SCD_MODELS_DIR=str(models), SCD_ORT_LIB=str(ort))
    client = ROOT / "service" / "tests" / "py" / "mcp_client.py"
    cmd = [str(python), str(client), "show", str(FIXTURE), task.group(1), "150", "--", str(scd), "mcp"]
    got = ok(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300))
    # the header as shown, the session id aside; then the README's lines in order, "  ..." eliding
    head, *body = shown.splitlines()
    got_lines = got.splitlines()
    mask = lambda s: re.sub(r'session "s-[^"]+"', 'session "s-"', s)
    assert mask(got_lines[0]) == mask(head), (got_lines[0], head)
    at = 1
    for line in body:
        if line.strip() == "...":
            continue
        assert line in got_lines[at:], f"README line {line!r} is not in what the client got:\n{got}"
        at = got_lines.index(line, at) + 1


def test_the_mcp_configuration_in_the_readme_starts_scd_mcp():
    config = json.loads(block("json", "mcpServers"))["mcpServers"]["scd"]
    assert config["args"] == ["mcp"]
    assert set(config["env"]) == {"SCD_MODELS_DIR", "SCD_ORT_LIB"}
    scd, models, ort = paths()
    env = dict(os.environ, SCD_MODELS_DIR=str(models), SCD_ORT_LIB=str(ort))
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "readme", "version": "1"}}}
    r = subprocess.run([str(scd), *config["args"]], input=json.dumps(hello) + "\n", env=env,
                       capture_output=True, text=True, timeout=120)
    reply = json.loads(r.stdout.splitlines()[0])
    assert reply["id"] == 1 and reply["result"]["serverInfo"]["name"], reply


def test_the_a2a_example_lists_its_skills_and_answers_with_the_evidence(shell):
    # the block's `scd serve` also opens gRPC on its default 50051: a free port instead
    shell.env["SCD_ADDR"] = f"127.0.0.1:{free_port()}"
    out = ok(shell.run(block("sh", ".well-known/agent-card.json"), {HTTP_PORT: free_port()}))
    decoder = json.JSONDecoder()
    card, at = decoder.raw_decode(out)
    reply, _ = decoder.raw_decode(out[at:].lstrip())
    assert {s["id"] for s in card["skills"]} >= {"compress-context", "more-context"}, card["skills"]
    assert "error" not in reply and reply["result"], reply
    dumped = json.dumps(reply)
    assert any(e in dumped for e in EVIDENCE), dumped[:2000]
    assert SECRET not in dumped


def test_the_python_example_prints_the_context_within_its_budget(server, o200k):
    env = dict(os.environ, SCD_URL=server.url)
    r = subprocess.run([sys.executable, "-c", block("python", "import scd_client")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    out = ok(r)
    assert 0 < len(o200k.encode(out)) <= 1500 + 1, len(o200k.encode(out))  # print() adds one newline
    assert re.search(r"^\[service/src/grpc/", out, flags=re.M), out[:2000]


def test_the_client_waits_longer_than_the_server_may_take():
    """A slow first call (a cold repository) ends with the server's explicit 504, never the client's cut."""
    import scd_client

    scd, _, _ = paths()
    help_text = ok(subprocess.run([str(scd), "serve", "--help"], capture_output=True, text=True, timeout=60))
    limit = re.search(r"--http-request-timeout-ms <[^>]+>.*?\[default: (\d+)\]", help_text, flags=re.S)
    assert limit, help_text
    assert scd_client.Client("http://127.0.0.1:9").timeout > int(limit.group(1)) / 1000


def test_the_atp_demo_runs_as_written(shell):
    ok(shell.run(block("sh", "scd-dev atp demo"), {}))
    report = json.loads((shell.work / "demo.json").read_text())
    assert report["tasks_submitted"] == 6 and report["tasks_lost"] == 0, report
    assert 0 < report["context"]["sent_tokens"] < report["context"]["full_tokens"], report
