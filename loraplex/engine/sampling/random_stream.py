"""Counter-based random numbers: the uniform for token ``i`` of a sample is a pure function of
(request seed, sample index, i).

No generator state lives anywhere, so a sequence's draws cannot depend on what else shares its
batch, on preemption and recompute, or on the order sequences are processed; the G samples of
one request get distinct streams; the same seed replays the same tokens. The mixer is
SplitMix64's finaliser (Steele, Lea & Flood 2014), which passes BigCrush as a counter hash.
"""

from __future__ import annotations

import secrets

import numpy as np

_MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64: a bijective 64-bit avalanche mix."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stream_key(seed: int | None, sample_index: int) -> int:
    """The key of one sample's stream; a fresh random seed when ``seed`` is None."""
    base = secrets.randbits(64) if seed is None else seed & _MASK
    return mix64(mix64(base) ^ mix64(sample_index & _MASK))


def uniform(key: int, counter: int) -> float:
    """Draw number ``counter`` of stream ``key``: a double in [0, 1) with 53 random bits."""
    return (mix64(key ^ mix64(counter)) >> 11) * (1.0 / (1 << 53))


#: The sample index of a request's prompt-alternative draws (`stream_key(seed,
#: PROMPT_ALT_STREAM)`): no sample has it, so they never share a stream with a completion.
PROMPT_ALT_STREAM = _MASK


def uniforms(key: int, first: int, count: int) -> np.ndarray:
    """Draws ``first .. first + count`` of stream ``key`` (fp64 ``[count]``): the same bits as
    `uniform` for each counter, computed with wrapping uint64 arithmetic."""
    counters = np.arange(first, first + count, dtype=np.uint64)
    mixed = _mix64_array(np.uint64(key) ^ _mix64_array(counters))
    return (mixed >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _mix64_array(x: np.ndarray) -> np.ndarray:
    """`mix64` elementwise (uint64 multiplication wraps modulo 2^64, as ``& _MASK`` does)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
