"""The tool-use task: arithmetic the model cannot do in its head, with a calculator it can call.

Task: `What is "37*48"?` (two-digit operands, a four-digit product). The agent has one tool,
`calculator(expression)`. Solving takes two model calls: one that calls the tool with the question's
expression (copied), one that reports the tool's result (copied): "The answer is 1776."
Reward: 1 when the final answer's last number is the right result, else 0.

Why the quotes and no spaces: a 2-layer model copies a digit by finding the token that came before it
(the digit before, `"` before the first operand, `*` before the second). Written `What is 37 * 48?`,
the operands' first digits follow " is " and "* ", spaces that precede many tokens, and the tool's
description had "12 * 34" for the second one to find: whether the warm-up learnt those two copies was
a lottery over initializations (README, "What the warm-up teaches").

`sft_examples` are what the SFT warm-up shows the model: one prompt -> completion pair per model
call of a solved rollout, rendered by the same chat template vLLM uses, tools included.

Splits: every question belongs to exactly one of SPLITS, by a hash of its operands (`split_of`), so
the warm-up's demonstrations, its stopping check, the RL tasks and the held-out evaluation never
share a question, whatever the seed: disjoint by construction, not by luck (tests/examples/test_examples.py).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import operator
import random
import re
from collections.abc import Callable

INSTRUCTIONS = "Use the calculator tool, then reply: The answer is <result>."
TOOL_NAME = "calculator"
TOOL_DESCRIPTION = "Evaluate an arithmetic expression over integers with +, - and *."  # no digits to copy by mistake
_AST_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_NUMBER = re.compile(r"-?\d+")


def calculate(expression: str) -> str:
    """The calculator: +, - and * over integers (parsed, never eval'd); an error message otherwise."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPERATORS:
            return _AST_OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only integers with + - * are supported")

    try:
        return str(value(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as error:
        return f"error: {error}"


OPERANDS = range(32, 100)
# Each split's share of the 68 x 68 questions, in percent of the hash space (`split_of`): ~460
# held-out evaluation questions, ~230 for the warm-up's stopping check, ~1,390 to draw the warm-up's
# demonstrations from, ~2,540 for RL.
SPLITS = {"eval": 10, "warm_up_check": 5, "warm_up": 30, "rl": 55}
EVAL_TASKS = 64  # the fixed held-out evaluation set the examples' loop runs (`eval_tasks`)


def split_of(a: int, b: int) -> str:
    """The split the question of (a, b) belongs to: a hash of the operands (not of a seed) into SPLITS' shares.
    Symmetric: a * b and b * a have one product, so they share a split."""
    low, high = sorted((a, b))
    bucket = int.from_bytes(hashlib.sha256(f"{low} * {high}".encode()).digest()[:8], "big") % 100
    for split, share in SPLITS.items():
        if bucket < share:
            return split
        bucket -= share
    raise AssertionError("SPLITS' shares add up to 100")


@functools.cache
def operands_in(split: str) -> tuple[tuple[int, int], ...]:
    """Every (a, b) whose question belongs to `split`, in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    return tuple((a, b) for a in OPERANDS for b in OPERANDS if split_of(a, b) == split)


def _task(a: int, b: int) -> tuple[str, int]:
    return f'What is "{a}*{b}"?', a * b


def make_task(rng: random.Random, split: str = "rl") -> tuple[str, int]:
    """(question, result), drawn from `split`. Operands from 32 to 99: every product has four digits, so
    the question, the call and the result have the same length in tokens every time, and copying is at
    fixed offsets."""
    return _task(*rng.choice(operands_in(split)))


def eval_tasks(count: int = EVAL_TASKS) -> list[tuple[str, int]]:
    """The held-out evaluation set: `count` questions of the eval split, no two of them mirrors, the same
    for every seed."""
    unordered = [(a, b) for a, b in operands_in("eval") if a <= b]
    return [_task(a, b) for a, b in random.Random("eval").sample(unordered, count)]


def random_result(rng: random.Random) -> int:
    """A four-digit number from the products' range that need not be a product: a tool result the
    question does not predict (`sft_examples`' random results, the bench's probe)."""
    return rng.randint(32 * 32, 99 * 99)


def expression_of(question: str) -> str:
    """`What is "37*48"?` -> `37*48`."""
    return question.removeprefix('What is "').removesuffix('"?')


def reward(final_answer: str, result: int) -> float:
    numbers = _NUMBER.findall(final_answer or "")
    return 1.0 if numbers and int(numbers[-1]) == result else 0.0


def tool_schema() -> dict:
    """The tool as the OpenAI Agents SDK sends it (calculator_agent.py's tool, strict_mode=False), which
    vLLM renders into the system turn: the SFT warm-up shows the model the same prompt."""
    parameters = {
        "properties": {"expression": {"title": "Expression", "type": "string"}},
        "required": ["expression"],
        "title": f"{TOOL_NAME}_args",
        "type": "object",
    }
    return {
        "type": "function",
        "function": {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": parameters, "strict": False},
    }


def solved_conversation(question: str, result: int, garble: Callable[[str], str] | None = None) -> list[dict]:
    """Two prompt -> completion pairs: the call with the question's expression, and the answer that
    reports the tool's result. `garble`, if given, rewrites each copied number as the demonstrator
    writes it (`slip_digits`); the prompts stay exact."""
    garble = garble or str
    a, b = expression_of(question).split("*")
    arguments = {"expression": f"{garble(a)}*{garble(b)}"}
    call = {"id": "call_0", "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
    start = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question}]
    calling = {"role": "assistant", "content": None, "tool_calls": [call]}
    answered = start + [calling, {"role": "tool", "tool_call_id": "call_0", "content": str(result)}]
    reply = {"role": "assistant", "content": f"The answer is {garble(str(result))}."}
    return [{"prompt": start, "completion": [calling]}, {"prompt": answered, "completion": [reply]}]


def slip_digits(number: str, share: float, rng: random.Random) -> str:
    """`number` with each digit, with probability `share`, replaced by another digit (a first digit by
    another non-zero one): a demonstrator that copies each digit right with probability 1 - share."""
    slipped = []
    for position, digit in enumerate(number):
        if rng.random() < share:
            digit = rng.choice([d for d in "0123456789"[1 if position == 0 else 0 :] if d != digit])
        slipped.append(digit)
    return "".join(slipped)


def sft_examples(
    count: int, rng: random.Random, random_results: float = 0.0, slipped_digits: float = 0.0
) -> list[dict]:
    """`solved_conversation`'s two pairs for each of `count` tasks. In a share `random_results` of them
    the tool's result (and so the reported answer) is a random four-digit number instead of the
    product: then the answer can be learnt only by copying the tool's result, not by estimating the
    product from the question. `slipped_digits`: the share of copied digits the demonstrations get
    wrong (`slip_digits`), in the call and the answer alike. The tasks come from the warm_up split;
    with both shares 0, `rng` draws the tasks alone."""
    results = random.Random(rng.random()) if random_results else None
    slips = random.Random(rng.random()) if slipped_digits else None
    garble = (lambda number: slip_digits(number, slipped_digits, slips)) if slips else None
    pairs = []
    for _ in range(count):
        question, product = make_task(rng, "warm_up")
        shown = random_result(results) if results and results.random() < random_results else product
        pairs += solved_conversation(question, shown, garble)
    return pairs
