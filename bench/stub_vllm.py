"""A minimal vLLM look-alike for overhead benchmarks: answers /v1/models (owned_by vllm),
/weight_info and /v1/chat/completions with a fixed vLLM-shaped response (token ids, logprobs) in
well under a millisecond, so what a benchmark measures is the client side or a proxy, not a model.

    python bench/stub_vllm.py --port 8199
"""

from __future__ import annotations

import argparse
import json

from aiohttp import web

PROMPT_IDS = list(range(1, 513))
COMPLETION_IDS = list(range(600, 632))


def response(token_ids: bool, logprobs: bool) -> bytes:
    choice = {
        "index": 0,
        "finish_reason": "length",
        "message": {"role": "assistant", "content": "word " * len(COMPLETION_IDS)},
        "logprobs": None,
    }
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [choice],
        "usage": {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": len(COMPLETION_IDS), "total_tokens": 544},
    }
    if token_ids:
        choice["token_ids"], body["prompt_token_ids"] = COMPLETION_IDS, PROMPT_IDS
    if logprobs:
        choice["logprobs"] = {
            "content": [{"token": "word", "logprob": -0.5, "bytes": [119], "top_logprobs": []} for _ in COMPLETION_IDS]
        }
    return json.dumps(body).encode()


RESPONSE = response(True, True)


def app(fields: str = "always") -> web.Application:
    """fields='always': every answer carries token ids and logprobs (what a proxy benchmark wants: the
    same bytes whoever asks); 'asked': only what the request asked for, as vLLM answers."""
    application = web.Application()
    models = json.dumps({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "vllm"}]})
    application.router.add_get("/v1/models", lambda _: web.Response(text=models, content_type="application/json"))
    application.router.add_get("/weight_info", lambda _: web.json_response({"weight_version": "7"}))
    answers = {(ids, lps): response(ids, lps) for ids in (False, True) for lps in (False, True)}

    async def chat(request: web.Request) -> web.Response:
        raw = await request.read()
        if fields == "always":
            return web.Response(body=RESPONSE, content_type="application/json")
        body = json.loads(raw)
        answer = answers[(bool(body.get("return_token_ids")), bool(body.get("logprobs")))]
        return web.Response(body=answer, content_type="application/json")

    application.router.add_post("/v1/chat/completions", chat)
    return application


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fields", choices=("always", "asked"), default="always", help=app.__doc__)
    arguments = parser.parse_args()
    web.run_app(app(arguments.fields), host="127.0.0.1", port=arguments.port, print=None, access_log=None)
