// spanrl ui: hash-routed pages over the JSON API of spanrl/ui/app.py. Every value from the store goes
// in through textContent (never innerHTML): span attributes are untrusted text.
"use strict";
const main = document.getElementById("main");
let timer = null;  // the rollouts page's live refresh

// --- helpers ---------------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const num = (v, d = 3) => (v === null || v === undefined ? "" : (Number.isInteger(v) ? String(v) : (+v).toFixed(d)));
const fixed = v => (v === null || v === undefined ? "" : (+v).toFixed(3));  // returns, advantages: always 3 places
const ms = v => (v === null || v === undefined ? "" : v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(1) + " ms");
const when = ns => (ns ? new Date(ns / 1e6).toLocaleString() : "");

async function api(path, opts) {
  opts = opts || {};
  const headers = Object.assign({}, opts.headers || {});
  const token = sessionStorage.getItem("spanrl-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const resp = await fetch(path, Object.assign({}, opts, { headers }));
  if (resp.status === 401) {
    askToken();
    throw Object.assign(new Error("the viewer needs the collector's token"), { handled: true });  // the form is shown
  }
  if (!resp.ok) {
    let msg = resp.statusText;
    try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new Error(msg);
  }
  return opts.raw ? resp : resp.json();
}

function askToken() {
  stopTimer();
  const input = h("input", { type: "password", placeholder: "token", size: 40, id: "token" });
  const save = () => { sessionStorage.setItem("spanrl-token", input.value.trim()); route(); };
  fill(main, h("div", { class: "card" }, h("h1", {}, "Token"),
    h("p", {}, "This viewer reads with the collector's bearer token (SPANRL_COLLECTOR_TOKEN)."),
    input, " ", h("button", { onclick: save }, "Open")));
}

// replaceChildren that skips null / false (conditional children)
function fill(el, ...kids) { el.replaceChildren(...kids.flat().filter(k => k !== null && k !== undefined && k !== false)); return el; }
function fail(err) { if (err.handled) return; fill(main, h("div", { class: "error" }, String(err.message || err))); }
function stopTimer() { if (timer) { clearInterval(timer); timer = null; } }

// --- router --------------------------------------------------------------------------------------
function route() {
  stopTimer();
  const hash = location.hash || "#/rollouts";
  const [path, qs] = hash.slice(1).split("?");
  const parts = path.split("/").filter(Boolean);
  const page = parts[0] || "rollouts";
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.page === page.replace(/^rollout$/, "rollouts")));
  const params = new URLSearchParams(qs || "");
  const pages = { rollouts: rolloutsPage, rollout: () => rolloutPage(decodeURIComponent(parts.slice(1).join("/"))),
                  runs: runsPage, sql: sqlPage };
  (pages[page] || rolloutsPage)(params).catch(fail);
}
window.addEventListener("hashchange", route);

// --- rollouts --------------------------------------------------------------------------------------
const ROLLOUT_COLUMNS = [
  ["rollout_id", "rollout"], ["task_id", "task"], ["mode", "mode"], ["status", "status"],
  ["final_reward", "reward", true], ["policy_version", "policy", true], ["agents", "agents"],
  ["span_count", "spans", true], ["duration_ms", "duration", true], ["start_ns", "started"]];
const SORTABLE = new Set(["rollout_id", "task_id", "mode", "status", "final_reward", "policy_version", "span_count", "duration_ms", "start_ns"]);

async function rolloutsPage(params) {
  const state = { status: params.get("status") || "", mode: params.get("mode") || "", q: params.get("q") || "",
                  sort: params.get("sort") || "start_ns", desc: params.get("desc") !== "0", limit: 200 };
  const counts = h("div", { class: "toolbar", id: "status-counts" });
  const text = h("input", { type: "search", placeholder: "filter: rollout, task, agent", value: state.q, size: 30, id: "filter" });
  const mode = h("select", { id: "mode" }, ["", "train", "val"].map(m => h("option", { value: m, selected: m === state.mode }, m || "any mode")));
  const stamp = h("span", { class: "muted", id: "updated" });
  const table = h("div", { class: "scroll" });
  const more = h("button", { id: "more", onclick: () => { state.limit = Math.min(5000, state.limit + 200); reload(); } }, "show 200 more");
  fill(main, h("h1", {}, "Rollouts"), counts, h("div", { class: "toolbar" }, text, mode, stamp), table, h("div", { class: "toolbar" }, more));
  const reload = () => load().catch(e => fill(stamp, h("span", { class: "error" }, e.message)));
  text.addEventListener("input", () => { state.q = text.value; reload(); });
  mode.addEventListener("change", () => { state.mode = mode.value; reload(); });

  async function load() {
    const qs = new URLSearchParams({ status: state.status, mode: state.mode, q: state.q, sort: state.sort, desc: state.desc ? "1" : "0", limit: String(state.limit) });
    const data = await api("/api/rollouts?" + qs);
    const all = Object.values(data.counts).reduce((a, b) => a + b, 0);
    const button = (status, label, n) => h("button", { class: state.status === status ? "on" : "", "data-status": status || "all",
      onclick: () => { state.status = status; reload(); } }, `${label} ${n}`);
    fill(counts, button("", "all", all), ...Object.entries(data.counts).map(([s, n]) => button(s, s, n)));
    const head = h("tr", {}, ROLLOUT_COLUMNS.map(([key, label, isNum]) => h("th", {
      class: [isNum ? "num" : "", SORTABLE.has(key) ? "sortable" : "", state.sort === key ? "sorted" : ""].join(" "),
      onclick: SORTABLE.has(key) ? () => { state.desc = state.sort === key ? !state.desc : true; state.sort = key; reload(); } : null,
    }, label + (state.sort === key ? (state.desc ? " ▾" : " ▴") : ""))));
    const rows = data.rows.map(r => h("tr", { "data-rollout": r.rollout_id },
      h("td", {}, h("a", { href: "#/rollout/" + encodeURIComponent(r.rollout_id) }, r.rollout_id)),
      h("td", {}, r.task_id ?? ""), h("td", {}, r.mode ?? ""), h("td", {}, h("span", { class: "badge " + r.status }, r.status)),
      h("td", { class: "num" }, num(r.final_reward)), h("td", { class: "num" }, num(r.policy_version)),
      h("td", {}, r.agents ?? ""), h("td", { class: "num" }, r.span_count), h("td", { class: "num" }, ms(r.duration_ms)),
      h("td", {}, when(r.start_ns))));
    fill(table, h("table", { id: "rollouts" }, h("thead", {}, head), h("tbody", {}, rows)));
    stamp.textContent = `${data.total} rollouts match; showing ${data.rows.length}; updated ${new Date().toLocaleTimeString()} (live)`;
    more.hidden = data.rows.length >= data.total || state.limit >= 5000;
  }
  await load();
  timer = setInterval(() => { if (!document.hidden) reload(); }, 2000);
}

// --- one rollout ------------------------------------------------------------------------------------
function spanClass(s) {
  if (s.status_code === "ERROR") return "err";
  if (["chat", "generate_content", "text_completion"].includes(s.operation_name)) return "llm";
  if (s.operation_name === "execute_tool") return "tool";
  if (s.operation_name === "invoke_agent") return "agent";
  if (s.reward_value !== null && s.reward_value !== undefined) return "reward";
  return "";
}

function waterfall(spans, detail) {
  const t0 = Math.min(...spans.map(s => s.start_ns)), t1 = Math.max(...spans.map(s => s.end_ns));
  const span = Math.max(t1 - t0, 1);
  const rows = treeOrder(spans).map(([s, depth]) => {
    const bar = h("div", { class: "wf-bar " + spanClass(s), title: `${s.name}: ${ms((s.end_ns - s.start_ns) / 1e6)}` });
    bar.style.left = ((s.start_ns - t0) / span * 100).toFixed(2) + "%";
    bar.style.width = ((s.end_ns - s.start_ns) / span * 100).toFixed(2) + "%";
    const name = h("div", { class: "wf-name" }, s.name + (s.service_name ? `  · ${s.service_name}` : ""));
    name.style.paddingLeft = (depth * 12) + "px";
    const row = h("div", { class: "wf-row", "data-span": s.span_id }, name, h("div", { class: "wf-track" }, bar));
    row.addEventListener("click", () => {
      document.querySelectorAll(".wf-row.sel").forEach(r => r.classList.remove("sel"));
      row.classList.add("sel");
      fill(detail, h("b", {}, s.name), ` ${s.kind} · ${s.status_code}${s.status_message ? ": " + s.status_message : ""} · ${ms((s.end_ns - s.start_ns) / 1e6)}`,
        h("pre", {}, JSON.stringify({ attributes: unnest(s.attributes), events: s.events }, null, 1)));
    });
    return row;
  });
  const legend = h("div", { class: "legend" }, [["agent", "--agent"], ["LLM call", "--llm"], ["tool", "--tool"], ["reward", "--reward"], ["error", "--err"]]
    .map(([label, v]) => { const i = h("i"); i.style.background = `var(${v})`; return h("span", {}, i, label); }));
  return h("div", { class: "card" }, legend, h("div", { class: "wf", id: "waterfall" }, rows), detail);
}

// Attribute values holding JSON text (gen_ai.input.messages, ...) shown as JSON, not as escaped strings.
function unnest(attrs) {
  const out = {};
  for (const [k, v] of Object.entries(attrs || {})) {
    if (typeof v === "string" && /^\s*[[{]/.test(v)) { try { out[k] = JSON.parse(v); continue; } catch (e) { /* text */ } }
    out[k] = v;
  }
  return out;
}

// Depth-first, children by start time; a span whose parent is not stored starts a tree of its own.
function treeOrder(spans) {
  const ids = new Set(spans.map(s => s.span_id));
  const kids = new Map();
  const roots = [];
  for (const s of spans) {
    if (s.parent_span_id && ids.has(s.parent_span_id) && s.parent_span_id !== s.span_id) {
      if (!kids.has(s.parent_span_id)) kids.set(s.parent_span_id, []);
      kids.get(s.parent_span_id).push(s);
    } else roots.push(s);
  }
  const out = [], seen = new Set();
  const walk = (s, d) => {
    if (seen.has(s.span_id)) return;  // a cycle in bad data
    seen.add(s.span_id);
    out.push([s, d]);
    for (const c of kids.get(s.span_id) || []) walk(c, d + 1);
  };
  roots.forEach(r => walk(r, 0));
  spans.forEach(s => { if (!seen.has(s.span_id)) walk(s, 0); });
  return out;
}

// One part of an OTel GenAI message: text, a tool call, or a tool's answer.
function partText(p) {
  if (p.type === "tool_call") return `→ ${p.name}(${typeof p.arguments === "string" ? p.arguments : JSON.stringify(p.arguments ?? {})})`;
  if (p.type === "tool_call_response") return `← ${typeof p.response === "string" ? p.response : JSON.stringify(p.response)}`;
  return p.content ?? JSON.stringify(p);
}

function messageList(messages) {
  if (!Array.isArray(messages)) return messages ? h("pre", {}, String(messages)) : null;
  return messages.map(m => {
    let body = m.content;
    if (body === undefined && Array.isArray(m.parts)) body = m.parts.map(partText).join("\n");
    if (typeof body !== "string") body = JSON.stringify(body ?? m);
    return h("div", { class: "msg" }, h("div", { class: "role" }, m.role || "message"), h("pre", {}, body));
  });
}

function tokenView(call, transition) {
  const ids = call.completion_ids;
  if (!ids) return h("p", { class: "muted" }, "no token ids recorded (an external API call, known by its messages)");
  const mask = transition ? transition.completion_mask : null;
  const lps = call.logprobs || [];
  const chips = ids.map((id, i) => {
    const lp = lps[i];
    const text = call.completion_text ? call.completion_text[i] : String(id);
    const chip = h("span", { class: "tok " + (mask ? (mask[i] ? "masked" : "unmasked") : ""),
      title: `token ${id}` + (lp !== undefined ? ` · logprob ${lp.toFixed(3)} · p ${Math.exp(lp).toFixed(3)}` : "") + (mask ? ` · mask ${mask[i]}` : "") }, text);
    if (lp !== undefined) chip.style.background = `rgba(214, 39, 40, ${Math.min(1, 1 - Math.exp(lp)).toFixed(2)})`;
    return chip;
  });
  return h("div", { class: "tokens" }, chips);
}

async function rolloutPage(id) {
  fill(main, h("p", { class: "muted" }, "Loading " + id + "…"));
  const d = await api("/api/rollout?id=" + encodeURIComponent(id));
  const r = d.rollout;
  const detail = h("div", { class: "muted" }, "click a span for its attributes");
  const creditBox = h("div", { class: "card", id: "credit" }, h("span", { class: "muted" }, "computing credit…"));
  const callsBox = h("div", { id: "calls" });
  const lastReward = d.rewards.length ? d.rewards[d.rewards.length - 1].value : null;
  fill(main, 
    h("h1", {}, "Rollout ", h("code", {}, id)),
    h("div", { class: "card kv" }, h("span", {}, h("b", {}, "task "), r.task_id ?? "—"), h("span", {}, h("b", {}, "mode "), r.mode ?? "—"),
      h("span", {}, h("b", {}, "status "), h("span", { class: "badge " + r.status }, r.status)), h("span", {}, h("b", {}, "reward "), num(lastReward)),
      h("span", {}, h("b", {}, "spans "), r.span_count ?? d.spans.length), h("span", {}, h("b", {}, "LLM calls "), d.calls.length),
      h("span", {}, h("b", {}, "duration "), r.end_ns ? ms((r.end_ns - r.start_ns) / 1e6) : ""), h("span", {}, h("b", {}, "started "), when(r.start_ns))),
    h("h2", {}, "Span tree"), waterfall(d.spans, detail),
    d.spans_truncated ? h("p", { class: "muted" }, "showing the first spans only") : null,
    h("h2", {}, "Credit: transitions built from this rollout"), creditBox,
    h("h2", {}, "LLM calls"), callsBox);
  renderCalls(callsBox, d, null);
  try {
    const c = await api("/api/credit?id=" + encodeURIComponent(id));
    renderCredit(creditBox, c);
    renderCalls(callsBox, d, c);
  } catch (e) { fill(creditBox, h("div", { class: "error" }, e.message)); }
}

function renderCalls(box, d, credit) {
  const byStep = new Map((credit ? credit.transitions : []).map(t => [t.step, t]));
  const skipped = new Map((credit ? credit.skipped : []).map(s => [s.step, s.reason]));
  const rewardsAt = step => d.rewards.filter(w => w.step === step).map(w =>
    h("div", { class: "reward-line" }, `reward${w.name === "reward" ? "" : " " + w.name} = ${num(w.value)} ` +
      (w.step < 0 ? "(before the first call)" : `(after step ${w.step})`)));
  fill(box, ...rewardsAt(-1), ...d.calls.flatMap(c => {
    const t = byStep.get(c.step);
    const head = h("div", { class: "kv" }, h("b", {}, `step ${c.step}`), h("span", {}, c.agent ? "agent " + c.agent : "no agent"),
      h("span", {}, c.model || ""), c.adapter ? h("span", { class: "adapter" }, "adapter " + c.adapter) : null,
      h("span", {}, (c.adapter ? "adapter v" : "policy v") + (c.policy_version ?? "—")),
      h("span", {}, `tokens in ${c.input_tokens ?? "?"} / out ${c.output_tokens ?? "?"}`), h("span", {}, "latency " + ms(c.latency_ms)),
      h("span", {}, c.status_code),
      t ? h("span", { class: "adv" }, h("b", {}, "return "), fixed(t.reward), h("b", {}, "  advantage "), fixed(t.advantage)) : null,
      skipped.has(c.step) ? h("span", { class: "skip" }, "skipped: " + skipped.get(c.step)) : null);
    const msgs = h("details", {}, h("summary", {}, "messages"), h("div", {}, "input:"), messageList(c.input_messages),
      h("div", {}, "output:"), messageList(c.output_messages));
    return [h("div", { class: "card call", "data-step": c.step }, head, msgs,
      h("div", { class: "muted" }, "completion, token by token (red = unlikely under the policy; underline = trained, mask 1):"),
      tokenView(c, t)), ...rewardsAt(c.step)];
  }));
}

function renderCredit(box, c) {
  const g = c.group;
  const rows = c.transitions.map(t => h("tr", { "data-step": t.step }, h("td", { class: "num" }, t.step), h("td", {}, t.agent ?? ""),
    h("td", { class: "num" }, fixed(t.reward)), h("td", { class: "num advantage" }, fixed(t.advantage)),
    h("td", { class: "label" }, t.label === true ? "good" : t.label === false ? "bad" : ""),
    h("td", { class: "signals", title: "what the call's tool spans say went wrong (credit step_signals)" },
      Object.entries(t.signals || {}).map(([k, n]) => n > 1 ? `${k} ×${n}` : k).join(", ") +
      (t.signal_reward ? ` (${t.signal_reward > 0 ? "+" : ""}${fixed(t.signal_reward)})` : "")),
    h("td", { class: "num" }, t.completion_mask.reduce((a, b) => a + b, 0)), h("td", { class: "num" }, num(t.policy_version)),
    h("td", {}, t.retokenized ? "yes" : "")));
  fill(box, 
    h("p", {}, `Credit ${c.credit.mode}, baseline ${c.credit.baseline}${c.credit.scale_std ? " (÷ std)" : ""}`,
      c.credit.step_group_weight ? ` + step groups (GiGPO, weight ${c.credit.step_group_weight})` : "",
      c.credit.step_signals ? " + step signals (" + Object.entries(c.credit.step_signals).map(([k, w]) => `${k} ${w}`).join(", ") + ")" : "",
      c.credit.trajectory_aggregation ? "; trained as one sample per conversation, each call's advantage on its own tokens" : "",
      ", over the group: ",
      h("b", {}, `${g.rollouts} rollout(s)`), ` of task ${g.task_id ?? "—"} (${g.mode ?? "train"}, policy v${g.policy_version ?? "—"}); `,
      `episode reward ${num(g.episode_reward)}, group mean ${num(g.reward_mean)}.`),
    c.transitions.length ? h("table", { id: "transitions" }, h("thead", {}, h("tr", {}, ["step", "agent", "return", "advantage", "label", "signals", "trained tokens", "policy", "retokenized"]
      .map((x, i) => h("th", { class: [1, 4, 5, 8].includes(i) ? "" : "num" }, x)))), h("tbody", {}, rows))
      : h("p", { class: "skip" }, "no transitions: this rollout's calls would not be trained"),
    c.skipped.length ? h("ul", {}, c.skipped.map(s => h("li", { class: "skip" }, `step ${s.step}: ${s.reason}`))) : null,
    h("details", {}, h("summary", {}, "load_transitions report (group)"), h("pre", {}, JSON.stringify(c.report, null, 1))));
}

// --- runs ---------------------------------------------------------------------------------------------
const RUN_CHARTS = [
  ["reward (training rollouts)", ["reward_mean"], true], ["held-out success", ["val_success"], true],
  ["KL", ["losses/approx_kl", "losses/kl_ref"]], ["entropy", ["losses/entropy"]],
  ["clip fraction", ["losses/clipfrac"]], ["policy version", ["policy_version"]]];
// per-agent policies: one curve per agent from its agents/<name>/<key> history keys
const AGENT_CHARTS = [["reward per agent", "reward_mean", true], ["advantage per agent", "advantage_mean"],
  ["calls per agent", "transitions"], ["adapter version per agent", "policy_version"]];

function agentCharts(run) {
  const keys = [...new Set(run.rows.flatMap(r => Object.keys(r)))].filter(k => k.startsWith("agents/")).sort();
  return AGENT_CHARTS.map(([title, suffix, unit]) => {
    const mine = keys.filter(k => k.endsWith("/" + suffix));
    if (!mine.length) return null;
    return lineChart(title, mine.map(k => ({ name: k.split("/")[1],
      points: run.rows.filter(r => r[k] !== undefined && r[k] !== null).map(r => [r.step, r[k]]) })),
      { unit, step: suffix === "policy_version" });
  }).filter(c => c);
}

async function runsPage(params) {
  const data = await api("/api/runs");
  const names = data.runs.map(r => r.name);
  fill(main, h("h1", {}, "Runs"));
  if (!names.length) main.appendChild(h("p", { class: "muted" }, "No runs: start spanrl ui with --run OUTPUT_DIR (a folder with history.jsonl)."));
  const a = params.get("a") || names.find(n => /grpo|ppo/i.test(n)) || names[0];
  const b = params.get("b") || "";
  const pick = (value, key) => h("select", { id: "run-" + key, onchange: e => { params.set(key, e.target.value); location.hash = "#/runs?" + params; } },
    key === "b" ? h("option", { value: "" }, "— second run —") : null, names.map(n => h("option", { value: n, selected: n === value }, n)));
  if (names.length) main.appendChild(h("div", { class: "toolbar" }, "run ", pick(a, "a"), " beside ", pick(b, "b")));
  const column = name => {
    const run = data.runs.find(r => r.name === name);
    if (!run) return h("div");
    const charts = RUN_CHARTS.map(([title, keys, unit]) => lineChart(title,
      keys.filter(k => run.rows.some(r => r[k] !== undefined && r[k] !== null))
        .map(k => ({ name: k, points: run.rows.filter(r => r[k] !== undefined && r[k] !== null).map(r => [r.step, r[k]]) })), { unit, step: title === "policy version" }));
    return h("div", { class: "run", "data-run": name }, h("h2", {}, name, h("span", { class: "muted" }, ` ${run.algorithm || ""} · ${run.rows.length} rows · ${run.path}`)),
      run.error ? h("div", { class: "error" }, run.error) : null, h("div", { class: "charts" }, charts, agentCharts(run)));
  };
  main.appendChild(b ? h("div", { class: "side" }, column(a), column(b)) : column(a));
  const versions = data.policy_versions;
  main.appendChild(h("h2", {}, "Policy version over time (store: calls stamped by the policy server)"));
  main.appendChild(h("div", { class: "charts" }, lineChart("policy version", [{ name: "version", points: versions.map(v => [v.first_ns / 1e9, v.version]) }],
    { step: true, xLabel: "time", xFormat: x => new Date(x * 1000).toLocaleTimeString() }),
    lineChart("calls per version", [{ name: "calls", points: versions.map(v => [v.version, v.calls]) }], { xLabel: "policy version" })));
}

// --- SQL ------------------------------------------------------------------------------------------------
async function sqlPage(params) {
  const box = h("textarea", { id: "sql", spellcheck: "false" }, params.get("q") || "SELECT status, count(*) AS n, avg(final_reward) AS reward\nFROM rollouts GROUP BY status ORDER BY n DESC");
  const out = h("div", { id: "sql-result" });
  const run = async () => {
    fill(out, h("span", { class: "muted" }, "running…"));
    try {
      const r = await api("/api/sql", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sql: box.value, format: "json" }) });
      fill(out, h("p", { class: "muted" }, `${r.total} rows` + (r.total > r.rows.length ? `, first ${r.rows.length} shown` : "")),
        h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, r.columns.map(c => h("th", { title: c.type }, c.name)))),
          h("tbody", {}, r.rows.map(row => h("tr", {}, row.map(v => h("td", {}, v === null ? "∅" : typeof v === "object" ? JSON.stringify(v) : String(v)))))))));
    } catch (e) { fill(out, h("div", { class: "error" }, e.message)); }
  };
  const download = fmt => async () => {
    try {
      const resp = await api("/api/sql", { method: "POST", raw: true, headers: { "content-type": "application/json" }, body: JSON.stringify({ sql: box.value, format: fmt }) });
      const url = URL.createObjectURL(await resp.blob());
      h("a", { href: url, download: "spanrl-query." + fmt }).click();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { fill(out, h("div", { class: "error" }, e.message)); }
  };
  box.addEventListener("keydown", e => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); });
  fill(main, h("h1", {}, "SQL"), h("p", { class: "muted" }, "One read statement over spans and the views rollouts, llm_calls, rewards (Ctrl+Enter runs it)."),
    box, h("div", { class: "toolbar" }, h("button", { id: "run-sql", class: "on", onclick: run }, "Run"),
      h("button", { onclick: download("csv") }, "CSV"), h("button", { onclick: download("parquet") }, "Parquet")), out);
  await run();
}

// --- start -----------------------------------------------------------------------------------------------
api("/api/info").then(info => { document.getElementById("source").textContent = info.source; }).catch(() => {});
route();
