"""Build a tiny random-weight Llama checkpoint with its own tokenizer, offline.

Why: end-to-end tests must really serve with vLLM, but no model can be
downloaded here. A deterministic 2-layer Llama (head_dim 64, which the CPU
attention accepts) loads in seconds. The architecture name in ``config.json`` is
a parameter so the same weights can pose as a plugin's architecture for a
stand-in plugin class.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# Bump when the recipe changes so that cached builds are redone.
RECIPE_VERSION = 1
MARKER = ".vllm-patchkit-tiny-model.json"
SEED = 1234
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
TARGET_VOCAB = 512

HIDDEN = 128
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 1024

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A patch that reads as applied but never runs is worse than no patch.",
    "vLLM serves large language models with paged attention.",
    "Every process loads the general plugins once at start-up.",
    "The scheduler allocates blocks for each request in the batch.",
    "Prefix caching lets a later request reuse blocks of an earlier one.",
    "A block is full when it holds block size tokens.",
    "The engine core runs the scheduler and the model executor.",
    "The API server accepts completions over HTTP.",
    "Tokens are sampled one step at a time during decode.",
    "Prefill computes the prompt tokens before the first decode step.",
    "The key value cache stores attention keys and values per layer.",
    "Manifests pin the fingerprint of every upstream target.",
    "A wrapper must forward positional and keyword arguments verbatim.",
    "Coverage counters report how often each wrapper was called.",
    "The loader records applied, skipped, failed or refused per patch.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 128 256 512 1024 appear too.",
    "Once upon a time there was a small model on a small machine.",
    "It had two layers, two heads and a vocabulary of a few hundred pieces.",
    "Its weights were random, so its answers were charmingly random as well.",
    "Still, it loaded quickly and answered every request it was sent.",
    "Hello, world! How are you today? I am fine, thank you.",
    "What is the capital of France? Paris is the capital of France.",
    "Python is a programming language that is easy to read.",
    "def main(): print('hello') return 0",
    "import os, sys, json; from pathlib import Path",
    "The weather is sunny with a light breeze from the west.",
    "She sells sea shells by the sea shore.",
    "Peter Piper picked a peck of pickled peppers.",
    "All work and no play makes Jack a dull boy.",
    "To be or not to be, that is the question.",
    "In the beginning there was nothing but a tokenizer and a seed.",
    "Red, green, blue, yellow, orange, purple, black and white.",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.",
    "January February March April May June July August September.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "The cat sat on the mat and the dog slept by the door.",
    "Fast tests give quick feedback; slow tests catch real bugs.",
    "A request is preempted when the pool runs out of free blocks.",
    "Speculative decoding proposes tokens that the target model verifies.",
)


def _is_complete(out_dir: Path, architecture: str) -> bool:
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("recipe") != RECIPE_VERSION or marker.get("architecture") != architecture:
        return False
    return all((out_dir / name).is_file() for name in marker.get("files", ()))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def _random_weights(vocab: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(SEED)

    def normal(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).contiguous()

    q_out, kv_out = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    tensors = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_out, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN, q_out)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        tensors[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    tensors["model.norm.weight"] = torch.ones(HIDDEN)
    tensors["lm_head.weight"] = normal(vocab, HIDDEN)
    return tensors


def build_tiny_model(out_dir: Path, architecture: str = "LlamaForCausalLM") -> Path:
    """Write the tiny checkpoint and tokenizer to ``out_dir``; return its path.

    Deterministic (fixed seed) and idempotent: a complete build of the same
    recipe and architecture is reused as is.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if _is_complete(out_dir, architecture):
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).unlink(missing_ok=True)

    from safetensors.torch import save

    tok = _train_tokenizer()
    vocab = tok.get_vocab_size()
    bos, eos, pad = (tok.token_to_id(t) for t in SPECIAL_TOKENS)
    config = {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": True,
    }
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    generation = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    files = {
        "model.safetensors": save(_random_weights(vocab), metadata={"format": "pt"}),
        "tokenizer.json": tok.to_str(pretty=True).encode(),
        "tokenizer_config.json": _json_bytes(tokenizer_config),
        "special_tokens_map.json": _json_bytes(special),
        "generation_config.json": _json_bytes(generation),
        "config.json": _json_bytes(config),
    }
    for name, data in files.items():
        _write_atomic(out_dir / name, data)
    marker = {"recipe": RECIPE_VERSION, "architecture": architecture, "files": sorted(files)}
    _write_atomic(out_dir / MARKER, _json_bytes(marker))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--architecture", default="LlamaForCausalLM")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out_dir, args.architecture))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
