"""When does tool_use's SFT warm-up start copying? Offline, no servers: the example's warm-up data and
held-out check, printed every K steps, for one seed and one initialization.

    python bench/tool_use_warm_up.py --seed 1 --steps 400 --every 25 --workdir DIR
    python bench/tool_use_warm_up.py --seed 1 --init-seed 1001 ...     # the same data, another initialization
    python bench/tool_use_warm_up.py --seed 1 --plain-prompt ...        # a system turn without "12 * 34" / "The answer is"
    python bench/tool_use_warm_up.py --probe DIR/sft                     # a saved model: p(copied digit) by position
    python bench/tool_use_warm_up.py --seed 2 --kv-heads 1 --probe-each-check ...   # one shared key and value, probed as it learns
    python bench/tool_use_warm_up.py --seed 2 --hidden-size 128 --heads 4 ...     # wider (or --layers 3: deeper)
    python bench/tool_use_warm_up.py --seed 2 --random-results 0 ...   # warm-up tool results the products, not random
    python bench/tool_use_warm_up.py --seed 2 --slipped-digits 0 ...   # demonstrations that copy every digit right

Each line (on stderr: TRL's run hides stdout): the step and the held-out solved share
(`run.held_out_solved_share`, the warm-up's stopping check); then the probe of the final model.
`--probe` (and `--probe-each-check`, at every check) prints `run.copy_probabilities` over the seed's
64 held-out tasks (teacher-forced, solved conversations): the mean probability of the right digit at
each of the four digits the call copies from the question and the four the answer copies from the tool,
and `first_digit_source`: with another result shown, whether the answer's first digit follows it (a copy)
or the product (an estimate from the question).
`--probe DIR/sft --seed S`: S must be the run's seed (its held-out tasks).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples"
sys.path[:0] = [str(EXAMPLE / "tool_use"), str(EXAMPLE)]

import calculator_task  # noqa: E402
import run as tool_use  # noqa: E402
import training_loop  # noqa: E402

PLAIN_INSTRUCTIONS = "Use the calculator tool, then reply with its result."
PLAIN_DESCRIPTION = "Evaluate an arithmetic expression over integers: add, subtract, multiply."


def load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def first_digit_source(model, tokenizer, tasks) -> tuple[float, float]:
    """Where the answer's first digit comes from: teacher-forced up to "The answer is ", with the tool's
    result replaced by another four-digit number whose first digit differs from the product's, the
    mean probability of (the shown result's first digit, the product's first digit). A model that
    copies puts its mass on the first; one that estimates the product from the question, the second."""
    import torch

    rng, tools = random.Random(0), [calculator_task.tool_schema()]
    shown_p = product_p = 0.0
    for question, product in tasks:
        shown = product
        while str(shown)[0] == str(product)[0]:
            shown = calculator_task.random_result(rng)
        prompt = calculator_task.solved_conversation(question, shown)[1]["prompt"]
        text = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
        with torch.no_grad():
            p = model(torch.tensor([tokenizer.encode(text + "The answer is ")])).logits[0, -1].softmax(-1)
        shown_p += p[tokenizer.convert_tokens_to_ids(str(shown)[0])].item()
        product_p += p[tokenizer.convert_tokens_to_ids(str(product)[0])].item()
    return shown_p / len(tasks), product_p / len(tasks)


def probe(model, tokenizer, tasks, out=sys.stdout) -> None:
    means = tool_use.copy_probabilities(model, tokenizer, tasks)
    for kind, four in (("call", means[:4]), ("answer", means[4:])):
        print(f"{kind}: mean p(right digit) at digits 1-4: " + " ".join(f"{m:.2f}" for m in four), file=out)
    shown, product = first_digit_source(model, tokenizer, tasks)
    print(f"another result shown: p(its first digit) {shown:.2f}, p(the product's) {product:.2f}", file=out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the run's seed: warm-up data, data order, held-out tasks")
    parser.add_argument("--init-seed", type=int, default=None, help="the tiny model's seed (default: --seed)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=tool_use.WARM_UP_WEIGHT_DECAY, help="0: the old warm-up")
    parser.add_argument("--plain-prompt", action="store_true", help="no digits or answer phrase in the system turn")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--probe", type=Path, help="only probe this saved model")
    parser.add_argument("--kv-heads", type=int, default=tool_use.KV_HEADS, help="1: the heads share one key and value")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2, help="attention heads (head size = hidden size / heads >= 32)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--random-results",
        type=float,
        default=tool_use.WARM_UP_RANDOM_RESULTS,
        help="share of warm-up conversations whose tool result is a random number, not the product",
    )
    parser.add_argument(
        "--slipped-digits",
        type=float,
        default=tool_use.WARM_UP_SLIPPED_DIGITS,
        help="share of the demonstrations' copied digits written wrong (0: every copy exact)",
    )
    parser.add_argument("--tasks", type=int, default=tool_use.WARM_UP_TASKS, help="distinct warm-up conversations")
    parser.add_argument("--probe-each-check", action="store_true", help="also probe at every check")
    args = parser.parse_args()
    _, held_out = tool_use.warm_up_data(args.seed)
    if args.probe:
        probe(*load(args.probe), held_out)
        return 0
    if args.workdir is None:
        parser.error("--workdir is required")
    if args.plain_prompt:
        calculator_task.INSTRUCTIONS, calculator_task.TOOL_DESCRIPTION = PLAIN_INSTRUCTIONS, PLAIN_DESCRIPTION
    init_seed = args.seed if args.init_seed is None else args.init_seed
    base = tool_use.build_model(
        args.workdir / "model",
        init_seed,
        kv_heads=args.kv_heads,
        hidden_size=args.hidden_size,
        heads=args.heads,
        layers=args.layers,
    )
    examples, _ = tool_use.warm_up_data(args.seed, args.random_results, args.tasks, args.slipped_digits)
    began, step = time.perf_counter(), 0

    def report(model, tokenizer) -> bool:
        nonlocal step
        step += args.every
        solved = tool_use.held_out_solved_share(model, tokenizer, held_out)
        print(
            f"seed {args.seed} init {init_seed} step {step:4d} ({time.perf_counter() - began:4.0f} s): "
            f"held-out solved {solved:.3f}",
            file=sys.stderr,
            flush=True,
        )
        if args.probe_each_check:
            probe(model, tokenizer, held_out, out=sys.stderr)
        return False

    tools = [calculator_task.tool_schema()]
    training_loop.sft_warmup(
        base,
        args.workdir / "sft",
        examples,
        tools,
        args.steps,
        args.learning_rate,
        args.seed,
        stop_when=report,
        weight_decay=args.weight_decay,
        check_every=args.every,
    )
    probe(*load(args.workdir / "sft"), held_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
