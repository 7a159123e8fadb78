"""The merge rule, pinned on hand-computed examples and by properties (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_otel.trainer.merge import LLMCall, extends, merge_calls


def merge(calls):
    samples, boundaries = merge_calls(calls)
    return [_plain(s) for s in samples], boundaries


class _plain:
    """A sample with list fields, for readable assertions."""

    def __init__(self, sample):
        self.token_ids = sample.token_ids.tolist()
        self.loss_mask = sample.loss_mask.tolist()
        self.behaviour_logprobs = sample.behaviour_logprobs.tolist()
        self.span_ids = sample.span_ids
        self.generated_tokens = sample.generated_tokens


def call(name, prompt, completion, logprobs=None):
    return LLMCall(
        span_id=name,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=logprobs if logprobs is not None else [-0.1 * (i + 1) for i in range(len(completion))],
    )


def test_second_call_extending_the_first_exactly_merges_into_one_sample():
    first = call("a", [1, 2, 3], [4, 5], [-0.5, -0.25])
    # next prompt = previous prompt + completion + tool output [6, 7]
    second = call("b", [1, 2, 3, 4, 5, 6, 7], [8], [-1.0])
    [sample], [boundary] = merge([first, second])
    assert boundary.merged and boundary.position is None
    assert sample.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert sample.behaviour_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0]
    assert sample.span_ids == ["a", "b"]
    assert sample.generated_tokens == 3


def test_retokenized_completion_starts_a_new_sample():
    first = call("a", [1, 2, 3], [4, 5])
    # the harness re-rendered the completion: [4, 5] came back as [45]
    second = call("b", [1, 2, 3, 45, 6], [8])
    samples, [boundary] = merge([first, second])
    assert not boundary.merged and boundary.position == 3  # where 45 replaced 4
    assert [s.token_ids for s in samples] == [[1, 2, 3, 4, 5], [1, 2, 3, 45, 6, 8]]
    assert [s.loss_mask for s in samples] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1]]


def test_three_calls_one_failed_boundary_gives_two_samples():
    calls = [
        call("a", [1], [2]),
        call("b", [1, 2, 9], [3]),  # extends [1, 2]
        call("c", [7, 1, 2, 9, 3], [4]),  # context rewritten: a new system token in front
    ]
    samples, boundaries = merge(calls)
    assert [b.merged for b in boundaries] == [True, False] and boundaries[1].position == 0
    assert len(samples) == 2
    assert samples[0].token_ids == [1, 2, 9, 3]
    assert samples[1].token_ids == [7, 1, 2, 9, 3, 4]
    assert samples[1].loss_mask == [0, 0, 0, 0, 0, 1]


def test_prompt_equal_to_previous_sequence_merges():
    # no tokens between completions (e.g. the harness asks to continue)
    [sample], _ = merge([call("a", [1], [2]), call("b", [1, 2], [3])])
    assert sample.loss_mask == [0, 1, 1]


def test_shorter_prompt_never_merges():
    assert not extends([1, 2, 3], [1, 2])
    assert extends([], [5])
    samples, [boundary] = merge([call("a", [1, 2], [3]), call("b", [1, 2], [9])])  # truncated context
    assert not boundary.merged and boundary.position == 2 and len(samples) == 2


def test_misaligned_logprobs_are_rejected():
    import pytest

    with pytest.raises(ValueError, match="logprobs"):
        LLMCall(span_id="x", prompt_ids=[1], completion_ids=[2, 3], logprobs=[-1.0])


token = st.integers(min_value=0, max_value=5)  # a small alphabet makes accidental prefixes likely


@st.composite
def chains(draw):
    """Chains where each next prompt either extends the sequence so far or is arbitrary."""
    calls, seen = [], []
    for index in range(draw(st.integers(1, 6))):
        if seen and draw(st.booleans()):
            prompt = seen + draw(st.lists(token, max_size=3))
        else:
            prompt = draw(st.lists(token, min_size=1, max_size=8))
        completion = draw(st.lists(token, min_size=1, max_size=4))
        calls.append(call(str(index), prompt, completion))
        seen = prompt + completion
    return calls


@settings(max_examples=300, deadline=None)
@given(chains())
def test_properties_of_merging(calls):
    samples, boundaries = merge(calls)
    # every call is in exactly one sample, in order
    assert [span for s in samples for span in s.span_ids] == [c.span_id for c in calls]
    by_id = {c.span_id: c for c in calls}
    for sample in samples:
        first = by_id[sample.span_ids[0]]
        # the sample is exactly what the model saw at its last call, plus that call's completion
        last = by_id[sample.span_ids[-1]]
        assert sample.token_ids == last.prompt_ids.tolist() + last.completion_ids.tolist()
        # each call's prompt is a prefix of the sample: the model saw exactly these tokens
        for span in sample.span_ids:
            assert sample.token_ids[: len(by_id[span].prompt_ids)] == by_id[span].prompt_ids.tolist()
        # masks cover exactly the generated tokens, with their logprobs
        generated = [t for t, m in zip(sample.token_ids, sample.loss_mask) if m]
        assert generated == [t for s in sample.span_ids for t in by_id[s].completion_ids.tolist()]
        assert [lp for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask) if m] == [
            lp for s in sample.span_ids for lp in by_id[s].logprobs.tolist()
        ]
        assert sample.token_ids[: len(first.prompt_ids)] == first.prompt_ids.tolist()
    # the number of samples is 1 + the boundaries where the next prompt does not start with
    # the previous call's prompt + completion (the spec, computed without the merger)
    failed = sum(
        1
        for prev, nxt in zip(calls, calls[1:])
        if nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.completion_ids)].tolist()
        != prev.prompt_ids.tolist() + prev.completion_ids.tolist()
        or len(nxt.prompt_ids) < len(prev.prompt_ids) + len(prev.completion_ids)
    )
    assert len(samples) == 1 + failed
    assert sum(not b.merged for b in boundaries) == failed and len(boundaries) == len(calls) - 1
    for prev, nxt, boundary in zip(calls, calls[1:], boundaries):
        if not boundary.merged:  # the reported position is the first place the sequences differ
            seen = prev.prompt_ids.tolist() + prev.completion_ids.tolist()
            k = boundary.position
            assert seen[:k] == nxt.prompt_ids.tolist()[:k]
            assert k == len(nxt.prompt_ids) or k == len(seen) or seen[k] != nxt.prompt_ids[k]
