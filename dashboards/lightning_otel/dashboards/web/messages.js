// Each LLM call's messages, from OpenInference's flattened span attributes:
// llm.input_messages.<i>.message.role / .content (and .tool_calls..., .name, ...), likewise
// llm.output_messages.<i>. Spans from the gateway carry the raw request and response in
// input.value / output.value instead; their messages are read from that JSON.

import { esc, fmt, html, section } from "./charts.js";

// OpenInference's names (not ours: the span schema module has only the ones we write).
const MESSAGE_KEY = /^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$/;

function flattenedMessages(attributes) {
  const found = { input: new Map(), output: new Map() };
  for (const [key, value] of Object.entries(attributes || {})) {
    const match = key.match(MESSAGE_KEY);
    if (!match) continue;
    const [, direction, index, field] = match;
    const messages = found[direction];
    if (!messages.has(Number(index))) messages.set(Number(index), {});
    messages.get(Number(index))[field] = value;
  }
  const sorted = (m) => [...m.entries()].sort((a, b) => a[0] - b[0]).map(([, v]) => v);
  return { input: sorted(found.input), output: sorted(found.output) };
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

/** The request/response JSON of a span without flattened messages (the gateway's). */
function rawMessages(attributes, schema) {
  const request = parseJson(attributes?.[schema.INPUT_VALUE] ?? "");
  const response = parseJson(attributes?.[schema.OUTPUT_VALUE] ?? "");
  const input = Array.isArray(request?.messages) ? request.messages.map((m) => ({ "role": m.role, "content": typeof m.content === "string" ? m.content : JSON.stringify(m.content) }))
    : typeof request?.prompt === "string" ? [{ "role": "prompt", "content": request.prompt }] : [];
  const choice = response?.choices?.[0];
  const output = choice?.message ? [{ "role": choice.message.role, "content": choice.message.content ?? "" }]
    : typeof choice?.text === "string" ? [{ "role": "completion", "content": choice.text }] : [];
  return { input, output };
}

export function messagesOf(attributes, schema) {
  const flat = flattenedMessages(attributes);
  return flat.input.length || flat.output.length ? flat : rawMessages(attributes, schema);
}

function messageBlock(message, direction) {
  const { role = "?", content = "", ...rest } = message;
  const extra = Object.entries(rest).map(([k, v]) => `<div class="msg-extra"><code>${esc(k)}</code> ${esc(v)}</div>`).join("");
  return `<div class="msg ${direction}" data-role="${esc(role)}"><span class="role role-${esc(role)}">${esc(role)}</span>` +
    `<pre class="content">${esc(content)}</pre>${extra}</div>`;
}

export function renderMessages(container, calls, spansById, schema) {
  const box = section("LLM calls and their messages", "OpenInference message attributes of each call, in start order");
  if (calls.length === 0) box.append(html(`<p class="empty">no LLM call in this rollout</p>`));
  calls.forEach((call, i) => {
    const span = spansById.get(call.span_id);
    const { input, output } = messagesOf(span ? span.attributes : {}, schema);
    const head = `call ${i + 1} · ${esc(call.name)} · model ${esc(call.model_name ?? "?")} · policy version ${esc(call.policy_version ?? "?")} · ` +
      `${esc(fmt(call.duration_ms))} ms · finish ${esc(call.finish_reason ?? "?")} · ` +
      `${(call.prompt_token_ids || []).length} prompt + ${(call.completion_token_ids || []).length} completion tokens`;
    const body = input.length || output.length
      ? input.map((m) => messageBlock(m, "input")).join("") + output.map((m) => messageBlock(m, "output")).join("")
      : `<p class="empty">no messages recorded on this span</p>`;
    box.append(html(`<details class="call" id="call-${esc(call.span_id)}" data-span-id="${esc(call.span_id)}" data-testid="llm-call" ${i < 4 ? "open" : ""}>
      <summary>${head}</summary><div class="messages">${body}</div></details>`));
  });
  container.append(box);
}
