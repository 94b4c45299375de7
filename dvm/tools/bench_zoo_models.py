"""The model zoo of `dvm bench models --zoo`: `transformers` architectures built from small configs
with random weights (no downloads), each with the inputs its forward takes.

Every entry covers a feature the two original benchmark models (Llama, Qwen2-MoE) do not: learned
positions, a padding mask in an encoder, an encoder-decoder with relative position buckets, MoE
routing, ALiBi, partial rotary, soft-capping, sliding windows, q/k norms, parallel blocks,
multi-query attention. Two "realistic width" configs (hidden 1024) of Llama and Qwen2-MoE show
the matmul-bound end. A model's `inputs(b, L, seed)` returns the keyword arguments of its forward:
token ids, plus an attention mask whose last rows are padded for the encoders (batch > 1), plus
decoder token ids for the encoder-decoders.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

VOCAB = 256
MAX_POS = 1024          # the zoo's longest length (learned position tables need that many rows)
SMALL = dict(hidden=128, inter=256, layers=2, heads=4, kv=2)


@dataclass(frozen=True)
class ZooModel:
    name: str
    what: str                  # the architecture feature it brings
    build: Callable            # () -> an nn.Module (seeded random init)
    encoder: bool = False      # takes a padding attention mask
    seq2seq: bool = False      # takes decoder_input_ids


def _make(cls_name: str, cfg_name: str, **cfg):
    def build():
        import torch
        import transformers
        config = getattr(transformers, cfg_name)(**cfg)
        config.use_cache = False
        torch.manual_seed(0)
        return getattr(transformers, cls_name)(config).eval()
    return build


_S = SMALL
_ROPE = dict(hidden_size=_S["hidden"], intermediate_size=_S["inter"], num_hidden_layers=_S["layers"],
             num_attention_heads=_S["heads"], num_key_value_heads=_S["kv"], vocab_size=VOCAB,
             max_position_embeddings=2 * MAX_POS)

def _bench_models(name: str):
    """One of `dvm bench models`' own two models (bench_models.MODELS), seeded 0."""
    def build():
        from .bench_models import MODELS
        return MODELS[name][0](0).eval()
    return build


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("llama", "Llama (dvm bench models' own): RoPE, GQA, SwiGLU, RMSNorm", _bench_models("llama")),
    ZooModel("qwen2_moe", "Qwen2-MoE (dvm bench models' own): 4 experts top-2 + shared expert",
             _bench_models("qwen2_moe")),
    ZooModel("gpt2", "GPT-2: learned positions, Conv1D (addmm), gelu_tanh, LayerNorm",
             _make("GPT2LMHeadModel", "GPT2Config", n_embd=_S["hidden"], n_layer=_S["layers"], n_head=_S["heads"],
                   n_positions=MAX_POS, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)),
    ZooModel("bert", "BERT encoder: padding mask, token types, absolute positions, post-LayerNorm, gelu",
             _make("BertForMaskedLM", "BertConfig", hidden_size=_S["hidden"], intermediate_size=_S["inter"],
                   num_hidden_layers=_S["layers"], num_attention_heads=_S["heads"], vocab_size=VOCAB,
                   max_position_embeddings=MAX_POS), encoder=True),
    ZooModel("roberta", "RoBERTa encoder: positions from a cumsum of the non-pad tokens, padding mask",
             _make("RobertaForMaskedLM", "RobertaConfig", hidden_size=_S["hidden"], intermediate_size=_S["inter"],
                   num_hidden_layers=_S["layers"], num_attention_heads=_S["heads"], vocab_size=VOCAB,
                   max_position_embeddings=MAX_POS + 2, pad_token_id=1), encoder=True),
    ZooModel("t5", "T5 encoder-decoder: relative position buckets, RMSNorm without mean, cross-attention",
             _make("T5ForConditionalGeneration", "T5Config", d_model=_S["hidden"], d_ff=_S["inter"], d_kv=32,
                   num_layers=_S["layers"], num_decoder_layers=_S["layers"], num_heads=_S["heads"],
                   vocab_size=VOCAB, decoder_start_token_id=0), encoder=True, seq2seq=True),
    ZooModel("bart", "BART encoder-decoder: learned positions (offset 2), scaled embeddings, cross-attention",
             _make("BartForConditionalGeneration", "BartConfig", d_model=_S["hidden"], encoder_layers=_S["layers"],
                   decoder_layers=_S["layers"], encoder_attention_heads=_S["heads"],
                   decoder_attention_heads=_S["heads"], encoder_ffn_dim=_S["inter"], decoder_ffn_dim=_S["inter"],
                   vocab_size=VOCAB, max_position_embeddings=MAX_POS), encoder=True, seq2seq=True),
    ZooModel("mixtral", "Mixtral: sparse MoE (8 experts, top-2), RoPE, GQA",
             _make("MixtralForCausalLM", "MixtralConfig", **_ROPE, num_local_experts=8, num_experts_per_tok=2)),
    ZooModel("bloom", "BLOOM: ALiBi, embedding LayerNorm, fused QKV",
             _make("BloomForCausalLM", "BloomConfig", hidden_size=_S["hidden"], n_layer=_S["layers"],
                   n_head=_S["heads"], vocab_size=VOCAB)),
    ZooModel("gpt_neox", "GPT-NeoX: partial rotary (25 %), parallel residual",
             _make("GPTNeoXForCausalLM", "GPTNeoXConfig", hidden_size=_S["hidden"], intermediate_size=_S["inter"],
                   num_hidden_layers=_S["layers"], num_attention_heads=_S["heads"], vocab_size=VOCAB,
                   rotary_pct=0.25, max_position_embeddings=2 * MAX_POS)),
    ZooModel("phi", "Phi: partial rotary (50 %), parallel attention + MLP, gelu_new",
             _make("PhiForCausalLM", "PhiConfig", hidden_size=_S["hidden"], intermediate_size=_S["inter"],
                   num_hidden_layers=_S["layers"], num_attention_heads=_S["heads"], vocab_size=VOCAB,
                   partial_rotary_factor=0.5, max_position_embeddings=2 * MAX_POS)),
    ZooModel("gemma2", "Gemma 2: attention and final logit soft-capping, sliding window, GeGLU, (1 + w) RMSNorm",
             _make("Gemma2ForCausalLM", "Gemma2Config", **_ROPE, head_dim=32, sliding_window=128,
                   attn_implementation="eager")),
    ZooModel("opt", "OPT: learned positions from a cumsum of the attention mask, ReLU MLP",
             _make("OPTForCausalLM", "OPTConfig", hidden_size=_S["hidden"], ffn_dim=_S["inter"],
                   num_hidden_layers=_S["layers"], num_attention_heads=_S["heads"], vocab_size=VOCAB,
                   word_embed_proj_dim=_S["hidden"], max_position_embeddings=MAX_POS)),
    ZooModel("qwen3", "Qwen3: q/k RMSNorm per head, RoPE, GQA",
             _make("Qwen3ForCausalLM", "Qwen3Config", **_ROPE, head_dim=32)),
    ZooModel("mistral", "Mistral: sliding-window causal mask (window 128), RoPE, GQA",
             _make("MistralForCausalLM", "MistralConfig", **_ROPE, sliding_window=128)),
    ZooModel("falcon", "Falcon: multi-query attention, parallel attention + MLP, RoPE",
             _make("FalconForCausalLM", "FalconConfig", hidden_size=_S["hidden"], num_hidden_layers=_S["layers"],
                   num_attention_heads=_S["heads"], vocab_size=VOCAB, multi_query=True, parallel_attn=True,
                   new_decoder_architecture=False, alibi=False, max_position_embeddings=2 * MAX_POS)),
    ZooModel("llama_wide", "Llama at realistic width: hidden 1024, MLP 2816, 16 heads (4 KV), 2 layers",
             _make("LlamaForCausalLM", "LlamaConfig", hidden_size=1024, intermediate_size=2816,
                   num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4, vocab_size=VOCAB,
                   max_position_embeddings=2 * MAX_POS)),
    ZooModel("qwen2_moe_wide", "Qwen2-MoE at realistic width: hidden 1024, 8 experts (top-2, MLP 512) + "
                               "shared expert 1024, 16 heads (4 KV), 2 layers",
             _make("Qwen2MoeForCausalLM", "Qwen2MoeConfig", hidden_size=1024, intermediate_size=2816,
                   moe_intermediate_size=512, shared_expert_intermediate_size=1024, num_hidden_layers=2,
                   num_attention_heads=16, num_key_value_heads=4, vocab_size=VOCAB, num_experts=8,
                   num_experts_per_tok=2, max_position_embeddings=2 * MAX_POS)),
)}
# a few minutes in all: a decoder, an encoder with a padding mask, an encoder-decoder
QUICK = ("gpt2", "bert", "t5")


def inputs(model: ZooModel, b: int, L: int, seed: int = 0) -> dict:
    """The forward's keyword arguments at batch b, length L: random token ids (never the pad id 1
    of RoBERTa); for an encoder, an attention mask where row i > 0 has its last i * L // (2 b)
    positions padded (row 0 full); for an encoder-decoder, decoder ids of length max(1, L // 2)."""
    import torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + b * 7919 + L)
    ids = torch.randint(2, VOCAB, (b, L), generator=g)
    kw = {"input_ids": ids}
    if model.encoder:
        mask = torch.ones(b, L, dtype=torch.long)
        for i in range(1, b):
            pad = i * L // (2 * b)
            if pad:
                mask[i, L - pad:] = 0
        kw["attention_mask"] = mask
    if model.seq2seq:
        kw["decoder_input_ids"] = torch.randint(2, VOCAB, (b, max(1, L // 2)), generator=g)
    return kw


def first_output(out):
    """The forward's main tensor: logits (or the first tensor of a model output / tuple)."""
    logits = getattr(out, "logits", None)
    if logits is not None:
        return logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out[0] if hasattr(out, "__getitem__") else out
