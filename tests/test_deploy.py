"""The Kubernetes manifests in deploy/ stay consistent with the code: every lightning-otel command
line parses with the real CLI, the trainer's config loads, $(VAR) references, secrets, volumes and
Service ports resolve, and the gateway and trainer list exactly the vLLM StatefulSet's replicas.
(No cluster here: applying them is not tested.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lightning_otel.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


def _documents() -> list[dict]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = [
        doc for name in kustomization["resources"] for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc
    ]
    return docs + list(yaml.safe_load_all((DEPLOY / "secret.example.yaml").read_text()))


def _pod_specs(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, pod spec) for every Deployment, StatefulSet and CronJob."""
    specs = []
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            specs.append((doc, doc["spec"]["template"]["spec"]))
        elif doc["kind"] == "CronJob":
            specs.append((doc, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return specs


def _cli_argv(container: dict) -> list[str]:
    """The arguments lightning-otel receives (the image's entrypoint is lightning-otel; torchrun
    runs it with -m lightning_otel)."""
    command = container.get("command", [])
    if command:
        assert command[0] == "torchrun" and command[-2:] == ["-m", "lightning_otel"], command
    return [str(a) for a in container["args"]]


def _by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def test_every_command_line_parses_with_the_real_cli():
    parser = build_parser()
    seen = set()
    for _, pod in _pod_specs(_documents()):
        for container in pod["containers"]:
            argv = _cli_argv(container)
            try:
                args = parser.parse_args(argv)
            except SystemExit:  # argparse's way of saying no
                pytest.fail(f"{container['name']}: lightning-otel {' '.join(argv)} does not parse")
            seen.add(argv[0])
            defined = {env["name"] for env in container.get("env", [])}
            for reference in re.findall(r"\$\((\w+)\)", " ".join(argv)):
                assert reference in defined, f"{container['name']}: $({reference}) is not in its env"
            if argv[0] == "train":
                assert args.config == "/etc/lightning-otel/train.toml"
    assert seen == {"collector", "serve", "gateway", "train"}


def test_references_resolve():
    docs = _documents()
    secret_keys = {name: set(doc["stringData"]) for name, doc in _by_kind(docs, "Secret").items()}
    claims, config_maps = _by_kind(docs, "PersistentVolumeClaim"), _by_kind(docs, "ConfigMap")
    for workload, pod in _pod_specs(docs):
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps
        templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for container in pod["containers"]:
            volumes = {v["name"] for v in pod.get("volumes", [])} | templates
            assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secret_keys[ref["name"]], ref


def test_services_select_pods_and_name_their_ports():
    docs = _documents()
    for service in _by_kind(docs, "Service").values():
        selector = service["spec"]["selector"]
        matches = [
            (w, p)
            for w, p in _pod_specs(docs)
            if w["kind"] != "CronJob" and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, service["metadata"]["name"]
        ports = {port["name"] for c in matches[0][1]["containers"] for port in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_gateway_and_trainer_list_exactly_the_vllm_replicas(tmp_path):
    from lightning_otel.trainer.config import load_config

    docs = _documents()
    vllm = _by_kind(docs, "StatefulSet")["vllm"]
    port = vllm["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    expected = [f"http://vllm-{i}.{vllm['spec']['serviceName']}:{port}" for i in range(vllm["spec"]["replicas"])]
    gateway = build_parser().parse_args(
        _cli_argv(_by_kind(docs, "Deployment")["lightning-gateway"]["spec"]["template"]["spec"]["containers"][0])
    )
    assert gateway.upstreams == expected
    text = _by_kind(docs, "ConfigMap")["lightning-train-config"]["data"]["train.toml"]
    (tmp_path / "train.toml").write_text(text)
    config = load_config(str(tmp_path / "train.toml"))
    assert config.server.replicas == expected
    assert config.server.gateway == "http://lightning-gateway:8000"
    assert config.model.lora_rank > 0  # vLLM runs with --lora: LoRA swaps
