"""End-to-end check of `scd mcp` with the official Python MCP client (PyPI `mcp`).

    mcp_client.py stdio CONTEXT_JSON -- SCD_BINARY [ARGS...]   # launches it over stdio
    mcp_client.py http CONTEXT_JSON URL                          # a running `scd mcp --http-addr`
    mcp_client.py bench CONTEXT_JSON N -- SCD_BINARY [ARGS...]   # latency of N calls per tool over stdio
    mcp_client.py two_clients CONTEXT_JSON URL                   # sessions stay with the MCP client that opened them
    mcp_client.py window CONTEXT_JSON CL100K HOTPOT CODE -- SCD_BINARY [ARGS...]
        # what a model sees: every text block of real results counted with tiktoken's cl100k
    mcp_client.py show CONTEXT_JSON TASK BUDGET -- SCD_BINARY [ARGS...]
        # prints the text block of one compress_context (budget in cl100k), as a model gets it
    mcp_client.py tools CONTEXT_JSON -- SCD_BINARY [ARGS...]
        # what listing the tools costs a model: the tools/list result as this client
        # receives it, serialized compactly (printed as {"tools_json": ...}; the caller counts it)

Lists the tools (4 names, each with an input and an output schema), calls
each one, checks the structured results (the client itself validates them
against the output schemas), the confidential field (its secret appears in
no response, errors included), bad arguments (a tool error naming the
argument) and that the server still answers afterwards. Prints one JSON
summary line; exits non-zero on the first failed check.
"""

import asyncio
import json
import math
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

SECRET = "sk_live_SECRET_4242"
TASK = "Why does the checkout page spin forever? Find the failing database call."
SEMI_REPORT = (
    "[STATUS]\nin_progress\n[SUMMARY]\nthe pool is exhausted\n[EVIDENCE_OR_TESTS]\nlogs\n"
    "[CONFIDENCE]\nlow\n[NEXT]\nwhich function acquires the connection?\n[ANSWER_CANDIDATE]\ncharge_card\n"
)

seen = []  # every response, dumped, for the secret check


def check(cond, what, detail=None):
    if not cond:
        raise SystemExit(f"FAILED: {what}: {detail!r}")


def dump(result):
    text = json.dumps(result.model_dump(mode="json", by_alias=True))
    seen.append(text)
    return text


def error_text(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def call(s, name, args):
    r = await s.call_tool(name, args)
    dump(r)
    return r


async def ok(s, name, args):
    r = await call(s, name, args)
    check(not r.is_error, f"{name} succeeds", error_text(r))
    check(isinstance(r.structured_content, dict), f"{name} has structured content", r.structured_content)
    out = r.structured_content
    if "text" in out:
        # the text block is the context itself after a one-line header, never the JSON again
        check(len(r.content) == 1, f"{name}: one text block", len(r.content))
        block = r.content[0].text
        header, _, body = block.partition("\n")
        check(header.startswith("[SCD: ") and header.endswith("]"), f"{name}: a one-line header", header)
        check(body == out["text"], f"{name}: the text block is the context", (body[:80], out["text"][:80]))
    return out


async def tool_error(s, name, args, starts):
    r = await call(s, name, args)
    check(r.is_error, f"{name} {args.keys()} is a tool error", r.structured_content)
    text = error_text(r)
    check(text.startswith(starts), f"{name} error names {starts!r}", text)
    return text


async def suite(s, context):
    summary = {}
    tools = (await s.list_tools()).tools
    names = sorted(t.name for t in tools)
    check(names == ["compress_context", "count_tokens", "embed", "request_more_context"], "tool names", names)
    for t in tools:
        check(t.input_schema.get("type") == "object", f"{t.name} input schema", t.input_schema)
        check(t.output_schema and t.output_schema.get("type") == "object", f"{t.name} output schema", t.output_schema)
    summary["tools"] = names

    # a calibrated threshold sends the most relevant chunks and leaves budget
    # in the session for request_more_context
    budget = 400
    out = await ok(
        s, "compress_context", {"task": TASK, "context": context, "budget": budget, "min_relative_score": 0.5}
    )
    sent = sum(c["tokens"] for c in out["chunks"])
    check(out["chunks"] and sent <= budget, "chunks within the budget", sent)
    check(out["totals"]["sent_tokens"] <= budget, "sent_tokens within the budget", out["totals"])
    check(out["session_id"], "a session id", out)
    check("session_token" not in json.dumps(out), "no session token reaches the client", out)
    check(out["withheld_fields"] == ["api_keys"], "the confidential field is withheld", out["withheld_fields"])
    check(out["dropped"]["count"] > 0 and "listed" not in out["dropped"], "a summary of what was held back", out)
    check(all(w not in out["text"] for w in [SECRET]), "the text holds no secret", out["text"][:200])
    session = out["session_id"]
    first = {c["id"] for c in out["chunks"]}
    summary["compress"] = {"chunks": len(out["chunks"]), "sent_tokens": sent, "dropped": out["dropped"]["count"]}
    listed = await ok(s, "compress_context", {"task": TASK, "context": context, "budget": 150, "list_dropped": True})
    held = listed["dropped"]["listed"]
    check(0 < len(held) <= 100 and len(held) <= listed["dropped"]["count"], "list_dropped lists them", listed["dropped"])
    check(all(d["field"] != "api_keys" for d in held), "no confidential stub", held)

    more = await ok(
        s,
        "request_more_context",
        {"session": session, "question": "which function acquires the database connection?", "current_confidence": 0.2},
    )
    check(more["chunks"], "more sends chunks", more)
    check(not first & {c["id"] for c in more["chunks"]}, "more sends only unseen chunks", more)
    check(isinstance(more["remaining_tokens"], int), "remaining_tokens", more)
    summary["more"] = {"chunks": len(more["chunks"]), "remaining_tokens": more["remaining_tokens"]}

    # the receiver's own report sets the confidence (no current_confidence)
    more2 = await ok(s, "request_more_context", {"session": session, "report": SEMI_REPORT})
    summary["more_with_report"] = {"chunks": len(more2["chunks"]), "reason": more2["reason"]}

    # naming its session continues it (the server keeps the session's token)
    cont = await ok(s, "compress_context", {"task": TASK, "context": context, "budget": budget, "session": session})
    check(cont["session_id"] == session, "a call naming its session continues it", cont["session_id"])

    rendered = await ok(
        s, "compress_context", {"task": TASK, "context": context, "budget": budget, "render": "semi_structured"}
    )
    check(rendered["text"].startswith("[STATUS]"), "render writes a semi_structured report", rendered["text"][:80])
    check(rendered["session_id"] != session, "a new session per call without one", rendered["session_id"])

    # the budget in the receiver's tokenizer, and why each chunk was chosen
    counted = await ok(
        s,
        "compress_context",
        {"task": TASK, "context": context, "budget": 200, "budget_tokenizer": "o200k", "explain": True},
    )
    check(counted["totals"]["tokenizer"] == "o200k", "totals name the budget tokenizer", counted["totals"])
    check(counted["totals"]["sent_tokens"] <= 200, "within the o200k budget", counted["totals"])
    ex = counted.get("explanation") or {}
    check(
        [w["id"] for w in ex.get("selected", [])] == [c["id"] for c in counted["chunks"]],
        "the explanation lists the sent chunks in order",
        ex,
    )
    for w in ex["selected"]:
        parts = w["dense_z"] + ex["lexical_weight"] * w["lexical_z"] + w["group_lift"] + w["link_lift"] + w["hop_lift"]
        parts += w["rerank_lift"]
        check(abs(parts - w["score"]) < 1e-3, "score parts add up", w)
    check("explanation" not in rendered, "no explanation unless asked", rendered.keys())
    summary["budget_tokenizer"] = {
        "tokenizer": counted["totals"]["tokenizer"],
        "sent_tokens": counted["totals"]["sent_tokens"],
        "explained": len(ex["selected"]),
        "dropped_reasons": sorted({d["reason"] for d in ex["dropped"]}),
    }

    # rate (LLMLingua's: the share of the context to keep) instead of a budget
    shares = {}
    for rate in (0.25, 1.0):
        kept = await ok(s, "compress_context", {"task": TASK, "context": context, "rate": rate, "budget_tokenizer": "cl100k"})
        t = kept["totals"]
        budget = max(1, math.floor(t["context_tokens"] * rate))
        check(abs(t["requested_ratio"] - t["context_tokens"] / budget) < 1e-3 * t["requested_ratio"], "rate's budget", t)
        check(0 < t["sent_tokens"] <= budget, f"within rate {rate}'s budget", t)
        shares[str(rate)] = {"context_tokens": t["context_tokens"], "requested_ratio": t["requested_ratio"],
                             "sent_tokens": t["sent_tokens"]}
    summary["rate"] = shares

    n = await ok(s, "count_tokens", {"text": "the checkout page spins forever"})
    check(n["tokens"] > 0 and n["tokenizer"] == "e5", "count_tokens", n)
    n = await ok(s, "count_tokens", {"text": "the checkout page spins forever", "tokenizer": "cl100k"})
    check(n["tokens"] == 5 and n["tokenizer"] == "cl100k", "count_tokens in cl100k", n)
    brief = await ok(s, "embed", {"texts": ["connection pool exhausted"], "query": True})
    check("values" not in brief["embeddings"][0], "no vectors unless asked", brief)
    check(len(brief["embeddings"][0]["digest"]) == 16, "a digest", brief)
    emb = await ok(s, "embed", {"texts": ["connection pool exhausted", "newsletter font"], "query": True, "vectors": True})
    check(emb["embeddings"][0]["digest"] == brief["embeddings"][0]["digest"], "equal vectors, equal digests", emb)
    check(len(emb["embeddings"]) == 2, "two embeddings", len(emb["embeddings"]))
    for e in emb["embeddings"]:
        norm = math.sqrt(sum(v * v for v in e["values"]))
        check(len(e["values"]) == emb["dim"] and abs(norm - 1) < 1e-3, "unit vectors of dim", (emb["dim"], norm))
    summary["embed"] = {"model": emb["model"], "dim": emb["dim"]}

    # bad arguments: tool errors naming the argument, never a crash
    errors = {}
    errors["budget"] = await tool_error(
        s, "compress_context", {"task": TASK, "context": context, "budget": -1}, "budget:"
    )
    errors["zero_budget"] = await tool_error(
        s, "compress_context", {"task": TASK, "context": context, "budget": 0}, "budget: must be at least 1"
    )
    for key, bad in (("rate_zero", 0), ("rate_over_one", 1.5)):
        errors[key] = await tool_error(s, "compress_context", {"task": TASK, "context": context, "rate": bad}, "rate:")
    errors["rate_and_budget"] = await tool_error(
        s, "compress_context", {"task": TASK, "context": context, "rate": 0.5, "budget": 50}, "rate:"
    )
    errors["no_budget"] = await tool_error(s, "compress_context", {"task": TASK, "context": context}, "budget:")
    typo = {"fields": [dict(context["fields"][0], confidental=True)]}
    errors["unknown_key"] = await tool_error(
        s, "compress_context", {"task": TASK, "context": typo, "budget": 50}, "context.fields[0].confidental:"
    )
    errors["kind"] = await tool_error(
        s,
        "compress_context",
        {"task": TASK, "context": {"fields": [{"name": "a", "kind": "poem", "content": "x"}]}, "budget": 50},
        "context.fields[0].kind:",
    )
    errors["budget_tokenizer"] = await tool_error(
        s,
        "compress_context",
        {"task": TASK, "context": context, "budget": 50, "budget_tokenizer": "/etc/passwd"},
        "budget_tokenizer: unknown tokenizer",
    )
    # an error about the confidential field names it, never its content
    text = await tool_error(
        s,
        "compress_context",
        {"task": TASK, "context": context, "budget": 500, "required": ["api_keys"]},
        "required:",
    )
    check("api_keys" in text and "confidential" in text, "the error names the confidential field", text)
    errors["confidential"] = text
    errors["session"] = await tool_error(
        s, "request_more_context", {"session": "nope", "question": "q", "current_confidence": 0.5}, "session:"
    )
    errors["confidence"] = await tool_error(
        s, "request_more_context", {"session": session, "question": "q"}, "current_confidence:"
    )
    errors["texts"] = await tool_error(s, "embed", {"texts": [""]}, "texts[0]:")
    summary["errors"] = errors

    # still answering
    again = await ok(s, "count_tokens", {"text": "still here"})
    check(again["tokens"] > 0, "answers after the errors", again)

    for text in seen:
        check(SECRET not in text, "the confidential content never appears", text[:200])
    summary["responses_checked"] = len(seen)
    return summary


async def bench(s, context, n):
    """Wall time of `n` sequential calls per tool, measured at the client."""
    import statistics
    import time

    calls = {
        "compress_context": {"task": TASK, "context": context, "budget": 400},
        "count_tokens": {"text": "the checkout page spins forever"},
        "embed": {"texts": ["connection pool exhausted"], "query": True},
    }
    out = {"n": n}
    for name, args in calls.items():
        await ok(s, name, args)  # warm-up
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await ok(s, name, args)
            times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        out[name] = {
            "p50_ms": round(statistics.median(times), 2),
            "p95_ms": round(times[int(0.95 * (n - 1))], 2),
            "mean_ms": round(statistics.fmean(times), 2),
        }
    return out


async def two_clients(url, context):
    """Two MCP clients (two MCP sessions) of one HTTP server: B can neither
    continue nor reopen A's session; A still can."""
    out = {}
    async with streamable_http_client(url) as a_streams, streamable_http_client(url) as b_streams:
        async with ClientSession(a_streams[0], a_streams[1]) as a, ClientSession(b_streams[0], b_streams[1]) as b:
            await a.initialize()
            await b.initialize()
            opened = await ok(a, "compress_context", {"task": TASK, "context": context, "budget": 100})
            session = opened["session_id"]
            out["more"] = await tool_error(
                b,
                "request_more_context",
                {"session": session, "question": "which function?", "current_confidence": 0.2},
                "session:",
            )
            out["continue"] = await tool_error(
                b, "compress_context", {"task": TASK, "context": context, "budget": 100, "session": session}, "session:"
            )
            mine = await ok(
                a, "request_more_context", {"session": session, "question": "which function?", "current_confidence": 0.2}
            )
            out["owner_continues"] = isinstance(mine["remaining_tokens"], int)
            again = await ok(a, "compress_context", {"task": TASK, "context": context, "budget": 100, "session": session})
            out["owner_reopens"] = again["session_id"] == session
    return out


def cl100k(path):
    """tiktoken's own cl100k_base, its file seeded into tiktoken's cache from
    a local copy (tiktoken checks its sha256, so it is OpenAI's file)."""
    import hashlib
    import os
    import shutil
    import tempfile

    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    cache = tempfile.mkdtemp(prefix="tiktoken-")
    shutil.copyfile(path, os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()))
    os.environ["TIKTOKEN_CACHE_DIR"] = cache
    import tiktoken

    return tiktoken.get_encoding("cl100k_base")


def real_contexts(hotpot, code, n):
    """`n` HotpotQA contexts (a field per paragraph) and `n` Rust source contexts."""
    out = []
    with open(hotpot) as f:
        for line in f:
            r = json.loads(line)
            c = r["context"]
            fields = [
                {"name": t, "kind": "prose", "content": " ".join(ss)} for t, ss in zip(c["title"], c["sentences"])
            ]
            seen, uniq = set(), []
            for fl in fields:
                if fl["name"] not in seen:
                    seen.add(fl["name"])
                    uniq.append(fl)
            out.append(("hotpotqa", r["question"], {"fields": uniq}))
            if len(out) == n:
                break
    with open(code) as f:
        for line in f:
            r = json.loads(line)
            out.append(("code", r["task"], r["context"]))
            if len(out) == 2 * n:
                break
    check(len(out) == 2 * n, "enough real contexts", len(out))
    return out


async def window(s, enc, cases):
    """Every text block a model gets from compress_context (and a follow-up)
    counted with tiktoken's cl100k: at most 1.1x the budget plus a 64-token
    header, with explain and render too."""
    count = lambda t: len(enc.encode(t, disallowed_special=()))
    variants = [{}, {"explain": True}, {"render": "semi_structured"}, {"render": "structured_soft", "explain": True}]
    calls, worst, total_blocks, total_budget, header_max = 0, 0.0, 0, 0, 0
    for source, task, context in cases:
        size = sum(count(fl["content"]) for fl in context["fields"])
        budget = max(size // 5, 1)
        for v in variants:
            args = dict({"task": task, "context": context, "budget": budget, "budget_tokenizer": "cl100k"}, **v)
            r = await call(s, "compress_context", args)
            check(not r.is_error, f"{source} {v}: succeeds", error_text(r))
            blocks = [c.text for c in r.content if getattr(c, "type", "") == "text"]
            n = sum(count(b) for b in blocks)
            header = count(blocks[0].partition("\n")[0])
            header_max = max(header_max, header)
            check(header <= 64, f"{source} {v}: the header is at most 64 tokens", header)
            check(n <= 1.1 * budget + 64, f"{source} {v}: {n} cl100k tokens for a budget of {budget}", blocks[0][:200])
            body = r.structured_content["text"]
            check(count(body) <= budget, f"{source} {v}: the text within the budget", count(body))
            calls += 1
            worst = max(worst, (n - header) / budget)
            total_blocks += n
            total_budget += budget
        # a follow-up with its own budget
        ask = max(budget // 2, 1)
        r = await call(
            s,
            "request_more_context",
            {"session": r.structured_content["session_id"], "question": task, "current_confidence": 0.2,
             "max_tokens": ask},
        )
        check(not r.is_error, f"{source}: a follow-up succeeds", error_text(r))
        n = sum(count(c.text) for c in r.content if getattr(c, "type", "") == "text")
        check(n <= 1.1 * ask + 64, f"{source}: follow-up {n} cl100k tokens for {ask}", r.content[0].text[:200])
        calls += 1
        total_blocks += n
        total_budget += ask
    return {"calls": calls, "worst_body_ratio": round(worst, 3), "overall_ratio": round(total_blocks / total_budget, 3),
            "header_max_tokens": header_max}


async def main():
    mode, context_path = sys.argv[1], sys.argv[2]
    with open(context_path) as f:
        context = json.load(f)
    check(any(SECRET in fl["content"] for fl in context["fields"]), "the fixture holds the secret", context_path)
    if mode == "bench":
        rest = sys.argv[sys.argv.index("--") + 1 :]
        params = StdioServerParameters(command=rest[0], args=rest[1:], env=None)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                summary = await bench(s, context, int(sys.argv[3]))
        summary["server"] = rest
        print(json.dumps(summary))
        return
    if mode == "show":
        rest = sys.argv[sys.argv.index("--") + 1 :]
        params = StdioServerParameters(command=rest[0], args=rest[1:], env=None)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                args = {"task": sys.argv[3], "context": context, "budget": int(sys.argv[4]), "budget_tokenizer": "cl100k"}
                r = await s.call_tool("compress_context", args)
                for c in r.content:
                    print(c.text)
        return
    if mode == "tools":
        rest = sys.argv[sys.argv.index("--") + 1 :]
        params = StdioServerParameters(command=rest[0], args=rest[1:], env=None)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                listed = await s.list_tools()
        # what the server sent, as the client parsed it: fields it left out stay out
        shown = listed.model_dump(mode="json", by_alias=True, exclude_none=True)
        tools_json = json.dumps(shown, separators=(",", ":"), ensure_ascii=False)
        print(json.dumps({"tools": sorted(t.name for t in listed.tools), "tools_json": tools_json}))
        return
    if mode == "window":
        rest = sys.argv[sys.argv.index("--") + 1 :]
        enc = cl100k(sys.argv[3])
        cases = real_contexts(sys.argv[4], sys.argv[5], 3)
        params = StdioServerParameters(command=rest[0], args=rest[1:], env=None)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                summary = await window(s, enc, cases)
        print(json.dumps(summary))
        return
    if mode == "stdio":
        rest = sys.argv[sys.argv.index("--") + 1 :]
        params = StdioServerParameters(command=rest[0], args=rest[1:], env=None)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                summary = await suite(s, context)
    elif mode == "two_clients":
        summary = await two_clients(sys.argv[3], context)
    elif mode == "http":
        async with streamable_http_client(sys.argv[3]) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as s:
                await s.initialize()
                summary = await suite(s, context)
    else:
        raise SystemExit(f"unknown mode {mode!r} (stdio or http)")
    summary["transport"] = mode
    print(json.dumps(summary))


asyncio.run(main())
