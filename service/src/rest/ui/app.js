// The page at /ui: a client of the REST API like any other. Every text goes
// into the page as text (textContent, text nodes), never as markup, and a
// confidential field's content is never shown back.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  const KINDS = {
    rs: "code", py: "code", js: "code", ts: "code", go: "code", c: "code", h: "code", cc: "code", cpp: "code",
    java: "code", kt: "code", rb: "code", sh: "code", swift: "code", cs: "code", php: "code", scala: "code",
    log: "log", json: "json", md: "markdown", markdown: "markdown", sql: "table", csv: "table", tsv: "table",
  };
  // what the last compression sent, and what follow-ups added
  const state = { fields: [], reply: null, budget: 0, session: null, token: null, more: [], picked: [] };

  // an element with a class and children (strings become text nodes)
  function el(tag, className, ...children) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    for (const c of children) e.append(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }

  const num = (x) => (typeof x === "number" ? x.toFixed(2) : "?");

  function kindOf(name) {
    const dot = name.lastIndexOf(".");
    return (dot >= 0 && KINDS[name.slice(dot + 1).toLowerCase()]) || "prose";
  }

  // a context document's fields, or null when `v` is not one
  function fieldsOf(v) {
    if (Array.isArray(v)) return v;
    if (v && typeof v === "object" && Array.isArray(v.fields)) return v.fields;
    return null;
  }

  async function pickFiles() {
    for (const file of $("files").files) {
      const content = await file.text();
      let fields = null;
      if (file.name.toLowerCase().endsWith(".json")) {
        try {
          fields = fieldsOf(JSON.parse(content));
        } catch (_) {
          fields = null;
        }
      }
      if (fields) state.picked.push(...fields);
      else state.picked.push({ name: file.name, kind: kindOf(file.name), content, confidential: false });
    }
    $("files").value = "";
    showPicked();
  }

  // the picked fields by name and kind only (their content stays out of the page)
  function showPicked() {
    const list = $("file-list");
    list.replaceChildren();
    state.picked.forEach((f, i) => {
      const secret = el("input");
      secret.type = "checkbox";
      secret.checked = Boolean(f.confidential);
      secret.addEventListener("change", () => { f.confidential = secret.checked; });
      const drop = el("button", "small", "remove");
      drop.type = "button";
      drop.addEventListener("click", () => { state.picked.splice(i, 1); showPicked(); });
      const size = `${encoder.encode(f.content || "").length} bytes`;
      list.append(el("li", "", `${f.name} (${f.kind || "prose"}, ${size}) `, el("label", "", secret, " confidential "), drop));
    });
  }

  // the fields pasted (JSON or plain text) and picked
  function contextFields() {
    const text = $("context").value;
    let pasted = [];
    if (text.trim().startsWith("{") || text.trim().startsWith("[")) {
      let v;
      try {
        v = JSON.parse(text);
      } catch {
        // the parser's message quotes the text, which may be confidential
        throw new Error("the context is not valid JSON; plain text must not start with { or [");
      }
      pasted = fieldsOf(v);
      if (!pasted) throw new Error('a JSON context is {"fields": [...]} or a list of fields');
    } else if (text.trim()) {
      pasted = [{ name: "text", kind: "prose", content: text }];
    }
    const fields = pasted.concat(state.picked);
    if (!fields.length) throw new Error("give a context: paste it, or pick files");
    return fields;
  }

  async function api(method, path, body, token) {
    const headers = { "content-type": "application/json" };
    if (token) headers["x-scd-session-token"] = token;
    const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    let v = null;
    try {
      v = text ? JSON.parse(text) : null;
    } catch (_) {
      v = null;
    }
    if (!r.ok) {
      const e = v && v.error;
      const where = e && e.param ? ` (${e.param})` : "";
      throw new Error(`${r.status}: ${e ? e.message : text.slice(0, 200)}${where}`);
    }
    return v;
  }

  async function compress(ev) {
    ev.preventDefault();
    const status = $("status");
    let fields;
    try {
      fields = contextFields();
    } catch (e) {
      status.textContent = e.message;
      status.className = "error";
      return;
    }
    const budget = Number($("budget").value);
    const body = {
      task: $("task").value, context: { fields }, budget, budget_tokenizer: $("tokenizer").value,
      explain: true, list_dropped: true,
    };
    status.textContent = "compressing…";
    status.className = "";
    $("compress").disabled = true;
    try {
      const reply = await api("POST", "/v1/compress", body);
      if (state.session && state.token) {
        // the previous session is of no more use: close it (best effort)
        api("DELETE", `/v1/sessions/${encodeURIComponent(state.session)}`, undefined, state.token).catch(() => {});
      }
      Object.assign(state, { fields, reply, budget, session: reply.session_id, token: reply.session_token, more: [] });
      render();
      status.textContent = `Sent ${reply.chunks.length} chunks, ${reply.totals.sent_tokens} of ${budget} tokens.`;
      status.className = "done";
    } catch (e) {
      status.textContent = e.message;
      status.className = "error";
    } finally {
      $("compress").disabled = false;
    }
  }

  function render() {
    const r = state.reply;
    const t = r.totals;
    $("totals").textContent =
      `${t.sent_tokens} of ${state.budget} ${t.tokenizer} tokens sent (the context is ${t.context_tokens} tokens, ` +
      `${num(t.reduction_ratio)}× smaller); session ${r.session_id}` +
      (r.withheld_fields.length ? `; withheld (confidential): ${r.withheld_fields.join(", ")}` : "");
    $("warnings").replaceChildren(...r.warnings.map((w) => el("li", "warning", w)));
    renderFields();
    renderHeld();
    $("more-chunks").replaceChildren();
    $("more-status").textContent = "";
    $("results").hidden = false;
  }

  // each field with what was sent highlighted in place
  function renderFields() {
    const r = state.reply;
    const why = new Map(((r.explanation && r.explanation.selected) || []).map((w) => [w.id, w]));
    const lw = r.explanation ? r.explanation.lexical_weight : 0;
    const sent = r.chunks.map((c) => ({ ...c, more: false })).concat(state.more.map((c) => ({ ...c, more: true })));
    const withheld = new Set(r.withheld_fields);
    const views = state.fields.map((f) => {
      const head = el("h3", "", f.name, " ", el("span", "kind", f.kind || "prose"));
      if (f.confidential || withheld.has(f.name)) {
        return el("article", "field withheld", head, el("p", "note", "withheld: confidential, never sent and not shown here"));
      }
      const mine = sent.filter((c) => c.field === f.name);
      head.append(" ", el("span", "count", `${mine.length} of its chunks sent`));
      const list = el("ol", "why", ...mine.map((c) => el("li", c.more ? "more" : "", ...chunkLine(c, why.get(c.id), lw))));
      return el("article", "field", head, highlighted(f.content || "", mine, why), list);
    });
    $("fields").replaceChildren(...views);
  }

  // `content` in a <pre>, each chunk's byte span [start, end) in a <mark>
  function highlighted(content, chunks, why) {
    const bytes = encoder.encode(content);
    const pre = el("pre", "content");
    let at = 0;
    for (const c of [...chunks].sort((a, b) => a.span[0] - b.span[0])) {
      const start = Math.max(c.span[0], at);
      const end = Math.min(c.span[1], bytes.length);
      if (end <= start) continue;
      if (start > at) pre.append(decoder.decode(bytes.subarray(at, start)));
      const w = why.get(c.id);
      const tag = el("span", "tag", `${w ? "#" + w.order : c.more ? "more" : ""} ${num(c.score)}`);
      const mark = el("mark", c.more ? "kept more" : "kept", decoder.decode(bytes.subarray(start, end)));
      mark.dataset.id = c.id;
      mark.title = `${c.id}: score ${num(c.score)}, ${c.tokens} tokens`;
      pre.append(tag, mark);
      at = end;
    }
    if (at < bytes.length) pre.append(decoder.decode(bytes.subarray(at)));
    return pre;
  }

  // a sent chunk's id, score and why
  function chunkLine(c, w, lw) {
    const line = [el("code", "", c.id), ` score ${num(c.score)}, ${c.tokens} tokens`];
    if (c.more) line.push(" (follow-up)");
    if (w) line.push(el("span", "reason", `: ${reason(w, lw)}`));
    return line;
  }

  function reason(w, lw) {
    const parts = [`dense z ${num(w.dense_z)}`, `lexical z ${num(w.lexical_z)} × ${num(lw)}`];
    if (w.group_lift) parts.push(`group lift ${num(w.group_lift)}`);
    if (w.link_lift) parts.push(`link lift ${num(w.link_lift)}`);
    if (w.hop_lift) parts.push(`second-hop lift ${num(w.hop_lift)}`);
    if (w.rerank_lift) parts.push(`rerank lift ${num(w.rerank_lift)}`);
    const notes = [];
    if (w.required) notes.push("its field is required");
    if (w.by_closure) notes.push("brought along by its group");
    if (w.lead) notes.push("it leads its group");
    if (w.chunker) notes.push(`chunked as ${w.chunker}`);
    return `taken #${w.order}, ${parts.join(" + ")}${notes.length ? "; " + notes.join(", ") : ""}`;
  }

  function dropReason(d) {
    switch (d.reason) {
      case "out_of_budget": return "did not fit the budget";
      case "below_threshold": return `below ${d.threshold} (${num(d.value)})`;
      case "near_duplicate": return `near duplicate of ${d.of}`;
      case "not_eligible": return "not eligible";
      case "structure_only": return "structure only";
      default: return d.reason || "";
    }
  }

  // what was held back: the explained ones (best first) with the listed stubs
  function renderHeld() {
    const r = state.reply;
    const listed = new Map(r.dropped.listed ? r.dropped.listed.map((d) => [d.id, d]) : []);
    const explained = (r.explanation && r.explanation.dropped) || [];
    const rows = explained.map((d) => ({ ...d, ...(listed.get(d.id) || {}), why: dropReason(d) }));
    const seen = new Set(rows.map((d) => d.id));
    for (const d of listed.values()) if (!seen.has(d.id)) rows.push({ ...d, why: "" });
    // a chunk a follow-up sent is no longer held back
    const later = new Set(state.more.map((c) => c.id));
    const held = rows.filter((d) => !later.has(d.id));
    $("held-summary").textContent =
      `${r.dropped.count} chunks (${r.dropped.tokens} tokens) held back` +
      (later.size ? `, ${rows.length - held.length} of them sent since by follow-ups` : "") +
      "; confidential fields are never counted.";
    $("held").tBodies[0].replaceChildren(
      ...held.map((d) => {
        const cells = [el("code", "", d.id), d.field || "", d.score === undefined ? "" : num(d.score),
          String(d.tokens), d.why, d.stub || ""];
        return el("tr", "", ...cells.map((c) => el("td", "", c)));
      }),
    );
  }

  async function more(ev) {
    ev.preventDefault();
    const status = $("more-status");
    if (!state.session) return;
    const body = { question: $("question").value, current_confidence: Number($("confidence").value) };
    if ($("max-tokens").value) body.max_tokens = Number($("max-tokens").value);
    status.textContent = "asking…";
    status.className = "";
    $("more").disabled = true;
    try {
      const path = `/v1/sessions/${encodeURIComponent(state.session)}/more`;
      const m = await api("POST", path, body, state.token);
      state.more.push(...m.chunks);
      renderFields();
      renderHeld();
      // never a confidential field's content, even under a shared name
      const shown = state.fields.filter((f) => !f.confidential);
      const texts = new Map(shown.map((f) => [f.name, encoder.encode(f.content || "")]));
      $("more-chunks").replaceChildren(...m.chunks.map((c) => {
        const bytes = texts.get(c.field);
        const text = bytes ? decoder.decode(bytes.subarray(c.span[0], c.span[1])) : "";
        return el("li", "more", el("code", "", c.id), ` score ${num(c.score)}, ${c.tokens} tokens `,
          el("mark", "kept more", text));
      }));
      status.textContent = `${m.chunks.length} new chunks, ${m.sent_tokens} of ${m.budget} tokens; ` +
        `${m.session_sent_tokens} sent in this session, ${m.remaining_tokens} left` + (m.reason ? `; ${m.reason}` : "");
      status.className = "done";
    } catch (e) {
      status.textContent = e.message;
      status.className = "error";
    } finally {
      $("more").disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("ask").addEventListener("submit", compress);
    $("followup").addEventListener("submit", more);
    $("files").addEventListener("change", () => { pickFiles().catch((e) => { $("status").textContent = e.message; }); });
  });
})();
