"""The policy server refuses non-finite weights and keeps serving the previous ones (issue 28 item 2).

One reward of 1e200 once gave a checkpoint whose every tensor was NaN; the server reloaded it and every
chat request failed with a 500 afterwards. Real server, real tiny model, real folders on disk.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from spanrl.errors import ServingError
from spanrl.serving import SamplingParams

_PROMPT = [5, 6, 7]


def _answer(server) -> tuple[list[int], list[float]]:
    result = server.generate(_PROMPT, SamplingParams(max_tokens=4, temperature=0.0))
    completion = result.completions[0]
    return list(completion.token_ids), list(completion.logprobs)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_reload_of_non_finite_weights_is_refused_and_the_old_ones_served(served, tiny_model_dir, tmp_path, poison):
    server = served.server
    before = _answer(server)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 4] = poison
    folder = tmp_path / "diverged"
    model.save_pretrained(folder)
    with pytest.raises(ServingError,
                       match=r"model.layers.1.mlp.up_proj.weight is not finite .*previous weights are still served"):
        server.reload(folder)
    with pytest.raises(ServingError, match="is not finite"):
        server.reload(model.state_dict())
    with pytest.raises(ServingError, match="is not finite"):
        server.reload(model)
    assert server.version == 0
    after = _answer(server)
    assert after == before and all(torch.isfinite(torch.tensor(after[1])))
