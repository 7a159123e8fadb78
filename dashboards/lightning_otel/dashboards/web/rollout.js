// One rollout: summary, its span tree as a timeline, each LLM call's messages, and the token
// view of the training samples its calls become.

import { esc, fmt, html, section } from "./charts.js";
import { renderMessages } from "./messages.js";
import { renderTokenView } from "./tokens.js";

/** Spans in tree order (parent before children, siblings by start), with their depth. */
function treeOrder(spans) {
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map();
  const roots = [];
  for (const span of spans) {
    if (span.parent_span_id && ids.has(span.parent_span_id) && span.parent_span_id !== span.span_id) {
      if (!children.has(span.parent_span_id)) children.set(span.parent_span_id, []);
      children.get(span.parent_span_id).push(span);
    } else {
      roots.push(span); // its parent is outside the rollout (or it has none)
    }
  }
  const out = [];
  const visit = (span, depth) => {
    out.push({ span, depth });
    for (const child of children.get(span.span_id) || []) visit(child, depth + 1);
  };
  roots.forEach((span) => visit(span, 0));
  return out;
}

function kindClass(span) {
  return `kind-${String(span.span_kind || "other").toLowerCase()}${span.status_code === "ERROR" ? " error" : ""}`;
}

function timeline(spans) {
  const box = section("Span tree", "spans of this rollout nested by parent; bars by start and end time. Click a row for its attributes.");
  if (spans.length === 0) {
    box.append(html(`<p class="empty">no span carries this rollout id</p>`));
    return box;
  }
  const t0 = Math.min(...spans.map((s) => Number(s.start_us)));
  const t1 = Math.max(...spans.map((s) => Number(s.end_us)));
  const total = Math.max(t1 - t0, 1);
  const rows = treeOrder(spans).map(({ span, depth }) => {
    const left = (100 * (Number(span.start_us) - t0)) / total;
    const width = Math.max((100 * (Number(span.end_us) - Number(span.start_us))) / total, 0.3);
    const what = span.tool_name || span.model_name || (span.reward_name ? `${span.reward_name} = ${fmt(span.reward_value)}` : "");
    return `<div class="tl-row" data-span-id="${esc(span.span_id)}" data-depth="${depth}" data-testid="timeline-row">
      <div class="tl-name" style="padding-left:${depth * 16 + 4}px"><span class="badge ${kindClass(span)}">${esc(span.span_kind || "span")}</span>
        ${esc(span.name)} <span class="muted">${esc(what)}</span></div>
      <div class="tl-track"><div class="tl-bar ${kindClass(span)}" style="left:${left.toFixed(3)}%;width:${Math.min(width, 100 - left).toFixed(3)}%"
        title="${esc(`${span.name}: ${fmt(span.duration_ms)} ms`)}"></div></div>
      <div class="tl-ms">${esc(fmt(span.duration_ms, 3))} ms</div></div>`;
  });
  const scale = `<div class="tl-row tl-scale"><div class="tl-name"></div><div class="tl-track"><span>0 ms</span><span>${esc(fmt(total / 2000))} ms</span><span>${esc(fmt(total / 1000))} ms</span></div><div class="tl-ms"></div></div>`;
  const list = html(`<div class="timeline" data-testid="timeline">${scale}${rows.join("")}</div>`);
  const details = html(`<div class="span-details" data-testid="span-details"><p class="note">select a span</p></div>`);
  const byId = new Map(spans.map((s) => [s.span_id, s]));
  list.addEventListener("click", (event) => {
    const row = event.target.closest(".tl-row[data-span-id]");
    if (!row) return;
    for (const other of list.querySelectorAll(".tl-row.selected")) other.classList.remove("selected");
    row.classList.add("selected");
    details.replaceChildren(spanDetails(byId.get(row.dataset.spanId)));
  });
  box.append(list, details);
  return box;
}

function spanDetails(span) {
  const clip = (text) => (text.length > 2000 ? `${text.slice(0, 2000)}… (${text.length} characters)` : text);
  const fields = [["name", span.name], ["span_id", span.span_id], ["parent_span_id", span.parent_span_id], ["kind", span.span_kind],
    ["service", span.service_name], ["status", `${span.status_code}${span.status_message ? `: ${span.status_message}` : ""}`],
    ["duration_ms", fmt(span.duration_ms)]];
  const attrs = Object.entries(span.attributes || {}).sort(([a], [b]) => a.localeCompare(b));
  const rows = fields.concat(attrs).map(([k, v]) => `<tr><th>${esc(k)}</th><td><pre>${esc(clip(String(v ?? "")))}</pre></td></tr>`);
  const jump = span.has_tokens ? `<p><a href="#call-${esc(span.span_id)}" data-jump="${esc(span.span_id)}">its messages ↓</a></p>` : "";
  const element = html(`<div><h3>${esc(span.name)}</h3>${jump}<table class="kv">${rows.join("")}</table></div>`);
  // In-page anchors would change the route, so scroll by hand.
  element.querySelector("[data-jump]")?.addEventListener("click", (event) => {
    event.preventDefault();
    document.getElementById(`call-${span.span_id}`)?.scrollIntoView({ behavior: "smooth" });
  });
  return element;
}

function summary(rollout) {
  const rewards = Object.entries(rollout.rewards || {}).map(([k, v]) => `${esc(k)} = ${esc(fmt(v))}`).join(", ");
  return html(`<section class="card rollout-summary" data-testid="rollout-summary" data-rollout-id="${esc(rollout.rollout_id)}">
    <h2>Rollout <code>${esc(rollout.rollout_id)}</code> ${rollout.failed ? `<span class="bad">failed</span>` : ""}</h2>
    <dl>
      <dt>task</dt><dd>${esc(rollout.task_id ?? "—")}</dd><dt>attempt</dt><dd>${esc(fmt(rollout.attempt))}</dd>
      <dt>reward</dt><dd data-testid="rollout-reward">${esc(fmt(rollout.reward))}</dd><dt>all rewards</dt><dd>${rewards || "—"}</dd>
      <dt>start</dt><dd>${esc(rollout.start)}</dd><dt>duration</dt><dd>${esc(fmt(rollout.duration_ms))} ms</dd>
      <dt>LLM calls</dt><dd>${esc(fmt(rollout.llm_calls))}</dd><dt>tool calls</dt><dd>${esc(fmt(rollout.tool_calls))}</dd>
      <dt>policy versions</dt><dd>${esc((rollout.policy_versions || []).join(", ") || "—")}</dd><dt>service</dt><dd>${esc(rollout.service_name)}</dd>
    </dl>
    <p><a href="#rollouts${rollout.task_id ? `?task=${encodeURIComponent(rollout.task_id)}` : ""}">← rollouts of this task</a></p>
  </section>`);
}

// The server's cap on one id in `rollout_ids` (query_limits.MAX_ROLLOUT_ID_BYTES); a longer id is
// looked up over the whole store.
const MAX_ROLLOUT_ID_BYTES = 4096;

export async function renderRollout(root, api, rolloutId) {
  const { sql, query, schema } = api;
  // Everything about this rollout is read from the files that can hold it, not the store (`rollout_ids`).
  const narrow = rolloutId && new TextEncoder().encode(rolloutId).length <= MAX_ROLLOUT_ID_BYTES ? [rolloutId] : undefined;
  const [found, spans, calls, merges] = await Promise.all([
    query(sql.rollout(rolloutId), narrow), query(sql.rolloutSpans(rolloutId), narrow), query(sql.rolloutCalls(rolloutId), narrow),
    query(sql.rolloutMerges(rolloutId), narrow),
  ]);
  if (found.length === 0) {
    root.append(html(`<p class="empty">No rollout <code>${esc(rolloutId)}</code> in the store. <a href="#rollouts">All rollouts</a></p>`));
    return;
  }
  root.append(summary(found[0]));
  root.append(timeline(spans));
  const nav = html(`<nav class="subnav"><a href="#" data-to="messages">messages</a> · <a href="#" data-to="tokens">token view</a></nav>`);
  root.append(nav);
  const messages = html(`<div id="messages"></div>`);
  renderMessages(messages, calls, new Map(spans.map((s) => [s.span_id, s])), schema);
  root.append(messages);
  const tokens = html(`<div id="tokens" data-testid="token-view"></div>`);
  await renderTokenView(tokens, calls, merges, api);
  root.append(tokens);
  nav.addEventListener("click", (event) => {
    const to = event.target.dataset?.to;
    if (!to) return;
    event.preventDefault();
    document.getElementById(to)?.scrollIntoView({ behavior: "smooth" });
  });
}
