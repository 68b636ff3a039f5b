"""ModelSpec: one description of a decoder-only model, read from a Hugging Face ``config.json``.

Everything below the frontend (oracle, kernels, plans, runner) reads this spec and never the raw
config, so that Llama, Qwen2, Qwen3 and Mistral-style configs differ only here. The scope check
lives here too: a model tilepilot cannot deploy is refused before any weight is read, with one
sentence that names the reason.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.errors import ConfigError, ScopeError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}

_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling; ``None`` on the spec means plain RoPE."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"


@dataclass(frozen=True)
class ModelSpec:
    """Shape and numerics of one decoder-only transformer, independent of its family's naming."""

    architecture: str
    family: str
    n_layers: int
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    tied_embeddings: bool
    max_positions: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    dtype: str = "bfloat16"
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    def layer_tensor_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """Hugging Face tensor names and shapes of decoder layer ``i``."""
        p = f"model.layers.{i}."
        h, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        shapes: dict[str, tuple[int, ...]] = {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        }
        if self.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        if self.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if self.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (self.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (self.head_dim,)
        return shapes

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a complete checkpoint holds, in file order (embedding first, head last)."""
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, self.hidden)}
        for i in range(self.n_layers):
            shapes.update(self.layer_tensor_shapes(i))
        shapes["model.norm.weight"] = (self.hidden,)
        if not self.tied_embeddings:
            shapes["lm_head.weight"] = (self.vocab, self.hidden)
        return shapes

    @property
    def n_params(self) -> int:
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def weight_bytes(self, bytes_per_value: int = 2) -> int:
        return self.n_params * bytes_per_value

    def with_layers(self, n_layers: int) -> ModelSpec:
        """The same model with fewer (or more) decoder layers, for small tests."""
        d = self.to_dict()
        d["n_layers"] = n_layers
        return ModelSpec.from_dict(d)

    # ---- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["eos_ids"] = list(self.eos_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        d = dict(d)
        rs = d.get("rope_scaling")
        d["rope_scaling"] = RopeScaling(**rs) if isinstance(rs, dict) else None
        d["eos_ids"] = tuple(d.get("eos_ids", ()))
        return cls(**d)

    # ---- reading a Hugging Face config ---------------------------------------------------
    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "") -> ModelSpec:
        return spec_from_config(cfg, name=name)


def _require(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config.json has no '{key}'; it is required to describe the model")
    return cfg[key]


def _int(cfg: dict[str, Any], key: str) -> int:
    v = _require(cfg, key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"config.json field '{key}' must be a positive integer, got {v!r}")
    return v


def _check_scope(cfg: dict[str, Any]) -> str:
    """Return the family of an in-scope config; raise ScopeError naming why it is not."""
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        model_type = cfg.get("model_type")
        raise ScopeError(
            f"config.json names no architecture (model_type={model_type!r}); tilepilot deploys "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    arch = archs[0]
    if cfg.get("is_encoder_decoder"):
        raise ScopeError(f"{arch} is an encoder-decoder model; tilepilot deploys decoder-only models")
    if any(cfg.get(k) for k in _MOE_KEYS) or "moe" in arch.lower():
        raise ScopeError(f"{arch} is a mixture-of-experts model; tilepilot deploys dense models only")
    if any(cfg.get(k) for k in _MLA_KEYS):
        raise ScopeError(f"{arch} uses multi-head latent attention (MLA), which tilepilot does not support")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ScopeError(
            f"architecture {arch} is not supported; tilepilot deploys {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    family = SUPPORTED_ARCHITECTURES[arch]
    model_type = cfg.get("model_type")
    if model_type is not None and model_type != family:  # transformers builds the config class from model_type
        raise ConfigError(
            f"config.json says architecture {arch} but model_type {model_type!r} (a {arch} has model_type "
            f"{family!r}); fix whichever of the two is wrong"
        )
    if _sliding_window_in_use(cfg, family):
        raise ScopeError(
            f"{arch} uses sliding-window attention (sliding_window={cfg.get('sliding_window')}), "
            "which tilepilot does not support; use a config with sliding windows disabled"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ScopeError(f"{arch} uses activation {act!r}; tilepilot's FFN kernels implement SwiGLU (silu)")
    if cfg.get("mlp_bias"):
        raise ScopeError(f"{arch} has MLP biases (mlp_bias=true), which tilepilot does not support")
    return family


def _sliding_window_in_use(cfg: dict[str, Any], family: str) -> bool:
    window = cfg.get("sliding_window")
    if family in ("qwen2", "qwen3"):
        return bool(cfg.get("use_sliding_window")) and window is not None
    if window is None:
        return False
    return int(window) < int(cfg.get("max_position_embeddings", 0) or 0)


def _rope(cfg: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """Read rope theta and scaling from legacy (rope_theta/rope_scaling) or v5 (rope_parameters) keys."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"config.json rope_theta must be a positive number, got {theta!r}")
    if not scaling:
        return float(theta), None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise ScopeError(f"rope scaling type {kind!r} is not supported; tilepilot supports 'llama3' and none")
    try:
        rs = RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ConfigError(f"llama3 rope scaling in config.json lacks {e.args[0]!r}") from None
    return float(theta), rs


def _eos(cfg: dict[str, Any]) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def spec_from_config(cfg: dict[str, Any], name: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed config.json; raise ScopeError/ConfigError with one clear sentence."""
    if not isinstance(cfg, dict):
        raise ConfigError("config.json must hold a JSON object")
    family = _check_scope(cfg)
    hidden = _int(cfg, "hidden_size")
    n_heads = _int(cfg, "num_attention_heads")
    n_kv = cfg.get("num_key_value_heads") or n_heads
    if not isinstance(n_kv, int) or n_kv <= 0:
        raise ConfigError(f"config.json num_key_value_heads must be a positive integer, got {n_kv!r}")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise ScopeError(
                f"hidden_size {hidden} is not divisible by num_attention_heads {n_heads} and no head_dim is given"
            )
        head_dim = hidden // n_heads
    if n_heads % n_kv:
        raise ScopeError(
            f"num_attention_heads {n_heads} is not divisible by num_key_value_heads {n_kv}, so heads cannot be grouped"
        )
    if head_dim % 2:
        raise ScopeError(f"head_dim {head_dim} is odd; rotary embeddings need an even head_dim")
    theta, scaling = _rope(cfg)
    qkv_bias = True if family == "qwen2" else bool(cfg.get("attention_bias", False))
    o_bias = False if family == "qwen2" else bool(cfg.get("attention_bias", False))
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    eps = cfg.get("rms_norm_eps", 1e-6)
    return ModelSpec(
        architecture=cfg["architectures"][0],
        family=family,
        n_layers=_int(cfg, "num_hidden_layers"),
        hidden=hidden,
        intermediate=_int(cfg, "intermediate_size"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=int(head_dim),
        vocab=_int(cfg, "vocab_size"),
        rms_eps=float(eps),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=family == "qwen3",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_positions=int(cfg.get("max_position_embeddings", 2048)),
        bos_id=cfg.get("bos_token_id"),
        eos_ids=_eos(cfg),
        dtype=str(dtype),
        name=name or str(cfg.get("_name_or_path", "")),
    )


def load_spec(model_dir: str | Path) -> ModelSpec:
    """Read ``MODEL_DIR/config.json`` into a ModelSpec."""
    path = Path(model_dir)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise ConfigError(f"{path} does not exist; pass a Hugging Face model directory")
    if not cfg_path.is_file():
        raise ConfigError(f"{path} has no config.json; pass a Hugging Face model directory")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_path} is not valid JSON ({e.msg} at line {e.lineno}); fix or re-download it") from None
    return spec_from_config(cfg, name=path.name if path.is_dir() else path.parent.name)
