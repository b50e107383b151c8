"""Counter-based random numbers: the uniform for token ``i`` of a sample is a pure function of
(request seed, sample index, i).

No generator state lives anywhere, so a sequence's draws cannot depend on what else shares its
batch, on preemption and recompute, or on the order sequences are processed; the G samples of
one request get distinct streams; the same seed replays the same tokens. The mixer is
SplitMix64's finaliser (Steele, Lea & Flood 2014), which passes BigCrush as a counter hash.
"""

from __future__ import annotations

import secrets

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
