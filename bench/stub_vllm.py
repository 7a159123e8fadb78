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
RESPONSE = json.dumps({
    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "policy",
    "choices": [{
        "index": 0, "finish_reason": "length", "token_ids": COMPLETION_IDS,
        "message": {"role": "assistant", "content": "word " * len(COMPLETION_IDS)},
        "logprobs": {"content": [{"token": "word", "logprob": -0.5, "bytes": [119], "top_logprobs": []} for _ in COMPLETION_IDS]},
    }],
    "usage": {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": len(COMPLETION_IDS), "total_tokens": 544},
    "prompt_token_ids": PROMPT_IDS,
}).encode()  # fmt: skip


def app() -> web.Application:
    application = web.Application()
    models = json.dumps({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "vllm"}]})
    application.router.add_get("/v1/models", lambda _: web.Response(text=models, content_type="application/json"))
    application.router.add_get("/weight_info", lambda _: web.json_response({"weight_version": "7"}))

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=RESPONSE, content_type="application/json")

    application.router.add_post("/v1/chat/completions", chat)
    return application


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    web.run_app(app(), host="127.0.0.1", port=parser.parse_args().port, print=None, access_log=None)
