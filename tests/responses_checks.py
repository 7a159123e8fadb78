"""What the Responses and Messages API tests (instrument and gateway) check on a captured call: its
prompt ids are vLLM's own tokenization of the chat request it ran, and its logprobs align with its
completion ids; and, across a rollout's turns, that the trainer merges its calls and diagnoses each
boundary as it does for chat completions."""

from __future__ import annotations

import json
import urllib.request

from helpers import wait_for

from lightning_otel.collector import connect


class SentRequests:
    """The JSON bodies an httpx(2) client sent, by path: an event hook, independent of instrument()."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def hook(self, request) -> None:
        self.sent.append((request.url.path, json.loads(request.content)))

    async def async_hook(self, request) -> None:
        self.hook(request)


def calls_of(collector, rollout_id: str, count: int) -> list[dict]:
    """The rollout's llm_calls rows (with the chat request each span recorded), in start order."""
    conn = connect(collector.data_dir)
    sql = (
        "SELECT l.prompt_token_ids, l.completion_token_ids, l.completion_logprobs, l.training_source, "
        "l.policy_version, s.attributes['input.value'] FROM llm_calls l JOIN spans s USING (trace_id, span_id) "
        "WHERE l.rollout_id = ? ORDER BY l.start_time"
    )
    rows = wait_for(lambda: conn.execute(sql, [rollout_id]).fetchall(), lambda r: len(r) >= count, timeout_s=30)
    names = ["prompt", "completion", "logprobs", "source", "version", "request"]
    return [dict(zip(names, row)) for row in rows]


def vllm_tokenization(vllm_server, chat: dict) -> list[int]:
    """vLLM's /tokenize of a chat request's messages and tools, as its chat endpoint renders them."""
    body = {"model": chat["model"], "messages": chat["messages"], "add_generation_prompt": True}
    if chat.get("tools"):
        body["tools"] = chat["tools"]
    request = urllib.request.Request(
        vllm_server.url + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())["tokens"]


def vllm_tokenize(vllm_server, body: dict) -> list[int]:
    """vLLM's /tokenize of a chat request `body` as given, its rendering flags
    (`continue_final_message`, `add_generation_prompt`) included."""
    request = urllib.request.Request(
        vllm_server.url + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())["tokens"]


PREFILL = [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "The answer is"}]
CONTINUED = {"continue_final_message": True, "add_generation_prompt": False}


def check_prefill_ran_open(vllm_server, call: dict, output_tokens: int | None) -> None:
    """A call that continued PREFILL's last (assistant) message: its prompt ids are vLLM's rendering
    of the message left open, which differs from any rendering that closes it and opens a new turn
    (a re-rendering of the messages with a generation prompt)."""
    model = vllm_server.served_model_name
    assert call["source"] == "token_ids", call
    assert list(call["prompt"]) == vllm_tokenize(vllm_server, {"model": model, "messages": PREFILL, **CONTINUED})
    closed = {"model": model, "messages": PREFILL, "add_generation_prompt": True}
    assert list(call["prompt"]) != vllm_tokenize(vllm_server, closed)
    assert call["completion"] and len(call["completion"]) == len(call["logprobs"])
    assert output_tokens is None or len(call["completion"]) == output_tokens  # as the caller was told
    assert all(lp <= 0.0 for lp in call["logprobs"])


def check_trainable(vllm_server, call: dict, chat: dict | None = None) -> dict:
    """The chat request the call ran (`chat`, else the one its span recorded), after checking the
    call is trainable as vLLM ran it."""
    chat = chat or json.loads(call["request"])
    assert call["source"] == "token_ids", call
    assert call["prompt"] == vllm_tokenization(vllm_server, chat)
    assert call["completion"] and len(call["logprobs"]) == len(call["completion"])
    assert all(lp <= 0.0 for lp in call["logprobs"]) and call["version"]
    return chat


def merge_boundaries(collector, gateway_url: str, rollout_id: str, tokenizer) -> tuple[int, list]:
    """Reward the rollout through the gateway, then the trainer's own path over it (select_rollouts ->
    build_batch -> diagnostics.diagnose): (samples, one BoundaryRecord per pair of consecutive calls)."""
    from lightning_otel.trainer.diagnostics import diagnose
    from lightning_otel.trainer.rollout_data import select_rollouts
    from lightning_otel.trainer.update import build_batch

    request = urllib.request.Request(
        f"{gateway_url}/rollout/{rollout_id}/reward",
        data=json.dumps({"value": 1.0}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=30).close()
    selection = wait_for(
        lambda: select_rollouts(connect(collector.data_dir), where=f"rollout_id = '{rollout_id}'"),
        lambda found: len(found.rollouts) == 1,
        timeout_s=30,
    )
    batch = build_batch(selection)
    return len(batch.samples), diagnose(batch, tokenizer)


def server_tokenizer(vllm_server):
    """The tokenizer of the model `vllm_server` serves."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_server.model_dir)
