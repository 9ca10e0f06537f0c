"""mhalab.generation: greedy decoding from a scripted step function, with and without stop tokens."""

import pytest
import torch
from small_models import V

from mhalab.generation import generate_tokens


def test_generation_stops_at_a_stop_token():
    def step(ids):  # logits that make row 0 say 5, 6, 2, 7, ... and row 1 say 3, 3, 3, ...
        script = torch.tensor([[5, 6, 2, 7, 7, 7, 7], [3, 3, 3, 3, 3, 3, 3]])
        return torch.nn.functional.one_hot(script[:, ids.size(1) - 1 : ids.size(1)], V).float()  # [B, 1, V]

    prompt = torch.zeros(2, 1, dtype=torch.long)
    full = generate_tokens(step, prompt, 6, cached=False)
    assert full[0].tolist() == [0, 5, 6, 2, 7, 7, 7]
    stopped = generate_tokens(step, prompt, 6, cached=False, stop=[2])
    assert stopped[0].tolist() == [0, 5, 6, 2, 2, 2, 2]  # row 0 is done: it repeats its stop token
    assert stopped[1].tolist() == full[1].tolist()  # row 1 never stops, so all 6 steps run
    both = generate_tokens(step, prompt, 6, cached=False, stop=(2, 3))
    assert both.tolist() == [[0, 5, 6, 2], [0, 3, 3, 3]]  # row 1 stopped first and repeats its stop token
    with pytest.raises(TypeError, match="stop token id must be an int"):
        generate_tokens(step, prompt, 2, stop=[2.0])
