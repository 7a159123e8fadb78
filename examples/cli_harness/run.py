"""One rollout of an unmodified coding CLI (Codex CLI or Claude Code) against the gateway, then its reward.

    python examples/cli_harness/run.py codex  --binary PATH --gateway URL --task T [--rollout R] [--reward 1.0] \
        --workdir DIR "create hello.txt containing hi"
    python examples/cli_harness/run.py claude --binary PATH --gateway URL --task T ... "Add a docstring to greet()"

The CLI talks to the gateway's per-rollout URL (/rollout/R/task/T/...), so each model call it makes is
recorded with the rollout and task ids and vLLM's token ids; nothing in the CLI changes. The reward is
posted to the gateway's reward route for the same rollout. tests/end_to_end/test_codex_cli.py and
test_claude_code.py run their CLIs through these functions. README.md in this folder has the recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path


def rollout_url(gateway: str, rollout_id: str, task_id: str) -> str:
    return f"{gateway.rstrip('/')}/rollout/{rollout_id}/task/{task_id}"


def codex_command(codex: str | Path, base_url: str, model: str, prompt: str) -> list[str]:
    """`codex exec` with a model provider whose base_url is the gateway (Responses API, `/v1/responses`)."""
    return [
        str(codex),
        "exec",
        "--skip-git-repo-check",  # the working folder need not be a git repository
        "-m",
        model,
        # The gateway serves function tools only: Codex's multi_agent tool namespace and its hosted
        # web_search tool are turned off.
        "--disable",
        "multi_agent",
        "-c",
        'web_search="disabled"',
        "-c",
        "analytics.enabled=false",
        "-c",
        "model_provider=rollout",
        "-c",
        f'model_providers.rollout={{name="rollout", base_url="{base_url}/v1", wire_api="responses"}}',
        prompt,
    ]


def claude_code_env(base_url: str, model: str, home: str | Path, max_output_tokens: int | None = None) -> dict:
    """Claude Code's environment: the gateway as its Anthropic endpoint (`/v1/messages`), the served
    model for both its main and its small model, and no telemetry, error reports or update checks."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),  # its settings and session files go here, not into the user's home
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-local",  # any value: the gateway does not check it
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    return env


def run_cli(
    cli: str,
    binary: str | Path,
    gateway: str,
    rollout_id: str,
    task_id: str,
    prompt: str,
    workdir: Path,
    home: Path,
    model: str = "policy",
    max_output_tokens: int | None = None,
    timeout_s: float = 600,
) -> subprocess.CompletedProcess:
    """Run the CLI once in `workdir` as rollout `rollout_id` of task `task_id`; `home` holds its state."""
    base_url = rollout_url(gateway, rollout_id, task_id)
    home.mkdir(parents=True, exist_ok=True)
    if cli == "codex":
        command = codex_command(binary, base_url, model, prompt)
        env = {**os.environ, "CODEX_HOME": str(home)}
    elif cli == "claude":
        command = [str(binary), "-p", prompt, "--max-turns", "1"]
        env = claude_code_env(base_url, model, home, max_output_tokens)
    else:
        raise ValueError(f"unknown CLI {cli!r}: codex or claude")
    return subprocess.run(
        command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
    )


def post_reward(gateway: str, rollout_id: str, task_id: str, value: float, name: str = "reward") -> None:
    request = urllib.request.Request(
        rollout_url(gateway, rollout_id, task_id) + "/reward",
        data=json.dumps({"value": value, "name": name}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        if json.loads(reply.read()) != {"recorded": True}:
            raise RuntimeError(f"the gateway did not record the reward of {rollout_id}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cli", choices=["codex", "claude"])
    parser.add_argument("prompt")
    parser.add_argument("--binary", required=True, help="the codex or claude executable")
    parser.add_argument("--gateway", required=True, help="the gateway's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--task", required=True, help="the task id (GRPO compares rollouts of one task)")
    parser.add_argument("--rollout", default=None, help="the rollout id (default: a new one)")
    parser.add_argument("--workdir", type=Path, required=True, help="the folder the CLI works in")
    parser.add_argument("--home", type=Path, default=None, help="the CLI's own state (default: WORKDIR/.cli-home)")
    parser.add_argument("--model", default="policy", help="vLLM's --served-model-name")
    parser.add_argument("--reward", type=float, default=None, help="post this reward once the CLI has finished")
    args = parser.parse_args()
    rollout_id = args.rollout or f"{args.cli}-{uuid.uuid4().hex[:12]}"
    home = args.home or args.workdir / ".cli-home"
    done = run_cli(
        args.cli, args.binary, args.gateway, rollout_id, args.task, args.prompt, args.workdir, home, args.model
    )
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if args.reward is not None:
        post_reward(args.gateway, rollout_id, args.task, args.reward)
    print(f"rollout {rollout_id} of task {args.task}: exit {done.returncode}", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
