"""The compiled response scanner (instrument/lightning_otel/instrumentation/integrations/_vllm_tokens.c) against the Python path it shortcuts:
for any body, `take_body` (cut token fields from the raw bytes, then json.loads the rest) either
declines (None) or gives exactly what json.loads + `take` give: the same JSON for the SDK (unasked
token fields set to null) and the same packed token attributes, bit for bit. It must answer for the
bodies vLLM sends (else the fast path would be dead code), and decline whenever json.loads would
fail, so a broken body still raises in the caller as it would without us."""

from __future__ import annotations

import json
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_otel.core import schema
from lightning_otel.core.vllm_endpoint import CHAT, COMPLETIONS
from lightning_otel.instrumentation.integrations import openai_lean
from lightning_otel.instrumentation.integrations.openai_lean import _LeanCall

cut = openai_lean._vllm_tokens.cut if openai_lean._vllm_tokens is not None else None


def test_the_compiled_scanner_is_built():
    """CI installs with a compiler: without the scanner every test below would pass by declining."""
    assert cut is not None


def _call(kind: str, strip_ids: bool, strip_logprobs: bool) -> _LeanCall:
    call = object.__new__(_LeanCall)  # the fields take/take_body use; no span
    call.kind, call.strip_ids, call.strip_logprobs, call.taken, call.data = kind, strip_ids, strip_logprobs, None, None
    return call


def _both(body: bytes, kind: str, strip_ids: bool, strip_logprobs: bool) -> tuple:
    """(the Python path's (JSON, attributes) or the exception json.loads raised, the scanner's or None)."""
    try:
        reference = json.loads(body)
    except (ValueError, RecursionError) as exc:
        reference = exc
    else:
        python = _call(kind, strip_ids, strip_logprobs)
        try:
            python.take(reference)
        except Exception as exc:
            reference = exc
        else:
            reference = (reference, python.taken)
    fast = _call(kind, strip_ids, strip_logprobs)
    data = fast.take_body(body)
    return reference, None if data is None else (data, fast.taken)


def _agree(body: bytes, kind: str, strip_ids: bool, strip_logprobs: bool) -> bool:
    """Asserts the two paths agree; True when the scanner answered."""
    reference, fast = _both(body, kind, strip_ids, strip_logprobs)
    if isinstance(reference, Exception):
        assert fast is None, f"answered a body the Python path refuses ({reference!r}): {body[:200]!r}"
        return False
    if fast is not None:
        assert fast[0] == reference[0]
        assert fast[1] == reference[1]  # packed bytes: ids and float64 logprobs bit for bit
    return fast is not None


ID = st.integers(-(2**31), 2**31 - 1)
LOGPROB = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(-30, 0),
    st.integers(-(10**15) + 1, 10**15 - 1),
    st.just(-0.0),
)
TEXT = st.text(max_size=12)


def _entry(logprob):
    return st.fixed_dictionaries(
        {
            "token": TEXT,
            "logprob": st.just(logprob),
            "bytes": st.lists(st.integers(0, 255), max_size=4),
            "top_logprobs": st.lists(st.fixed_dictionaries({"token": TEXT, "logprob": LOGPROB}), max_size=2),
        }
    )


@st.composite
def _choice(draw, kind: str, index) -> dict:
    ids = draw(st.one_of(st.none(), st.lists(ID, max_size=40)))
    logprobs = draw(st.lists(LOGPROB, min_size=len(ids or ()), max_size=len(ids or ())) | st.lists(LOGPROB, max_size=5))
    choice: dict = {"finish_reason": draw(st.sampled_from(["stop", "length", None])), "stop_reason": None}
    if index is not None:
        choice["index"] = index
    if kind == CHAT:
        choice["message"] = {
            "role": "assistant",
            "content": draw(st.one_of(st.none(), st.text(max_size=40))),
            "tool_calls": [],
        }
        entries = [draw(_entry(lp)) for lp in logprobs]
        choice["logprobs"] = draw(st.sampled_from([None, {"content": entries}, {"content": None}, {}]))
    else:
        choice["text"] = draw(st.text(max_size=40))
        choice["prompt_token_ids"] = draw(st.one_of(st.none(), st.lists(ID, max_size=60)))
        choice["logprobs"] = draw(
            st.sampled_from(
                [None, {"token_logprobs": logprobs, "tokens": ["x"] * len(logprobs), "text_offset": []}, {}]
            )
        )
    if draw(st.booleans()) or ids is not None:
        choice["token_ids"] = ids
    return _shuffled(draw, choice)


def _shuffled(draw, fields: dict) -> dict:
    keys = draw(st.permutations(list(fields)))
    return {key: fields[key] for key in keys}


@st.composite
def _response(draw) -> tuple[str, bytes]:
    kind = draw(st.sampled_from([CHAT, COMPLETIONS]))
    indexes = draw(st.lists(st.sampled_from([0, 1, 2, None, "absent"]), min_size=0, max_size=3))
    body = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": draw(TEXT),
        "choices": [draw(_choice(kind, None if i == "absent" else i)) for i in indexes],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    if kind == CHAT and draw(st.booleans()):
        body["prompt_token_ids"] = draw(st.one_of(st.none(), st.lists(ID, max_size=60)))
    body = _shuffled(draw, body)
    style = draw(st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 1}, {"ensure_ascii": False}]))
    return kind, json.dumps(body, **style).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_response(), st.booleans(), st.booleans())
def test_the_scanner_answers_vllm_shaped_bodies_as_the_python_path(response, strip_ids, strip_logprobs):
    kind, body = response
    assert _agree(body, kind, strip_ids, strip_logprobs)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_response(), st.randoms(use_true_random=False), st.booleans())
def test_a_damaged_body_is_declined_or_read_alike(response, rng, strip):
    """Bytes dropped, doubled or replaced anywhere: never an answer json.loads would not give."""
    kind, body = response
    data = bytearray(body)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data))
        operation = rng.choice(["drop", "double", "replace"])
        if operation == "drop":
            del data[at]
        elif operation == "double":
            data.insert(at, data[at])
        else:
            data[at] = rng.choice(b'{}[],:"\\-.0123456789eE+ntfaxu\x00\x1f\x80\xc3\xff ')
    _agree(bytes(data), kind, strip, strip)


VLLM_CHAT = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"caf\xc3\xa9 \\"x\\"\\u00e9","tool_calls":[]},"logprobs":{"content":'
    b'[{"token":"caf","logprob":-0.25,"bytes":[99,97,102],"top_logprobs":[]},{"token":"\xc3\xa9","logprob":-1.5e-07,'
    b'"bytes":[195,169],"top_logprobs":[]}]},"finish_reason":"length","stop_reason":null,"token_ids":[7,2147483647]}],'
    b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2},"prompt_logprobs":null,'
    b'"prompt_token_ids":[1,-2147483648,0],"kv_transfer_params":null}'
)


def test_a_vllm_answer_is_cut_to_what_an_unasking_caller_gets():
    call = _call(CHAT, True, True)
    data = call.take_body(VLLM_CHAT)
    assert (
        data["prompt_token_ids"] is None
        and data["choices"][0]["token_ids"] is None
        and data["choices"][0]["logprobs"] is None
    )
    assert data["choices"][0]["message"]["content"] == 'café "x"é'
    assert call.taken == {
        schema.PACKED_PROMPT_TOKEN_IDS: struct.pack("<3i", 1, -(2**31), 0),
        schema.PACKED_COMPLETION_TOKEN_IDS: struct.pack("<2i", 7, 2**31 - 1),
        schema.PACKED_COMPLETION_LOGPROBS: struct.pack("<2d", -0.25, -1.5e-07),
        schema.FINISH_REASON: "length",
    }
    kept = _call(CHAT, False, False)
    assert kept.take_body(VLLM_CHAT) == json.loads(VLLM_CHAT) and kept.taken == call.taken  # asked: nothing cut


@pytest.mark.parametrize(
    "change",
    [
        (b'"logprob":-0.25', b'"logprob":NaN'),
        (b'"logprob":-0.25', b'"logprob":-Infinity'),  # json.loads reads these: Python decides
        (b"[7,2147483647]", b"[7,2147483648]"),
        (b"[7,2147483647]", b"[7,2.0]"),
        (b"[7,2147483647]", b'[7,"8"]'),  # not int32 ids
        (b'"index":0', b'"index":"0"'),
        (b'"index":0', b'"index":0.0'),
        (b'"index":0', b'"index":false'),
        (b'"token_ids"', b'"token_\\u0069ds"'),
        (b'"kv_transfer_params":null', b'"prompt_token_ids":[5]'),  # escaped / repeated keys
        (b'"logprob":-1.5e-07,', b""),
        (b'{"token":"caf","logprob":-0.25,"bytes":[99,97,102],"top_logprobs":[]}', b'["caf",-0.25]'),
        (b'"logprob":-0.25', b'"logprob":-0.25,"logprob":-1'),
        (b'{"id"', b'\xef\xbb\xbf{"id"'),  # json.loads skips a BOM
        (b'\xc3\xa9"', b'\xed\xa0\x80"'),  # a UTF-8 surrogate: json.loads passes it, Python's strict UTF-8 does not
        (b'"choices":[', b'"choices":{"x":['),
        (b'"kv_transfer_params":null', b'"choices":[]'),
        (b'"logprobs":{"content":', b'"logprobs":{"content":3,"x":'),
    ],
)
def test_shapes_json_reads_but_the_scanner_is_unsure_of_go_to_python(change):
    body = VLLM_CHAT.replace(*change)
    assert body != VLLM_CHAT
    if change[1].endswith(b'{"x":['):
        body = body.replace(b'}],"usage"', b'}]},"usage"')
    json.loads(body)  # still JSON
    assert cut(body, True, True, True) is None
    _agree(body, CHAT, True, True)


@pytest.mark.parametrize(
    "body",
    [
        VLLM_CHAT + b"x",
        VLLM_CHAT.replace(b"caf\xc3\xa9", b"caf\xc3"),
        VLLM_CHAT.replace(b'"caf"', b'"c\x01"'),
        VLLM_CHAT.replace(b'\\"x', b"\\x"),
        VLLM_CHAT.replace(b"[99,97,102]", b"[99,97,]"),
        VLLM_CHAT.replace(b"-0.25", b"-.25"),
        VLLM_CHAT.replace(b"[1,-2147483648,0]", b"[01,2]"),
        VLLM_CHAT[:-1],
        b"[]",
        b"",
        b'{"choices":' + b"[" * 300 + b"]" * 300 + b"}",
        b'{"x":' + b"[" * 200_000 + b"]" * 200_000 + b',"choices":[]}',  # past any stack
    ],
)
def test_broken_or_unknown_bodies_are_declined(body):
    _agree(body, CHAT, True, True)
    assert cut(body, True, True, True) is None


@settings(max_examples=500, deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["{!r}", "{:.17g}", "{:e}", "{:.3f}", "{:.20E}", "{:.0f}"]),
)
def test_logprobs_read_as_float_reads_them(value, form):
    text = form.format(value)
    body = (
        json.dumps({"choices": [{"token_ids": [1], "logprobs": None}]})
        .encode()
        .replace(b'"logprobs": null', b'"logprobs": {"token_logprobs": [' + text.encode() + b"]}")
    )
    try:
        expected = float(json.loads(body)["choices"][0]["logprobs"]["token_logprobs"][0])
    except (ValueError, OverflowError):
        assert cut(body, False, False, False) is None
        return
    answer = cut(body, False, False, False)
    integer = not any(c in text for c in ".eE")
    if (integer and len(text.lstrip("-")) > 15) or len(
        text
    ) >= 64:  # left to Python: float() of a long integer can fail
        return
    assert answer is not None and answer[3] == struct.pack("<d", expected), text


def test_the_other_kinds_logprob_list_is_ignored():
    """Chat reads logprobs.content, completions logprobs.token_logprobs, whatever else is there."""
    chat = VLLM_CHAT.replace(b'"logprobs":{"content":', b'"logprobs":{"token_logprobs":[1,"x"],"content":')
    text = (
        b'{"choices":[{"index":0,"text":"a","token_ids":[3],"prompt_token_ids":[1,2],'
        b'"logprobs":{"content":[{"x":1}],"token_logprobs":[-0.5],"tokens":["a"]}}]}'
    )
    assert (
        _agree(chat, CHAT, True, True)
        and _agree(text, COMPLETIONS, True, False)
        and _agree(text, COMPLETIONS, False, True)
    )


def test_a_prompt_of_many_ids_and_large_bodies():
    rng = random.Random(7)
    ids = [rng.randrange(-(2**31), 2**31) for _ in range(20000)]
    body = json.dumps(
        {"choices": [{"index": 0, "token_ids": ids[:5000], "logprobs": None}], "prompt_token_ids": ids}
    ).encode()
    answer = cut(body, True, True, False)
    assert answer[1] == struct.pack(f"<{len(ids)}i", *ids) and answer[2] == struct.pack("<5000i", *ids[:5000])
    assert json.loads(answer[0]) == {
        "choices": [{"index": 0, "token_ids": None, "logprobs": None}],
        "prompt_token_ids": None,
    }
