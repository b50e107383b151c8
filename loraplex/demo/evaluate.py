"""Pass rates of a sampling client: sample completions per prompt, grade them safely."""

from __future__ import annotations

from dataclasses import dataclass

import tinker

from loraplex.demo.clamp_task import HELDOUT_FIXTURES, TRAIN_FIXTURES, ClampPrompt
from loraplex.demo.grader import reward
from loraplex.demo.rendering import Renderer


@dataclass(frozen=True)
class Completion:
    """One sampled completion and its grades."""

    prompt_id: int
    tokens: list[int]
    logprobs: list[float]
    text: str
    reward: float
    heldout_reward: float


def seeded_for(params: tinker.SamplingParams, prompt_id: int) -> tinker.SamplingParams:
    """A per-prompt seed: one shared seed would give every prompt's i-th sample the same random
    stream, correlating the groups (and the pass-rate estimate) across prompts."""
    base = 0 if params.seed is None else params.seed
    return params.model_copy(update={"seed": base * 1_000_003 + prompt_id})


def sample_group(
    sampler: tinker.SamplingClient, renderer: Renderer, prompt: ClampPrompt,
    num_samples: int, params: tinker.SamplingParams,
) -> list[Completion]:
    """Sample `num_samples` completions of one prompt (one request, shared prompt KV)."""
    tokens = renderer.prompt_tokens(prompt.text)
    response = sampler.sample(tinker.ModelInput.from_ints(tokens), num_samples,
                              seeded_for(params, prompt.prompt_id)).result()
    out = []
    for seq in response.sequences:
        text = renderer.decode(list(seq.tokens))
        out.append(Completion(
            prompt.prompt_id, list(seq.tokens), [float(x) for x in seq.logprobs or []], text,
            reward(text, TRAIN_FIXTURES), reward(text, HELDOUT_FIXTURES),
        ))
    return out


def pass_rates(
    sampler: tinker.SamplingClient, renderer: Renderer, prompts: tuple[ClampPrompt, ...],
    samples_per_prompt: int, params: tinker.SamplingParams,
) -> tuple[float, float]:
    """(train-fixture pass rate, held-out pass rate) over all prompts, submitted concurrently."""
    futures = []
    for prompt in prompts:
        tokens = tinker.ModelInput.from_ints(renderer.prompt_tokens(prompt.text))
        futures.append(sampler.sample(tokens, samples_per_prompt,
                                      seeded_for(params, prompt.prompt_id)))
    train, heldout, total = 0.0, 0.0, 0
    for future in futures:
        for seq in future.result().sequences:
            text = renderer.decode(list(seq.tokens))
            train += reward(text, TRAIN_FIXTURES)
            heldout += reward(text, HELDOUT_FIXTURES)
            total += 1
    return train / total, heldout / total
