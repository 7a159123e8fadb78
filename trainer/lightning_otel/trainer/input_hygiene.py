"""Input hygiene: behaviour logprobs the loss must not see, found before the batch is built.

A completion token of a recorded call is masked out of the loss (loss mask 0, no weight, not counted
in any token total) when its behaviour logprob is NaN, +-inf, or below BEHAVIOUR_LOGPROB_FLOOR. The
call is reported (`MaskedCall`, published as an `input_diagnostic` span: the collector's
`input_diagnostics` view). Its other tokens still train.

Why -50: vLLM's OpenAI routes send -inf as -9999.0 (`max(logprob, -9999.0)`: JSON has no -inf), and
a token really sampled with probability below e^-50 (~2e-22) does not happen in any number of
samples a training run will see: such a value is a placeholder or a broken server, not a
measurement. Above the floor the log-ratio logp_theta - logp_behaviour is at most 50, so exp() stays
finite in float32 (it overflows past ~88) even with the objective's clamp turned off.

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
        return f"{self.tokens} behaviour logprob(s) masked: " + ", ".join(parts)


def invalid_behaviour_logprobs(logprobs: np.ndarray, floor: float = BEHAVIOUR_LOGPROB_FLOOR) -> np.ndarray:
    """True where a behaviour logprob is NaN, infinite or below `floor`."""
    values = np.asarray(logprobs, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(values) | (values < floor)


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
    values = call.logprobs[bad]
    low = values[np.isfinite(values)]
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
    )
    return dataclasses.replace(call, masked=bad), report
