// The dashboard page: a SQL client of the server's POST /v1/query, with hash routes
// (#overview, #training, #rollouts?task=..., #rollout/<id>). Every SQL statement the page runs is
// in makeSql() below; the views it reads are documented in docs/sql.md. Attribute names come from
// the server (/v1/config, the span schema module), so no lightning.* name is spelled here.

import { renderOverview } from "./overview.js";
import { renderTraining } from "./training.js";
import { renderRollouts } from "./rollouts.js";
import { renderRollout } from "./rollout.js";

const lit = (text) => "'" + String(text).replace(/'/g, "''") + "'";
const num = (value) => (Number.isFinite(Number(value)) ? String(Number(value)) : "NULL");
const TIME = "'%Y-%m-%d %H:%M:%S'";
// Versions are strings; the trainer's are integers, sorted numerically after any name (the base model's "default").
const BY_VERSION = "TRY_CAST(version AS BIGINT) NULLS FIRST, version";

function makeSql(S) {
  const llm = lit(S.KIND_LLM);
  const rolloutWhere = (f) => {
    const terms = ["TRUE"];
    if (f.task) terms.push(`task_id = ${lit(f.task)}`);
    if (f.min !== undefined && f.min !== "") terms.push(`reward >= ${num(f.min)}`);
    if (f.max !== undefined && f.max !== "") terms.push(`reward <= ${num(f.max)}`);
    if (f.version) terms.push(`list_contains(policy_versions, ${lit(f.version)})`);
    if (f.failed) terms.push("failed");
    return terms.join(" AND ");
  };
  return {
    // --- overview ---------------------------------------------------------------------
    totals: `
      SELECT (SELECT count(*) FROM spans) AS spans,
             (SELECT count(*) FROM spans WHERE status_code = 'ERROR') AS span_errors,
             (SELECT count(*) FROM rollouts) AS rollouts,
             count(*) AS llm_calls,
             count(*) FILTER (WHERE status_code = 'ERROR') AS llm_errors,
             coalesce(sum(coalesce(token_count_prompt, len(prompt_token_ids))), 0) AS prompt_tokens,
             coalesce(sum(coalesce(token_count_completion, len(completion_token_ids))), 0) AS completion_tokens
      FROM llm_calls`,
    // About 48 equal buckets over the store's time range (at least one second each).
    activity: `
      WITH events AS (
             SELECT 'spans' AS series, epoch(start_time) AS t FROM spans
             UNION ALL SELECT 'llm_calls', epoch(start_time) FROM llm_calls),
           bounds AS (SELECT min(t) AS lo, greatest((max(t) - min(t)) / 48, 1) AS width FROM events)
      SELECT lo + floor((t - lo) / width) * width AS bucket, any_value(width) AS width,
             count(*) FILTER (WHERE series = 'spans') AS spans,
             count(*) FILTER (WHERE series = 'llm_calls') AS llm_calls
      FROM events, bounds GROUP BY bucket ORDER BY bucket`,
    latency: `
      SELECT coalesce(model_name, '(none)') AS model, count(*) AS calls,
             quantile_cont(duration_ms, 0.5) AS p50, quantile_cont(duration_ms, 0.95) AS p95,
             count(*) FILTER (WHERE status_code = 'ERROR') AS errors
      FROM llm_calls GROUP BY 1 ORDER BY calls DESC`,
    errors: `
      SELECT service_name, coalesce(span_kind, '') AS span_kind, count(*) AS spans,
             count(*) FILTER (WHERE status_code = 'ERROR') AS errors
      FROM spans GROUP BY ALL ORDER BY errors DESC, spans DESC`,
    // The counter is cumulative per agent process: its latest value, per process, summed by the page.
    dropped: `
      SELECT resource_attributes[${lit(S.SERVICE_INSTANCE_ID)}] AS instance, any_value(service_name) AS service,
             arg_max(TRY_CAST(attributes[${lit(S.SDK_DROPPED_SPANS)}] AS BIGINT), end_time) AS dropped,
             count(*) AS rollouts
      FROM spans WHERE is_rollout_root AND attributes[${lit(S.SDK_DROPPED_SPANS)}] IS NOT NULL
      GROUP BY 1 ORDER BY dropped DESC, instance`,
    // --- training -----------------------------------------------------------------------
    trainSteps: `
      SELECT step, version, rollouts, samples, mean_reward, loss, clip_fraction, entropy, kl, grad_norm,
             swap_seconds, merge_rate, masked_tokens, strftime(time, ${TIME}) AS time
      FROM train_steps ORDER BY step, time`,
    rewardByVersion: `
      SELECT version, rollouts, mean_reward FROM reward_by_version WHERE split = 'train' ORDER BY ${BY_VERSION}`,
    // The held-out evaluation (rollouts marked split 'eval', never trained on), with 95% intervals.
    evalByVersion: `
      SELECT version, tasks, rollouts, mean_reward, reward_low, reward_high, solved, solved_low, solved_high
      FROM reward_by_version WHERE split = 'eval' ORDER BY ${BY_VERSION}`,
    // Element k of each step's histogram counts rollouts that became k + 1 samples: summed over steps.
    samplesPerRollout: `
      SELECT samples, sum(rollouts)::BIGINT AS rollouts FROM (
        SELECT unnest(range(1, len(samples_per_rollout) + 1)) AS samples,
               unnest(samples_per_rollout) AS rollouts FROM train_steps)
      GROUP BY samples ORDER BY samples`,
    mergeSummary: `SELECT count(*) AS boundaries, count(*) FILTER (WHERE merged) AS merged FROM merge_diagnostics`,
    mergeCauses: `
      SELECT coalesce(cause, 'unknown') AS cause, coalesce(region, '') AS region, count(*) AS boundaries
      FROM merge_diagnostics WHERE NOT merged GROUP BY ALL ORDER BY boundaries DESC, cause`,
    // What the trainer left out: tokens masked (bad behaviour logprobs), rollouts excluded for good.
    inputCauses: `
      SELECT cause, count(*) AS records, coalesce(sum(tokens), 0)::BIGINT AS tokens,
             count(*) FILTER (WHERE excluded) AS rollouts
      FROM input_diagnostics GROUP BY cause ORDER BY records DESC, cause`,
    failedMerges: `
      SELECT rollout_id, position, cause, region, detail, strftime(time, ${TIME}) AS time
      FROM merge_diagnostics WHERE NOT merged ORDER BY time DESC, rollout_id LIMIT 20`,
    // --- rollout explorer ---------------------------------------------------------------
    tasks: "SELECT task_id, count(*) AS rollouts FROM rollouts GROUP BY 1 ORDER BY 1",
    versions: `SELECT DISTINCT unnest(policy_versions) AS version FROM rollouts ORDER BY ${BY_VERSION}`,
    rolloutCount: (f) => `
      SELECT count(*) AS rollouts, avg(reward) AS mean_reward FROM rollouts WHERE ${rolloutWhere(f)}`,
    rolloutPage: (f, limit, offset) => `
      SELECT rollout_id, task_id, attempt, strftime(start_time, ${TIME}) AS start, duration_ms,
             llm_calls, tool_calls, reward, policy_versions, failed
      FROM rollouts WHERE ${rolloutWhere(f)}
      ORDER BY start_time DESC, rollout_id LIMIT ${num(limit)} OFFSET ${num(offset)}`,
    // --- one rollout --------------------------------------------------------------------
    rollout: (id) => `
      SELECT rollout_id, task_id, attempt, service_name, strftime(start_time, ${TIME}) AS start,
             duration_ms, llm_calls, tool_calls, reward, rewards, policy_versions, failed
      FROM rollouts WHERE rollout_id = ${lit(id)}`,
    rolloutSpans: (id) => `
      SELECT span_id, parent_span_id, name, span_kind, status_code, status_message, service_name,
             epoch_us(start_time) AS start_us, epoch_us(end_time) AS end_us, duration_ms,
             model_name, tool_name, reward_name, reward_value, attributes,
             span_kind = ${llm} AND completion_token_ids IS NOT NULL AS has_tokens
      FROM spans WHERE rollout_id = ${lit(id)} ORDER BY start_time, end_time`,
    rolloutCalls: (id) => `
      SELECT span_id, name, model_name, policy_version, finish_reason, duration_ms,
             prompt_token_ids, completion_token_ids, completion_logprobs
      FROM llm_calls WHERE rollout_id = ${lit(id)} ORDER BY start_time, end_time, span_id`,
    // The trainer may have diagnosed a rollout more than once: its latest verdict per boundary.
    rolloutMerges: (id) => `
      SELECT prev_span_id, next_span_id, merged, position, cause, region, detail, chain
      FROM merge_diagnostics WHERE rollout_id = ${lit(id)}
      QUALIFY row_number() OVER (PARTITION BY prev_span_id, next_span_id ORDER BY time DESC) = 1`,
  };
}

// --- the query client ------------------------------------------------------------------------
const TOKEN_KEY = "lightning-otel-query-token";
const statusLine = document.getElementById("status");
let pending = 0;

class NeedsToken extends Error {}

// The server runs at most `max_concurrent_queries` statements at once and answers 429 beyond that
// (query_limits.py): the page queues its own queries to that many, and waits out a 429 caused by
// other clients sharing the slots (Retry-After), a bounded number of times.
let slots = 2;
const waiting = [];
const MAX_BUSY_RETRIES = 20;

async function takeSlot() {
  if (slots > 0) {
    slots -= 1;
    return;
  }
  await new Promise((resolve) => waiting.push(resolve));
}

function giveSlot() {
  const next = waiting.shift();
  if (next) next();
  else slots += 1;
}

async function fetchWhenFree(path, init) {
  await takeSlot();
  try {
    for (let attempt = 0; ; attempt += 1) {
      const reply = await fetch(path, init);
      if (reply.status !== 429 || attempt === MAX_BUSY_RETRIES) return reply;
      const seconds = Number(reply.headers.get("Retry-After")) || 1;
      await new Promise((resolve) => setTimeout(resolve, seconds * 1000 * (0.5 + Math.random())));
    }
  } finally {
    giveSlot();
  }
}

async function post(path, body) {
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  pending += 1;
  statusLine.textContent = "loading…";
  try {
    const reply = await fetchWhenFree(path, { method: "POST", headers, body: JSON.stringify(body) });
    if (reply.status === 401) {
      askForToken();
      throw new NeedsToken("this dashboard needs its query token");
    }
    const payload = await reply.json();
    if (!reply.ok) throw new Error(payload.error || `${path}: HTTP ${reply.status}`);
    return payload;
  } finally {
    pending -= 1;
    if (pending === 0) statusLine.textContent = "";
  }
}

/** Rows as objects keyed by column name. `rolloutIds` (optional): the server runs `sql` over the views
 * narrowed to those rollouts (POST /v1/query's `rollout_ids`), which reads their files, not the store. */
async function query(sql, rolloutIds) {
  const { columns, rows } = await post("v1/query", rolloutIds ? { sql, rollout_ids: rolloutIds } : { sql });
  return rows.map((row) => Object.fromEntries(columns.map((name, i) => [name, row[i]])));
}

function askForToken() {
  const form = document.getElementById("token-form");
  form.hidden = false;
  form.onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, form.elements.token.value);
    form.hidden = true;
    route();
  };
}

// --- routing ---------------------------------------------------------------------------------
const view = document.getElementById("view");
let api = null;
let renderCount = 0;

function parseHash() {
  // Decoded piece by piece: a task id like "1+2" arrives as task=1%2B2, and "+" means space in a query.
  const hash = location.hash.slice(1) || "overview";
  if (hash.startsWith("rollout/")) return { name: "rollout", id: decodeURIComponent(hash.slice("rollout/".length)), params: {} };
  const [name, search] = hash.split("?");
  return { name, params: Object.fromEntries(new URLSearchParams(search || "")) };
}

async function route() {
  const hash = location.hash;
  const { name, id, params } = parseHash();
  const renders = { overview: renderOverview, training: renderTraining, rollouts: renderRollouts };
  const render = name === "rollout" ? (root, a) => renderRollout(root, a, id) : renders[name] || renderOverview;
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.route === (name === "rollout" ? "rollouts" : name));
  }
  // A slow render of a page the user already left must not overwrite the current one.
  const mine = ++renderCount;
  const root = document.createElement("div");
  root.className = `page page-${name}`;
  view.dataset.ready = "false";
  try {
    await render(root, { ...api, params });
  } catch (error) {
    if (mine !== renderCount) return;
    root.replaceChildren();
    const box = document.createElement("p");
    box.className = "error";
    box.textContent = error instanceof NeedsToken ? error.message : `error: ${error.message}`;
    root.append(box);
  }
  if (mine !== renderCount) return;
  view.replaceChildren(root);
  view.dataset.ready = "true";
  view.dataset.route = name;
  view.dataset.hash = hash; // which address this content is for (tests and scripts wait on it)
}

async function start() {
  const url = new URL(location.href);
  if (url.searchParams.has("token")) {
    // Taken once from the address, then kept for this tab only and removed from the address bar.
    sessionStorage.setItem(TOKEN_KEY, url.searchParams.get("token"));
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  const config = await (await fetch("v1/config")).json();
  slots = Math.max(1, config.max_concurrent_queries || 1);
  api = {
    sql: makeSql(config.schema),
    schema: config.schema,
    query,
    hasTokenizer: config.tokenizer,
    detokenize: async (ids) => (await post("v1/detokenize", { ids })).tokens,
  };
  window.addEventListener("hashchange", route);
  await route();
}

start();
