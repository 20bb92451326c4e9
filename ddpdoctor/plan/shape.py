"""A decoder-only transformer's shape, from a Hugging Face-style config.json or from a parameter count.

Pure functions over plain data: the config is read (bounded) by `plan.inputs`; nothing here imports or
runs model code. The counts follow the modules transformers builds for each family (docs/plan.md):
Llama/Mistral/Qwen (gated MLP, RMSNorm, optional q/k/v biases) and GPT-2 (fused qkv, biased linears,
LayerNorm, learned positions).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

# Families whose MLP is gated (gate, up, down projections) and whose norms are RMSNorm (weight only).
GATED_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2")
# transformers' default for tie_word_embeddings is True (PretrainedConfig), but these configs set False.
UNTIED_BY_DEFAULT = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
# The aspect ratio (hidden / layers) of most published dense models: Llama-2 7B/13B and GPT-3 175B are 128.
ASPECT_RATIO = 128
HEAD_DIM = 128
DEFAULT_VOCAB = 32000
MAX_DIM = 10**7  # no real hidden size, vocabulary or layer count is near this: a typo or a hostile file


@dataclass(frozen=True)
class ModelShape:
    """What the memory arithmetic needs. `estimated` is True when derived from a bare parameter count."""

    params: int  # total trainable parameters (shared/tied tensors counted once)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    largest_layer: int  # DeepSpeed's largest_layer_params: the largest module's own parameters
    block_params: int  # one transformer block (an FSDP unit under the usual per-block auto-wrap)
    root_params: int  # embeddings, positions, final norm and untied head (FSDP's root unit)
    family: str = "transformer"
    estimated: bool = False
    experts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_key(cfg: Mapping[str, Any], names: tuple[str, ...], what: str) -> Optional[int]:
    for name in names:
        if name in cfg and cfg[name] is not None:
            value = cfg[name]
            # bool is an int subclass: `"hidden_size": true` is garbage, not 1.
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM:
                raise ValueError(f"config key {name!r} ({what}) must be a positive integer, got {value!r}")
            return value
    return None


def _require(cfg: Mapping[str, Any], names: tuple[str, ...], what: str) -> int:
    value = _int_key(cfg, names, what)
    if value is None:
        raise ValueError(f"config has no {what} (looked for {', '.join(names)})")
    return value


def _flag(cfg: Mapping[str, Any], name: str, default: bool) -> bool:
    value = cfg.get(name, default)
    return value if isinstance(value, bool) else default


def shape_from_config(cfg: Mapping[str, Any]) -> ModelShape:
    """Count the parameters of the model a config describes. ValueError for a config we cannot count."""
    if isinstance(cfg.get("text_config"), Mapping) and "hidden_size" not in cfg:
        cfg = cfg["text_config"]  # multimodal wrappers: the language model is what trains here
    family = str(cfg.get("model_type") or "").lower() or "transformer"
    h = _require(cfg, ("hidden_size", "n_embd", "d_model"), "hidden size")
    n_layers = _require(cfg, ("num_hidden_layers", "n_layer", "num_layers"), "layer count")
    heads = _require(cfg, ("num_attention_heads", "n_head", "num_heads"), "attention head count")
    vocab = _require(cfg, ("vocab_size",), "vocabulary size")
    kv = _int_key(cfg, ("num_key_value_heads", "num_kv_heads"), "key/value head count")
    if kv is None:
        kv = 1 if cfg.get("multi_query") is True else heads
    head_dim = _int_key(cfg, ("head_dim",), "head dimension") or h // heads
    if head_dim < 1:
        raise ValueError(f"config: hidden size {h} is smaller than the {heads} attention heads")
    if heads % kv:
        raise ValueError(f"config: {heads} attention heads cannot be grouped over {kv} key/value heads")
    gated = family in GATED_FAMILIES or (
        family not in ("gpt2",) and str(cfg.get("hidden_act", "")).lower() in ("silu", "swiglu")
    )
    gpt2_style = family == "gpt2" or ("n_embd" in cfg and not gated)
    inner = _int_key(cfg, ("intermediate_size", "n_inner", "ffn_dim"), "intermediate size") or 4 * h
    experts = _int_key(cfg, ("num_local_experts", "num_experts"), "expert count") or 1
    moe_inner = _int_key(cfg, ("moe_intermediate_size",), "expert intermediate size") or inner
    tied = _flag(cfg, "tie_word_embeddings", family not in UNTIED_BY_DEFAULT)

    q_out, kv_out = heads * head_dim, kv * head_dim
    if gpt2_style:
        # GPT-2: c_attn (h x 3h + 3h), c_proj (h x h + h), c_fc (h x 4h + 4h), c_proj (4h x h + h), 2 LayerNorms.
        attn = h * 3 * h + 3 * h + h * h + h
        mlp = h * inner + inner + inner * h + h
        norms = 2 * 2 * h
        final_norm = 2 * h
        positions = (_int_key(cfg, ("n_positions", "max_position_embeddings"), "positions") or 1024) * h
        largest_in_block = max(h * 3 * h + 3 * h, h * inner + inner, inner * h + h)
    else:
        qkv_bias = family.startswith("qwen2") or _flag(cfg, "attention_bias", False)
        attn = h * q_out + 2 * h * kv_out + q_out * h
        if qkv_bias:
            attn += q_out + 2 * kv_out
        if _flag(cfg, "attention_bias", False):
            attn += h  # o_proj bias (Llama's attention_bias covers all four projections)
        if family.startswith("qwen3"):
            attn += 2 * head_dim  # q_norm and k_norm
        matrices = 3 if gated else 2
        expert_mlp = matrices * h * moe_inner + (matrices * moe_inner + h if _flag(cfg, "mlp_bias", False) else 0)
        mlp = expert_mlp * experts + (h * experts if experts > 1 else 0)  # + the router
        shared = _int_key(cfg, ("shared_expert_intermediate_size",), "shared expert size")
        if shared and experts > 1:
            mlp += matrices * h * shared + h  # Qwen-MoE's always-on shared expert and its gate
        norms = 2 * h
        final_norm = h
        positions = 0
        # The largest single Linear of a block: q_proj or one MLP projection (each expert is its own).
        largest_in_block = max(h * q_out, h * moe_inner)
    block = attn + mlp + norms
    embed = vocab * h
    head = 0 if tied else vocab * h
    root = embed + positions + final_norm + head
    total = n_layers * block + root
    return ModelShape(
        params=total,
        hidden=h,
        layers=n_layers,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        intermediate=inner,
        vocab=vocab,
        tied=tied,
        largest_layer=max(embed, head, positions, largest_in_block),
        block_params=block,
        root_params=root,
        family=family,
        estimated=False,
        experts=experts,
    )


def estimate_shape(params: int, vocab: int = DEFAULT_VOCAB) -> ModelShape:
    """A dense Llama-like shape for a bare parameter count (hidden/layers = 128, head_dim 128).

    12·L·h² parameters in the blocks (Transformer Math 101; Kaplan et al.) with h = 128·L gives
    h = (128·P/12)^(1/3). Only activations and the ZeRO-3/FSDP gather buffers depend on the shape; the
    model-state arithmetic uses the count as given.
    """
    h = max(HEAD_DIM, round((ASPECT_RATIO * params / 12) ** (1 / 3) / HEAD_DIM) * HEAD_DIM)
    if h >= 8 * HEAD_DIM:
        # Head counts of published models are multiples of 8, so tensor parallel up to 8 divides them.
        h = round(h / (8 * HEAD_DIM)) * 8 * HEAD_DIM
    n_layers = max(1, round((params - 2 * vocab * h) / (12 * h * h))) if params > 2 * vocab * h else 1
    heads = max(1, h // HEAD_DIM)
    embed = vocab * h
    block = max(1, (params - 2 * embed) // n_layers) if params > 2 * embed else max(1, params // n_layers)
    return ModelShape(
        params=params,
        hidden=h,
        layers=n_layers,
        heads=heads,
        kv_heads=heads,
        head_dim=HEAD_DIM,
        intermediate=4 * h,
        vocab=vocab,
        tied=False,
        largest_layer=min(params, max(embed, 4 * h * h)),
        block_params=block,
        root_params=min(params, 2 * embed),
        family="estimated",
        estimated=True,
    )
