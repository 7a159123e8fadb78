// Rollout explorer: filter rollouts by task, reward range, policy version; open one.
// The filters live in the address (#rollouts?task=...&min=...), so back/forward and links work.

import { esc, fmt, html, section, table } from "./charts.js";

const PAGE_SIZE = 100;
const FILTER_KEYS = ["task", "min", "max", "version", "failed"];

function filterHash(filters, page = 0) {
  const params = new URLSearchParams();
  for (const key of FILTER_KEYS) if (filters[key]) params.set(key, filters[key]);
  if (page) params.set("page", String(page));
  const search = params.toString();
  return `#rollouts${search ? `?${search}` : ""}`;
}

function filterForm(filters, tasks, versions) {
  const option = (value, label, selected) => `<option value="${esc(value)}"${selected ? " selected" : ""}>${esc(label)}</option>`;
  const form = html(`<form class="filters" data-testid="rollout-filters">
    <label>task <select name="task" data-testid="filter-task">${option("", "any task", !filters.task)}
      ${tasks.map((t) => option(t.task_id ?? "", `${t.task_id ?? "(none)"} (${t.rollouts})`, t.task_id === filters.task)).join("")}</select></label>
    <label>reward ≥ <input name="min" type="number" step="any" value="${esc(filters.min ?? "")}" data-testid="filter-min"></label>
    <label>reward ≤ <input name="max" type="number" step="any" value="${esc(filters.max ?? "")}" data-testid="filter-max"></label>
    <label>policy version <select name="version" data-testid="filter-version">${option("", "any version", !filters.version)}
      ${versions.map((v) => option(v.version, v.version, v.version === filters.version)).join("")}</select></label>
    <label class="check"><input name="failed" type="checkbox" value="1"${filters.failed ? " checked" : ""}> failed only</label>
    <button type="submit" data-testid="filter-apply">Apply</button>
    <a href="#rollouts" class="reset">reset</a>
  </form>`);
  const apply = () => {
    const data = new FormData(form);
    const next = Object.fromEntries(FILTER_KEYS.map((key) => [key, data.get(key) || ""]));
    location.hash = filterHash(next);
  };
  form.addEventListener("submit", (event) => { event.preventDefault(); apply(); });
  for (const select of form.querySelectorAll("select, input[type=checkbox]")) select.addEventListener("change", apply);
  return form;
}

export async function renderRollouts(root, { sql, query, params }) {
  const filters = Object.fromEntries(FILTER_KEYS.filter((k) => params[k]).map((k) => [k, params[k]]));
  const page = Math.max(0, parseInt(params.page || "0", 10) || 0);
  const [tasks, versions, [summary], rows] = await Promise.all([
    query(sql.tasks), query(sql.versions), query(sql.rolloutCount(filters)),
    query(sql.rolloutPage(filters, PAGE_SIZE, page * PAGE_SIZE)),
  ]);
  const box = section("Rollouts");
  box.append(filterForm(filters, tasks, versions));
  const total = Number(summary.rollouts);
  const first = total ? page * PAGE_SIZE + 1 : 0;
  const last = Math.min(total, (page + 1) * PAGE_SIZE);
  const pager = html(`<p class="summary"><strong data-testid="rollout-count" data-value="${total}">${fmt(total)}</strong> rollouts,
    mean reward <span data-testid="rollout-mean-reward">${esc(fmt(summary.mean_reward))}</span>;
    showing ${fmt(first)}–${fmt(last)}
    ${page > 0 ? `<a href="${filterHash(filters, page - 1)}" data-testid="page-prev">← newer</a>` : ""}
    ${last < total ? `<a href="${filterHash(filters, page + 1)}" data-testid="page-next">older →</a>` : ""}</p>`);
  box.append(pager);
  const link = (id) => `<a href="#rollout/${encodeURIComponent(id)}">${esc(id)}</a>`;
  box.append(table(rows, [
    ["rollout_id", "rollout", link], ["task_id", "task", esc], ["attempt", "attempt"], ["start", "start", esc],
    ["duration_ms", "duration ms"], ["llm_calls", "LLM calls"], ["tool_calls", "tool calls"],
    ["reward", "reward", (v) => `<span class="reward ${v === null ? "none" : v > 0 ? "pos" : "zero"}">${esc(fmt(v))}</span>`],
    ["policy_versions", "policy versions", (v) => esc((v || []).join(", "))],
    ["failed", "failed", (v) => (v ? `<span class="bad">failed</span>` : "")],
  ], { rowAttrs: (r) => ({ "class": "rollout-row", "data-rollout-id": r.rollout_id, "data-task": r.task_id ?? "", "data-reward": r.reward ?? "" }),
       className: "rollouts" }));
  root.append(box);
}
