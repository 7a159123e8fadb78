// Overview: volume over time, tokens, latency by model, errors, spans the agents dropped.

import { cellBar, esc, fmt, html, lineChart, pct, section, table } from "./charts.js";

function kpi(label, value, testid, note = "") {
  return `<div class="kpi"><div class="kpi-value" data-testid="${esc(testid)}" data-value="${esc(value ?? "")}">${esc(fmt(value))}</div>` +
    `<div class="kpi-label">${esc(label)}</div>${note ? `<div class="kpi-note">${esc(note)}</div>` : ""}</div>`;
}

export async function renderOverview(root, { sql, query, schema }) {
  const [[totals], activity, latency, errors, dropped] = await Promise.all([
    query(sql.totals), query(sql.activity), query(sql.latency), query(sql.errors), query(sql.dropped),
  ]);
  const droppedTotal = dropped.reduce((sum, row) => sum + (Number(row.dropped) || 0), 0);
  const spanErrorRate = totals.spans ? totals.span_errors / totals.spans : null;
  const llmErrorRate = totals.llm_calls ? totals.llm_errors / totals.llm_calls : null;
  root.append(html(`<div class="kpis">
    ${kpi("spans", totals.spans, "kpi-spans")}
    ${kpi("LLM calls", totals.llm_calls, "kpi-llm-calls")}
    ${kpi("rollouts", totals.rollouts, "kpi-rollouts")}
    ${kpi("prompt tokens", totals.prompt_tokens, "kpi-prompt-tokens")}
    ${kpi("completion tokens", totals.completion_tokens, "kpi-completion-tokens")}
    <div class="kpi"><div class="kpi-value" data-testid="kpi-error-rate" data-value="${esc(spanErrorRate ?? "")}">${pct(spanErrorRate)}</div>
      <div class="kpi-label">spans with ERROR status</div><div class="kpi-note">LLM calls: ${pct(llmErrorRate)}</div></div>
    ${kpi("dropped spans", droppedTotal, "kpi-dropped-spans", `${dropped.length} agent process${dropped.length === 1 ? "" : "es"} reporting`)}
  </div>`));

  const width = activity.length ? Number(activity[0].width) : 1;
  const over = section("Spans and LLM calls over time", `per ${esc(fmt(width, 3))} s bucket (span start time)`);
  const filled = fillBuckets(activity, width);
  over.append(lineChart([
    { name: "spans", points: filled.map((b) => ({ x: b.bucket, y: b.spans, title: `spans: ${b.spans}`, attrs: { "data-series": "spans", "data-value": b.spans } })) },
    { name: "LLM calls", points: filled.map((b) => ({ x: b.bucket, y: b.llm_calls, title: `LLM calls: ${b.llm_calls}`, attrs: { "data-series": "llm_calls", "data-value": b.llm_calls } })) },
  ], { width: 1100, height: 240, xTime: true, zeroY: true, yLabel: "per bucket", testid: "activity-chart" }));
  root.append(over);

  const grid = html(`<div class="two-col"></div>`);
  const lat = section("LLM latency by model", "<code>llm_calls.duration_ms</code>, p50 and p95");
  const maxP95 = Math.max(0, ...latency.map((r) => Number(r.p95) || 0));
  lat.append(table(latency, [
    ["model", "model", esc], ["calls", "calls"], ["errors", "errors"],
    ["p50", "p50 ms", (v) => `${esc(fmt(v))} ${cellBar(v, maxP95, "p50")}`],
    ["p95", "p95 ms", (v) => `${esc(fmt(v))} ${cellBar(v, maxP95, "p95")}`],
  ], { rowAttrs: (r) => ({ "data-model": r.model }), className: "latency" }));
  grid.append(lat);

  const err = section("Errors by service and span kind", "spans whose status is ERROR");
  err.append(table(errors, [
    ["service_name", "service", esc], ["span_kind", "span kind", esc], ["spans", "spans"], ["errors", "errors"],
    ["rate", "error rate", (_, r) => pct(r.spans ? r.errors / r.spans : null)],
  ]));
  grid.append(err);
  root.append(grid);

  const drop = section("Dropped spans by agent process",
    `latest <code>${esc(schema.SDK_DROPPED_SPANS)}</code> on each process's rollout spans (export queue full)`);
  drop.append(dropped.length ? table(dropped, [
    ["instance", schema.SERVICE_INSTANCE_ID, esc], ["service", "service", esc], ["rollouts", "rollouts"], ["dropped", "dropped spans"],
  ]) : html(`<p class="empty">no agent process has reported the counter yet</p>`));
  root.append(drop);
}

/** Buckets with no span are missing from the SQL result; they are zeros on the chart. */
function fillBuckets(rows, width) {
  if (rows.length === 0) return [];
  const byIndex = new Map();
  const first = Number(rows[0].bucket);
  for (const row of rows) byIndex.set(Math.round((Number(row.bucket) - first) / width), row);
  const last = Math.max(...byIndex.keys());
  const out = [];
  for (let i = 0; i <= last; i++) {
    const row = byIndex.get(i);
    out.push({ bucket: first + i * width, spans: row ? Number(row.spans) : 0, llm_calls: row ? Number(row.llm_calls) : 0 });
  }
  return out;
}
