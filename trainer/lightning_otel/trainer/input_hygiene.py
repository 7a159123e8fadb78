"""Input hygiene: behaviour logprobs the loss must not see, found before the batch is built.

A completion token of a recorded call is masked out of the loss (loss mask 0, no weight, not counted
in any token total) when its behaviour logprob is NaN, +-inf, below BEHAVIOUR_LOGPROB_FLOOR, or
positive past POSITIVE_LOGPROB_TOLERANCE. The
call is reported (`MaskedCall`, published as an `input_diagnostic` span: the collector's
`input_diagnostics` view). Its other tokens still train.

Why -50: vLLM's OpenAI routes send -inf as -9999.0 (`max(logprob, -9999.0)`: JSON has no -inf), and
a token really sampled with probability below e^-50 (~2e-22) does not happen in any number of
samples a training run will see: such a value is a placeholder or a broken server, not a
measurement. Above the floor the log-ratio logp_theta - logp_behaviour is at most 50, so exp() stays
finite in float32 (it overflows past ~88) even with the objective's clamp turned off.

Why positive values, with a tolerance of 1e-4: log p <= 0 for any probability, so a positive logprob
is a broken server or a client bug (a probability recorded as a logprob, a sign flipped), and it
would make the trainer push the token's probability towards an impossible target. Servers compute
logprobs in float32 and renormalize after top-k / top-p; rounding near p = 1 is about one float32
ulp (1.2e-7), so a value up to 1e-4 is float noise on a token sampled with p ~ 1 and kept (its
effect on the ratio is below e^1e-4 - 1 = 1e-4, under any clip range), anything larger is masked.

Reconstructed calls (reconstruct.py) have NaN behaviour logprobs by design: they are not masked and
not reported; the update trains them as on-policy (ratio 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lightning_otel.trainer.config import UpdateConfig
from lightning_otel.trainer.merge import LLMCall

BEHAVIOUR_LOGPROB_FLOOR = UpdateConfig.behaviour_logprob_floor  # -50.0, configurable per run
POSITIVE_LOGPROB_TOLERANCE = 1e-4  # log p <= 0; above this is not float rounding near p = 1
CAUSE_INVALID_LOGPROBS = "invalid_behaviour_logprobs"


@dataclass(frozen=True)
class MaskedCall:
    """One call with completion tokens masked out of the loss, and why."""

    rollout_id: str
    task_id: str
    span_id: str
    tokens: int  # masked tokens (of this call's completion)
    nan: int
    infinite: int  # +inf or -inf
    below_floor: int  # finite and below the floor (vLLM's -9999.0 among them)
    lowest: float | None  # the lowest finite value below the floor
    floor: float = BEHAVIOUR_LOGPROB_FLOOR
    positive: int = 0  # finite and above POSITIVE_LOGPROB_TOLERANCE: impossible, log p <= 0
    highest: float | None = None  # the highest positive value masked
    cause: str = CAUSE_INVALID_LOGPROBS

    @property
    def detail(self) -> str:
        parts = []
        if self.nan:
            parts.append(f"{self.nan} NaN")
        if self.infinite:
            parts.append(f"{self.infinite} infinite")
        if self.below_floor:
            parts.append(f"{self.below_floor} below {self.floor:g} (lowest {self.lowest:g})")
        if self.positive:
            parts.append(f"{self.positive} positive (highest {self.highest:g})")
        return f"{self.tokens} behaviour logprob(s) masked: " + ", ".join(parts)


def invalid_behaviour_logprobs(logprobs: np.ndarray, floor: float = BEHAVIOUR_LOGPROB_FLOOR) -> np.ndarray:
    """True where a behaviour logprob is NaN, infinite, below `floor` or above POSITIVE_LOGPROB_TOLERANCE."""
    values = np.asarray(logprobs, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(values) | (values < floor) | (values > POSITIVE_LOGPROB_TOLERANCE)


def screen_call(
    call: LLMCall, rollout_id: str, task_id: str, floor: float = BEHAVIOUR_LOGPROB_FLOOR
) -> tuple[LLMCall, MaskedCall | None]:
    """The call with its invalid tokens masked (`LLMCall.masked`), and the report; unchanged and None
    when every logprob is usable or the call is reconstructed."""
    if call.reconstructed:
        return call, None
    bad = invalid_behaviour_logprobs(call.logprobs, floor)
    if not bad.any():
        return call, None
    values = np.asarray(call.logprobs, dtype=np.float64)[bad]
    finite = values[np.isfinite(values)]
    low, high = finite[finite < floor], finite[finite > POSITIVE_LOGPROB_TOLERANCE]
    report = MaskedCall(
        rollout_id,
        task_id,
        call.span_id,
        tokens=int(bad.sum()),
        nan=int(np.isnan(values).sum()),
        infinite=int(np.isinf(values).sum()),
        below_floor=int(low.size),
        lowest=float(low.min()) if low.size else None,
        floor=floor,
        positive=int(high.size),
        highest=float(high.max()) if high.size else None,
    )
    return dataclasses.replace(call, masked=bad), report
