// Training: what each optimizer step did (train_steps), reward per policy version (reward_by_version:
// training rollouts and the held-out evaluation side by side),
// how rollouts became samples, why merges failed (merge_diagnostics), and what the trainer left out
// of the loss (input_diagnostics).

import { barChart, esc, fmt, html, lineChart, pct, section, table } from "./charts.js";

// The per-step metrics drawn as small charts, in train_steps' column names.
const STEP_METRICS = [
  ["mean_reward", "mean reward"], ["loss", "loss"], ["clip_fraction", "clip fraction"], ["entropy", "entropy"],
  ["kl", "KL"], ["grad_norm", "grad norm"], ["swap_seconds", "swap seconds"], ["merge_rate", "merge rate"],
  ["masked_tokens", "masked tokens"],
];

export async function renderTraining(root, { sql, query }) {
  const [steps, byVersion, evaluated, histogram, [merges], causes, failed, leftOut] = await Promise.all([
    query(sql.trainSteps), query(sql.rewardByVersion), query(sql.evalByVersion), query(sql.samplesPerRollout),
    query(sql.mergeSummary), query(sql.mergeCauses), query(sql.failedMerges), query(sql.inputCauses),
  ]);
  const mergeRate = merges.boundaries ? merges.merged / merges.boundaries : null;
  const maskedTokens = leftOut.reduce((sum, c) => sum + c.tokens, 0);
  const excludedRollouts = leftOut.reduce((sum, c) => sum + c.rollouts, 0);
  root.append(html(`<div class="kpis">
    <div class="kpi"><div class="kpi-value" data-testid="train-step-count" data-value="${steps.length}">${fmt(steps.length)}</div><div class="kpi-label">train steps</div></div>
    <div class="kpi"><div class="kpi-value">${esc(steps.length ? steps[steps.length - 1].version : "—")}</div><div class="kpi-label">latest policy version</div></div>
    <div class="kpi"><div class="kpi-value" data-testid="merge-rate" data-value="${esc(mergeRate ?? "")}">${pct(mergeRate)}</div>
      <div class="kpi-label">merge rate</div><div class="kpi-note">${fmt(merges.merged)} of ${fmt(merges.boundaries)} boundaries</div></div>
    <div class="kpi"><div class="kpi-value" data-testid="masked-tokens" data-value="${maskedTokens}">${fmt(maskedTokens)}</div>
      <div class="kpi-label">tokens masked out of the loss</div>
      <div class="kpi-note" data-testid="excluded-rollouts" data-value="${excludedRollouts}">${fmt(excludedRollouts)} rollouts excluded</div></div>
  </div>`));
  if (steps.length === 0) {
    root.append(html(`<p class="empty">No <code>train_step</code> spans yet: <code>lightning-otel train</code> writes one per optimizer step.</p>`));
  }

  const reward = section("Mean reward per train step", "<code>train_steps.mean_reward</code>: the rollouts each step trained on");
  reward.append(lineChart([{
    name: "mean reward",
    points: steps.map((s) => ({ x: s.step, y: s.mean_reward, title: `step ${s.step}: ${fmt(s.mean_reward)}`,
      attrs: { "data-step": s.step, "data-value": s.mean_reward ?? "" } })),
  }], { width: 1100, height: 230, xLabel: "step", yLabel: "mean reward", integerX: true, testid: "reward-per-step" }));
  root.append(reward);

  root.append(evalSection(byVersion, evaluated));

  const small = html(`<div class="small-multiples"></div>`);
  for (const [column, label] of STEP_METRICS.slice(1)) {
    const box = section(label);
    box.append(lineChart([{ name: label, points: steps.map((s) => ({ x: s.step, y: s[column], title: `step ${s.step}: ${fmt(s[column])}` })) }],
      { width: 360, height: 170, xLabel: "step", integerX: true, testid: `metric-${column}` }));
    small.append(box);
  }
  root.append(small);

  const grid = html(`<div class="two-col"></div>`);
  const versions = section("Mean reward per policy version",
    "training <code>rollouts</code> served by one policy version (<code>reward_by_version</code>, split train)");
  versions.append(barChart(byVersion.map((v) => ({
    label: v.version, value: v.mean_reward, title: `version ${v.version}: ${fmt(v.mean_reward)} over ${v.rollouts} rollouts`,
    attrs: { "data-version": v.version, "data-value": v.mean_reward ?? "" },
  })), { width: 540, height: 200, xLabel: "policy version", yLabel: "mean reward", testid: "reward-per-version" }));
  grid.append(versions);

  const spr = section("Samples per rollout", "<code>train_steps.samples_per_rollout</code> summed over steps: 1 = every call merged");
  spr.append(barChart(histogram.map((h) => ({
    label: String(h.samples), value: h.rollouts, title: `${h.rollouts} rollouts became ${h.samples} sample(s)`,
    attrs: { "data-samples": h.samples, "data-value": h.rollouts },
  })), { width: 540, height: 200, xLabel: "samples", yLabel: "rollouts", testid: "samples-per-rollout" }));
  grid.append(spr);
  root.append(grid);

  const grid2 = html(`<div class="two-col"></div>`);
  const why = section("Why merges failed", "<code>merge_diagnostics</code> boundaries that did not merge, by cause and region");
  why.append(causes.length ? table(causes, [["cause", "cause", esc], ["region", "region", esc], ["boundaries", "boundaries"]],
    { rowAttrs: (r) => ({ "data-cause": r.cause }), className: "causes" }) : html(`<p class="empty">no failed merge</p>`));
  grid2.append(why);
  const recent = section("Latest failed merges", "open one to see where its tokens diverge");
  recent.append(failed.length ? table(failed, [
    ["rollout_id", "rollout", (v) => `<a href="#rollout/${encodeURIComponent(v)}">${esc(v)}</a>`],
    ["cause", "cause", esc], ["position", "token"], ["detail", "detail", esc],
  ]) : html(`<p class="empty">none</p>`));
  grid2.append(recent);
  root.append(grid2);

  const inputs = section("Left out of training", "<code>input_diagnostics</code> by cause: calls with tokens masked (bad behaviour logprobs), rollouts excluded for good");
  inputs.append(leftOut.length ? table(leftOut, [["cause", "cause", esc], ["records", "rows"], ["tokens", "masked tokens"],
    ["rollouts", "rollouts excluded"]], { rowAttrs: (r) => ({ "data-cause": r.cause }), className: "left-out" })
    : html(`<p class="empty">nothing left out</p>`));
  root.append(inputs);

  const all = section("Train steps", "one row per <code>train_steps</code> row");
  all.append(table(steps, [
    ["step", "step"], ["version", "version", esc], ["time", "time", esc], ["rollouts", "rollouts"], ["samples", "samples"],
    ...STEP_METRICS.map(([column, label]) => [column, label, column === "merge_rate" ? pct : undefined]),
  ], { rowAttrs: (s) => ({ "data-step": s.step, "data-mean-reward": s.mean_reward ?? "" }), className: "train-steps" }));
  root.append(all);
}

// Train and held-out eval mean reward per policy version on one axis (versions in serving order), and
// the eval rows with their 95% intervals: the curve that says whether training generalises.
function evalSection(byVersion, evaluated) {
  const box = section("Held-out evaluation per policy version",
    "<code>reward_by_version</code>: rollouts marked <code>split = 'eval'</code> (never trained on) beside training rollouts; 95% intervals");
  if (evaluated.length === 0) {
    box.append(html(`<p class="empty" data-testid="eval-empty">No evaluation rollouts yet: run the harness on held-out tasks with <code>rollout(task_id=..., split="eval")</code>.</p>`));
    return box;
  }
  const order = [...new Set([...byVersion.map((v) => v.version), ...evaluated.map((v) => v.version)])];
  const at = (version) => order.indexOf(version);
  box.append(lineChart([
    { name: "training rollouts", points: byVersion.map((v) => ({ x: at(v.version), y: v.mean_reward,
      title: `version ${v.version}, training: ${fmt(v.mean_reward)} over ${v.rollouts} rollouts` })) },
    { name: "held-out eval", points: evaluated.map((v) => ({ x: at(v.version), y: v.mean_reward,
      title: `version ${v.version}, eval: ${fmt(v.mean_reward)} [${fmt(v.reward_low)}, ${fmt(v.reward_high)}] over ${v.tasks} tasks`,
      attrs: { "data-version": v.version, "data-value": v.mean_reward ?? "" } })) },
  ], { width: 1100, height: 230, xLabel: `policy version (${order.join(", ")})`, yLabel: "mean reward", integerX: true, testid: "eval-per-version" }));
  box.append(table(evaluated, [
    ["version", "version", esc], ["tasks", "tasks"], ["rollouts", "rollouts"],
    ["mean_reward", "mean reward", (v, r) => `${fmt(v)} [${fmt(r.reward_low)}, ${fmt(r.reward_high)}]`],
    ["solved", "solved", (v, r) => `${pct(v)} [${pct(r.solved_low)}, ${pct(r.solved_high)}]`],
  ], { rowAttrs: (r) => ({ "data-version": r.version, "data-solved": r.solved ?? "" }), className: "eval-versions" }));
  return box;
}
