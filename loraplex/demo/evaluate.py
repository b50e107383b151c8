"""Pass rates of a sampling client: sample completions per prompt, grade them safely."""

from __future__ import annotations

from dataclasses import dataclass

import tinker

from loraplex.demo.rendering import Renderer
from loraplex.demo.task import DemoTask, TaskPrompt


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


def sample_groups(
    sampler: tinker.SamplingClient, renderer: Renderer, task: DemoTask,
    prompts: tuple[TaskPrompt, ...], num_samples: int, params: tinker.SamplingParams,
) -> list[list[Completion]]:
    """`num_samples` graded completions of each prompt: one request per prompt (shared prompt
    KV), all submitted before any is awaited so the server batches them together."""
    futures = [
        sampler.sample(tinker.ModelInput.from_ints(renderer.prompt_tokens(p.messages)),
                       num_samples, seeded_for(params, p.prompt_id))
        for p in prompts
    ]
    groups = []
    for prompt, future in zip(prompts, futures, strict=True):
        group = []
        for seq in future.result().sequences:
            text = renderer.decode(list(seq.tokens))
            score, heldout = task.grade(prompt, text)
            group.append(Completion(prompt.prompt_id, list(seq.tokens),
                                    [float(x) for x in seq.logprobs or []], text, score, heldout))
        groups.append(group)
    return groups


def pass_rates(
    sampler: tinker.SamplingClient, renderer: Renderer, task: DemoTask,
    samples_per_prompt: int, params: tinker.SamplingParams,
) -> tuple[float, float]:
    """(reward, held-out reward) means over the task's evaluation prompts — for clamp the
    train-fixture and held-out-fixture pass rates."""
    groups = sample_groups(sampler, renderer, task, task.eval_prompts, samples_per_prompt, params)
    done = [c for g in groups for c in g]
    return (sum(c.reward for c in done) / len(done),
            sum(c.heldout_reward for c in done) / len(done))
