// The token view of one rollout: its training samples as the trainer builds them.
//
// The trainer's rule (trainer/lightning_otel/trainer/merge.py): walking the calls in order, the next call joins the
// current sample exactly when its prompt ids start with the previous call's prompt + completion
// ids. A sample is then the last call's prompt + completion; each call's completion is trained on
// (loss mask 1), everything else is masked. Where a merge fails, the next call starts a new sample,
// and merge_diagnostics (the trainer's own verdict) says at which token and why.

import { esc, html, section } from "./charts.js";

/** Index of the first token where `nextPrompt` differs from prev's prompt + completion, or null. */
export function firstDivergence(prev, nextPrompt) {
  const seen = prev.prompt_token_ids.concat(prev.completion_token_ids);
  const shared = Math.min(seen.length, nextPrompt.length);
  for (let i = 0; i < shared; i++) if (seen[i] !== nextPrompt[i]) return i;
  return nextPrompt.length >= seen.length ? null : shared;
}

/** Samples of a rollout's calls (start order), each with per-token kinds and the break before it. */
export function buildSamples(calls, diagnostics) {
  const verdicts = new Map(diagnostics.map((d) => [`${d.prev_span_id}>${d.next_span_id}`, d]));
  const runs = [];
  calls.forEach((call, index) => {
    call.index = index + 1;
    const current = runs[runs.length - 1];
    if (!current) return runs.push({ calls: [call], broke: null });
    const prev = current.calls[current.calls.length - 1];
    const ruled = firstDivergence(prev, call.prompt_token_ids);
    if (ruled === null) return current.calls.push(call);
    const verdict = verdicts.get(`${prev.span_id}>${call.span_id}`);
    const position = verdict && verdict.position !== null && verdict.position !== undefined ? Number(verdict.position) : ruled;
    const seen = prev.prompt_token_ids.concat(prev.completion_token_ids);
    runs.push({ calls: [call], broke: {
      position, expected: seen[position], prevIndex: prev.index,
      cause: verdict ? verdict.cause : null, region: verdict ? verdict.region : null, detail: verdict ? verdict.detail : null,
      fromTrainer: Boolean(verdict),
    } });
  });
  return runs.map((run) => {
    const first = run.calls[0];
    const last = run.calls[run.calls.length - 1];
    const ids = last.prompt_token_ids.concat(last.completion_token_ids);
    const kinds = ids.map((_, i) => (i < first.prompt_token_ids.length ? "prompt" : "interleaved"));
    const logprobs = ids.map(() => null);
    const callAt = new Map(); // token index where a merged call's new context starts -> call number
    run.calls.forEach((call, k) => {
      const start = call.prompt_token_ids.length;
      call.completion_token_ids.forEach((_, j) => {
        kinds[start + j] = "gen";
        logprobs[start + j] = call.completion_logprobs ? call.completion_logprobs[j] : null;
      });
      if (k > 0) {
        const prev = run.calls[k - 1];
        callAt.set(prev.prompt_token_ids.length + prev.completion_token_ids.length, call.index);
      }
    });
    return { calls: run.calls, broke: run.broke, ids, kinds, logprobs, callAt };
  });
}

const LEGEND = `<div class="legend tokens-legend" data-testid="token-legend">
  <span class="tok gen">generated</span><span>the model's completion tokens: trained on (loss mask 1)</span>
  <span class="tok prompt">prompt</span><span>the sample's first prompt: masked (not trained on)</span>
  <span class="tok interleaved">interleaved</span><span>between merged calls (tool output, the next turn, template tokens): masked</span>
  <span class="tok divergent">divergent</span><span>first token where this prompt stops extending the previous call's prompt + completion: the merge failed there</span>
</div>`;

/** Text of a token for display: whitespace made visible, so every token has a width. */
function shown(piece) {
  if (piece === "") return "∅";
  return piece.replace(/\t/g, "→").replace(/\r/g, "␍").replace(/\n/g, "↵\n").replace(/^ +$/, (s) => "·".repeat(s.length));
}

function tokenSpan(id, piece, kind, index, call, logprob, divergent) {
  const title = [`index ${index}`, `id ${id}`, `call ${call}`, kind === "gen" ? "generated" : "masked",
    logprob !== null && logprob !== undefined ? `logprob ${Number(logprob).toFixed(3)}` : ""].filter(Boolean).join(" · ");
  const classes = `tok ${kind}${divergent ? " divergent" : ""}${piece === null ? " id" : ""}`;
  return `<span class="${classes}" data-i="${index}" data-id="${id}" title="${esc(title)}">${esc(piece === null ? String(id) : shown(piece))}</span>`;
}

function breakNote(broke, pieceOf) {
  const token = (id) => (id === undefined ? "(end)" : pieceOf(id) === null ? `id ${id}` : `“${shown(pieceOf(id))}” (id ${id})`);
  const why = broke.cause ? `<strong>${esc(broke.cause)}</strong>${broke.region ? ` in ${esc(broke.region)}` : ""}${broke.detail ? `: ${esc(broke.detail)}` : ""}`
    : "no trainer diagnostic for this boundary (the dashboard applied the merge rule itself)";
  return `<div class="merge-break" data-testid="merge-break" data-position="${broke.position}" data-cause="${esc(broke.cause ?? "")}">
    Merge with call ${broke.prevIndex} failed at token <strong>${broke.position}</strong> of this prompt: ${why}.
    The previous prompt + completion has ${esc(token(broke.expected))} there.</div>`;
}

export async function renderTokenView(container, calls, diagnostics, { hasTokenizer, detokenize }) {
  const box = section("Training samples (token view)",
    "how the trainer turns this rollout's LLM calls into samples; hover a token for its id, index and logprob");
  const usable = calls.filter((c) => Array.isArray(c.prompt_token_ids) && Array.isArray(c.completion_token_ids));
  if (usable.length === 0) {
    box.append(html(`<p class="empty">no LLM call of this rollout carries token ids (not served by vLLM with token capture)</p>`));
    return container.append(box);
  }
  const samples = buildSamples(usable, diagnostics);
  const unique = [...new Set(samples.flatMap((s) => s.ids))];
  const pieces = new Map();
  if (hasTokenizer) (await detokenize(unique)).forEach((piece, i) => pieces.set(unique[i], piece));
  const pieceOf = (id) => (hasTokenizer ? pieces.get(id) ?? "" : null);
  box.append(html(LEGEND));
  if (!hasTokenizer) box.append(html(`<p class="note">token ids shown: start the dashboard with <code>--tokenizer MODEL_DIR</code> for text</p>`));
  if (usable.length < calls.length) box.append(html(`<p class="note">${calls.length - usable.length} call(s) without token ids are left out</p>`));
  samples.forEach((sample, k) => {
    const generated = sample.kinds.filter((kind) => kind === "gen").length;
    const versions = [...new Set(sample.calls.map((c) => c.policy_version ?? "?"))].join(", ");
    const callNumbers = sample.calls.map((c) => c.index);
    const parts = [];
    const promptEnd = sample.calls[0].prompt_token_ids.length;
    const divergeAt = sample.broke ? sample.broke.position : -1;
    // The next prompt ended before the previous sequence did: the marker sits where it ended.
    const endMarker = `<span class="tok divergent end" data-i="${divergeAt}" title="the prompt ends here">⌀ prompt ends</span>`;
    sample.ids.forEach((id, i) => {
      if (sample.callAt.has(i)) parts.push(`<span class="call-mark">call ${sample.callAt.get(i)}</span>`);
      if (i === promptEnd && divergeAt >= promptEnd) parts.push(endMarker);
      const owner = sample.calls.find((c) => i < c.prompt_token_ids.length + c.completion_token_ids.length) || sample.calls[sample.calls.length - 1];
      parts.push(tokenSpan(id, pieceOf(id), sample.kinds[i], i, owner.index, sample.logprobs[i], i === divergeAt && divergeAt < promptEnd));
    });
    if (promptEnd === sample.ids.length && divergeAt >= promptEnd) parts.push(endMarker);
    const block = html(`<div class="sample" data-testid="sample" data-sample="${k + 1}" data-first-span-id="${esc(sample.calls[0].span_id)}"
      data-generated="${generated}" data-tokens="${sample.ids.length}">
      <div class="sample-head">sample ${k + 1} · call${callNumbers.length > 1 ? "s" : ""} ${callNumbers.join(", ")} ·
        ${sample.ids.length} tokens · ${generated} generated · policy version ${esc(versions)}</div>
      ${sample.broke ? breakNote(sample.broke, pieceOf) : ""}
      <div class="tokens">${parts.join("")}</div></div>`);
    box.append(block);
  });
  container.append(box);
}
