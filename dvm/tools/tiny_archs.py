"""The Hugging Face architectures built tiny for `dvm verify archs` (and for surveys of them): each
class from its default config with TINY's sizes (hidden 64, vocab 256; two layers, the first and,
in a hybrid, the first of another kind), refused (Skip) where the config, or the model's size,
says it cannot be so built.
"""
from __future__ import annotations

from functools import partial

MAX_PARAMS = 30_000_000              # bigger tiny models are skipped (a config that ignores the sizes)

# config attributes set where a config has them (lists and dicts are left alone)
TINY = dict(hidden_size=64, n_embd=64, d_model=64, dim=64, num_hidden_layers=2, n_layer=2, num_layers=2,
            n_layers=2, decoder_layers=2, encoder_layers=2, num_attention_heads=4, n_head=4, n_heads=4,
            decoder_attention_heads=4, encoder_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            ffn_dim=128, decoder_ffn_dim=128, encoder_ffn_dim=128, n_inner=128, vocab_size=256,
            max_position_embeddings=256, n_positions=256, head_dim=16, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, num_experts=4, n_routed_experts=4, num_local_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, rotary_dim=8, partial_rotary_factor=0.5,
            use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
            tie_word_embeddings=True, embedding_size=64, intra_bottleneck_size=32,
            true_hidden_size=32, vocab_size_per_layer_input=256, hidden_size_per_layer_input=16,
            entity_vocab_size=256)
VOCAB = TINY["vocab_size"]


class Skip(Exception):
    """Not DVM's to answer: the config, eager or the model's size."""


TOO_BIG = "too big"   # a Skip's detail starts so where the model is over MAX_PARAMS


def _try_set(cfg, key: str, value) -> None:
    """cfg.key = value where the config takes it (some validate their fields on assignment)."""
    try:
        setattr(cfg, key, value)
    except Exception:
        pass


_UNSAID = object()   # _field: the config has no such field, or will not say (a per-layer one)
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def _field(cfg, key: str):
    try:
        return getattr(cfg, key, _UNSAID)
    except Exception:   # (transformers' AmbiguousGlobalPerLayerAttributeError: a field set per layer)
        return _UNSAID


def kept_layers(layer_types, layers: int) -> list[int]:
    """The two layers a tiny model keeps: the first, and the first of another kind in layer_types
    (a hybrid's attention and its other mixer, sliding and full attention), else the second."""
    if isinstance(layer_types, list) and len(layer_types) == layers:
        return [0, next((i for i, t in enumerate(layer_types) if t != layer_types[0]), 1)]
    return [0, 1]


def _per_layer(table: dict, keep: list[int]) -> dict:
    """A per_layer_config ({layer index as text: its fields}) for the kept layers, renumbered,
    with TINY's sizes."""
    out = {}
    for key, fields in table.items():
        if key.isdigit() and int(key) in keep and isinstance(fields, dict):
            out[str(keep.index(int(key))).zfill(len(key))] = {k: TINY.get(k, v) for k, v in fields.items()}
    return out


def _layout(cfg) -> tuple:
    """(the config holding the text model's fields, its number of layers, kept_layers)."""
    text = _field(cfg, "text_config")
    sub = text if text not in (_UNSAID, None) and not isinstance(text, dict) else cfg
    layers = next((n for n in map(partial(_field, sub), _LAYER_COUNTS) if isinstance(n, int)), 0)
    return sub, layers, kept_layers(_field(sub, "layer_types"), layers)


def mixes_layers(name: str) -> bool:
    """Whether the tiny model of class `name` keeps a second layer of another kind."""
    import transformers
    try:
        return _layout(getattr(transformers, name).config_class())[2] != [0, 1]
    except Exception:
        return False


_STACKS = ("encoder", "decoder")


def _shrink(sub, layers: int, keep: list[int]) -> list[str]:
    """Sets TINY's sizes in the config `sub` where it has the field, and cuts its per-layer lists
    to the layers `keep`; returns the fields it will not say (set per layer) for the caller to set."""
    per_layer = []
    for k, v in TINY.items():
        now = _field(sub, k)
        if now is _UNSAID and k in vars(sub):
            per_layer.append(k)
        elif now is not _UNSAID and not isinstance(now, (list, dict)):
            _try_set(sub, k, v)
    for k, v in list(vars(sub).items()):
        if isinstance(v, list) and layers > 2 and len(v) == layers:
            _try_set(sub, k, [v[i] for i in keep])
    return per_layer


def tiny_model(name: str, mixed: bool = True):
    """The class `name` from its default config with TINY's sizes (per-layer lists and fields cut
    to two layers: kept_layers, or the first two where not mixed)."""
    import torch
    import transformers
    cls = getattr(transformers, name)
    try:
        cfg = cls.config_class()
        sub, layers, keep = _layout(cfg)
        keep = keep if mixed else [0, 1]
        per_layer = _shrink(sub, layers, keep)
        for part in _STACKS:   # an encoder-decoder whose halves have configs of their own
            half = _field(cfg, part)
            if half is not _UNSAID and hasattr(half, "to_dict"):
                _shrink(*_layout(half))
        fields = {k: v for k, v in cfg.to_dict().items()
                  if not k.startswith("_") and k not in ("transformers_version", "architectures")}
        target = fields["text_config"] if sub is not cfg else fields
        target.update({k: TINY[k] for k in per_layer})
        if isinstance(target.get("per_layer_config"), dict):
            target["per_layer_config"] = _per_layer(target["per_layer_config"], keep)
        config = cls.config_class(**fields)
    except Exception as e:
        raise Skip(f"config refused: {type(e).__name__}: {str(e)[:160]}") from None
    _refuse_big(_meta_parameters(cls, config))
    try:
        torch.manual_seed(0)
        model = cls(config).eval()
    except Exception as e:
        raise Skip(f"config refused: {type(e).__name__}: {str(e)[:160]}") from None
    _refuse_big(sum(p.numel() for p in model.parameters()))
    return model


def _meta_parameters(cls, config) -> int:
    """The parameters `cls(config)` would hold, counted on the meta device (nothing allocated: a
    config whose sub-configs keep their full-size defaults would fill the memory); 0 where the
    model cannot be built there (it is counted again once built)."""
    import torch
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in cls(config).parameters())
    except Exception:
        return 0


def _refuse_big(parameters: int) -> None:
    if parameters > MAX_PARAMS:
        raise Skip(f"{TOO_BIG}: {parameters:,} parameters")
