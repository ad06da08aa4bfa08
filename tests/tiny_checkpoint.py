"""A tiny Hugging Face checkpoint made here, for llama.cpp's real converter and server: a Llama
config, random safetensors weights (with the index the model stage reads) and a byte-fallback BPE
tokenizer built with the `tokenizers` package, laid out like Llama-2's tokenizer.json (the form
llama.cpp's converter reads through gguf-py's LlamaHfVocab). No weights are downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LETTERS = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'"
WORDS = ("the", "of", "and", "to", "in", "is", "it", "that", "on", "for", "with", "as", "gpu", "peer")


def tokenizer(out: Path) -> int:
    """tokenizer.json and tokenizer_config.json; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in LETTERS:
        vocab.setdefault(ch, len(vocab))
    merges = []
    for w in WORDS:  # merge each word left to right: "▁t"+"h" ... then the whole word
        cur = "▁" + w[0]
        merges.append(("▁", w[0]))
        vocab.setdefault(cur, len(vocab))
        for ch in w[1:]:
            merges.append((cur, ch))
            cur += ch
            vocab.setdefault(cur, len(vocab))
    merges = list(dict.fromkeys(merges))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "model_max_length": 2048}))
    return len(vocab)


def make(out: Path, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, ffn: int = 128,
         seed: int = 0, context: int = 2048, distinct_layers: bool = True) -> Path:
    """The checkpoint in `out` (created): config.json, model.safetensors(.index.json), tokenizer. With
    distinct_layers False every layer holds the first layer's random values (made once: a checkpoint of
    several GB in seconds, for throughput, which does not care what the weights say)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    n_vocab = tokenizer(out)
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    t = {"model.embed_tokens.weight": w(n_vocab, hidden), "model.norm.weight": np.ones(hidden, np.float16),
         "lm_head.weight": w(n_vocab, hidden)}
    first: dict = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        if first and not distinct_layers:
            t.update({p + k: a for k, a in first.items()})
            continue
        t.update({p + "self_attn.q_proj.weight": w(hidden, hidden),
                  p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
                  p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
                  p + "self_attn.o_proj.weight": w(hidden, hidden),
                  p + "mlp.gate_proj.weight": w(ffn, hidden), p + "mlp.up_proj.weight": w(ffn, hidden),
                  p + "mlp.down_proj.weight": w(hidden, ffn),
                  p + "input_layernorm.weight": np.ones(hidden, np.float16),
                  p + "post_attention_layernorm.weight": np.ones(hidden, np.float16)})
        first = {k[len(p):]: a for k, a in t.items() if k.startswith(p)}
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(a.nbytes for a in t.values())},
         "weight_map": dict.fromkeys(t, "model.safetensors")}))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": n_vocab, "max_position_embeddings": context,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}))
    return out
