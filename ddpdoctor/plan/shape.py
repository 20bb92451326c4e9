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
GATED_FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "deepseek_v2", "deepseek_v3",
)
# transformers' default for tie_word_embeddings is True (PretrainedConfig), but these configs set False.
UNTIED_BY_DEFAULT = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
)
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
    # What activations depend on (plan.memory.activation_bytes): the implementation transformers builds.
    experts_per_token: int = 1  # top-k routing
    moe_intermediate: int = 0  # one expert's width (0: dense)
    moe_layers: int = 0  # layers whose MLP is routed experts
    shared_intermediate: int = 0  # always-on shared experts' total width
    positions: int = 0  # learned position embeddings (GPT-2)
    norm: str = "rms"  # rms (HF RMSNorm upcasts to fp32) or layer (LayerNorm)
    mlp_act: str = "silu"  # silu (gated), gelu, gelu_new (GPT-2's tanh approximation, written out)
    fused_qkv: bool = False  # one projection whose q, k, v views keep the whole output alive
    q_width: int = 0  # per-token width of q, k (after repeat_kv) and v as attention sees them
    v_width: int = 0
    dropout: float = 0.0  # attention / residual dropout during training (GPT-2: 0.1)

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
    experts = _int_key(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), "expert count") or 1
    moe_inner = _int_key(cfg, ("moe_intermediate_size",), "expert intermediate size") or inner
    top_k = min(experts, _int_key(cfg, ("num_experts_per_tok", "moe_topk"), "experts per token") or 2)
    tied = _flag(cfg, "tie_word_embeddings", family not in UNTIED_BY_DEFAULT)
    # DeepSeek-V2/V3: the first `first_k_dense_replace` layers keep a dense MLP, then every
    # `moe_layer_freq`-th layer is routed (transformers' DeepseekV2DecoderLayer).
    dense_first = _int_key(cfg, ("first_k_dense_replace",), "dense layer count") or 0
    freq = _int_key(cfg, ("moe_layer_freq",), "MoE layer frequency") or 1
    moe_layers = sum(1 for i in range(n_layers) if i >= dense_first and i % freq == 0) if experts > 1 else 0

    q_out, kv_out = heads * head_dim, kv * head_dim
    q_width = v_width = q_out
    if gpt2_style:
        # GPT-2: c_attn (h x 3h + 3h), c_proj (h x h + h), c_fc (h x 4h + 4h), c_proj (4h x h + h), 2 LayerNorms.
        attn = h * 3 * h + 3 * h + h * h + h
        dense_mlp = mlp = h * inner + inner + inner * h + h
        norms = 2 * 2 * h
        final_norm = 2 * h
        positions = (_int_key(cfg, ("n_positions", "max_position_embeddings"), "positions") or 1024) * h
        largest_in_block = max(h * 3 * h + 3 * h, h * inner + inner, inner * h + h)
        shared = 0
    else:
        kv_lora = _int_key(cfg, ("kv_lora_rank",), "MLA key/value rank")
        bias = _flag(cfg, "attention_bias", False)
        if kv_lora is not None:
            # Multi-head latent attention (DeepSeek-V2/V3, transformers' DeepseekV2Attention): q through an
            # optional low-rank q_a/q_b pair, k/v through a shared latent kv_a (with the rope key) and kv_b.
            nope = _require(cfg, ("qk_nope_head_dim",), "MLA no-rope head dimension")
            rope = _require(cfg, ("qk_rope_head_dim",), "MLA rope head dimension")
            v_dim = _require(cfg, ("v_head_dim",), "MLA value head dimension")
            q_lora = _int_key(cfg, ("q_lora_rank",), "MLA query rank")
            q_width, v_width = heads * (nope + rope), heads * v_dim
            if q_lora is None:
                attn = h * q_width
            else:
                attn = h * q_lora + (q_lora if bias else 0) + q_lora + q_lora * q_width
            attn += h * (kv_lora + rope) + (kv_lora + rope if bias else 0) + kv_lora
            attn += kv_lora * heads * (nope + v_dim) + v_width * h + (h if bias else 0)
            largest_attn = max(h * q_width, kv_lora * heads * (nope + v_dim), v_width * h)
        else:
            qkv_bias = family.startswith("qwen2") or bias
            attn = h * q_out + 2 * h * kv_out + q_out * h
            if qkv_bias:
                attn += q_out + 2 * kv_out
            if bias:
                attn += h  # o_proj bias (Llama's attention_bias covers all four projections)
            if family.startswith("qwen3"):
                attn += 2 * head_dim  # q_norm and k_norm
            largest_attn = h * q_out
        matrices = 3 if gated else 2
        mlp_bias = _flag(cfg, "mlp_bias", False)
        expert_mlp = matrices * h * moe_inner + (matrices * moe_inner + h if mlp_bias else 0)
        dense_mlp = matrices * h * inner + (matrices * inner + h if mlp_bias else 0)
        mlp = expert_mlp * experts + (h * experts if experts > 1 else 0)  # + the router
        shared = _int_key(cfg, ("shared_expert_intermediate_size",), "shared expert size") or 0
        n_shared = _int_key(cfg, ("n_shared_experts",), "shared expert count") or 0
        if n_shared and experts > 1:
            shared = n_shared * moe_inner  # DeepSeek's shared experts: one MLP n_shared times as wide
            mlp += matrices * h * shared
        elif shared and experts > 1:
            mlp += matrices * h * shared + h  # Qwen-MoE's always-on shared expert and its gate
        if experts == 1:
            dense_mlp = mlp
        norms = 2 * h
        final_norm = h
        positions = 0
        # The largest single Linear of a block: an attention projection or one MLP projection.
        largest_in_block = max(largest_attn, h * moe_inner, h * inner if moe_layers < n_layers else 0)
    dense_layers = n_layers - moe_layers if experts > 1 else n_layers
    moe_block = attn + mlp + norms
    dense_block = attn + dense_mlp + norms
    embed = vocab * h
    head = 0 if tied else vocab * h
    root = embed + positions + final_norm + head
    total = moe_layers * moe_block + dense_layers * dense_block + root
    act = str(cfg.get("activation_function") or cfg.get("hidden_act") or "").lower()
    # GPT2Config defaults attn_pdrop to 0.1; Llama-style configs default attention_dropout to 0.
    dropout = cfg.get("attn_pdrop", cfg.get("attention_dropout", 0.1 if gpt2_style else 0.0))
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
        block_params=max(moe_block if moe_layers else 0, dense_block if dense_layers else 0),
        root_params=root,
        family=family,
        estimated=False,
        experts=experts,
        experts_per_token=top_k if experts > 1 else 1,
        moe_intermediate=moe_inner if experts > 1 else 0,
        moe_layers=moe_layers,
        shared_intermediate=shared if experts > 1 else 0,
        positions=positions,
        norm="layer" if gpt2_style or family in ("gpt_neox", "falcon", "phi", "opt") else "rms",
        mlp_act="silu" if gated else ("gelu_new" if gpt2_style and act in ("", "gelu_new") else "gelu"),
        fused_qkv=gpt2_style,
        q_width=q_width,
        v_width=v_width,
        dropout=float(dropout) if isinstance(dropout, (int, float)) and 0 <= dropout < 1 else 0.0,
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
        # A gated MLP of width i holds 3·h·i = 8·h² of the 12·h² (Llama-2 7B: 11008 for h = 4096).
        intermediate=max(HEAD_DIM, round(8 * h / 3 / 256) * 256),
        vocab=vocab,
        tied=False,
        largest_layer=min(params, max(embed, 4 * h * h)),
        block_params=block,
        root_params=min(params, 2 * embed),
        family="estimated",
        estimated=True,
        q_width=heads * HEAD_DIM,
        v_width=heads * HEAD_DIM,
    )
