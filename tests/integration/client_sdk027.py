"""An SDK 0.27.0 client run (executed by the 0.27 venv's python, not by pytest).

    python client_sdk027.py BASE_URL API_KEY MODEL

SFT with pipelined steps, sampling (named and ephemeral sampler weights, prompt logprobs),
save_state and resume with and without optimizer (0.27 resumes through weights_info →
create_model → load_weights), and the archive download. Prints one JSON summary line and exits
non-zero on any mismatch.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import urllib.request

import tinker
from tinker import types

assert tinker.__version__ == "0.27.0", tinker.__version__
BASE_URL, API_KEY, MODEL = sys.argv[1:4]
ADAM = types.AdamParams(learning_rate=0.05)
PROMPT = types.ModelInput.from_ints([2, 3, 4, 5])


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": tokens[1:] + tokens[:1],
                                       "weights": [1.0] * len(tokens)})


DATA = [datum([2 + i, 7, 11 + i, 5]) for i in range(3)]


def step(tc: tinker.TrainingClient) -> float:
    fb = tc.forward_backward(DATA, "cross_entropy")
    opt = tc.optim_step(ADAM)
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    return loss


def forward(tc: tinker.TrainingClient) -> list[list[float]]:
    out = tc.forward(DATA, "cross_entropy").result()
    return [list(o["logprobs"].data) for o in out.loss_fn_outputs]


def main() -> None:
    sc = tinker.ServiceClient(base_url=BASE_URL, api_key=API_KEY)
    tc = sc.create_lora_training_client(base_model=MODEL, rank=4)
    losses = [step(tc) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    assert tc.get_info().model_data.model_name == MODEL

    named = tc.save_weights_for_sampler("s1").result().path
    sampler = sc.create_sampling_client(model_path=named)
    out = sampler.sample(PROMPT, 2, types.SamplingParams(max_tokens=4, seed=1),
                         include_prompt_logprobs=True).result()
    assert len(out.sequences) == 2 and out.prompt_logprobs[0] is None
    ephemeral = tc.save_weights_and_get_sampling_client(name="eph")
    assert ephemeral.compute_logprobs(PROMPT).result() == sampler.compute_logprobs(PROMPT).result()

    state = tc.save_state("c1").result().path
    step(tc)
    never_stopped = forward(tc)
    resumed = sc.create_training_client_from_state_with_optimizer(state)
    step(resumed)
    assert forward(resumed) == never_stopped, "resume with optimizer is exact"
    fresh = sc.create_training_client_from_state(state)
    step(fresh)
    assert forward(fresh) != never_stopped, "a fresh optimizer takes another step"

    rest = sc.create_rest_client()
    archive = rest.get_checkpoint_archive_url_from_tinker_path(state).result()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(archive.url, timeout=30) as response, tarfile.open(
            fileobj=io.BytesIO(response.read())) as tar:
        members = tar.getnames()
    assert {"adapter_config.json", "adapter_model.safetensors", "checkpoint_complete"} <= set(
        members), members
    print(json.dumps({"ok": True, "losses": losses, "state": state, "archive": members}))


if __name__ == "__main__":
    main()
