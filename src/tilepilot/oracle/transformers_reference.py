"""Hugging Face transformers as the oracle's independent FP32 reference, one module in FP32 at a time.

Phase 0 judges the oracle against transformers' own modeling code. Loading that model in FP32 would hold
a full FP32 copy of the weights (16 GB for a 4B model, the peak of a whole deployment), so the model is
loaded in the checkpoint's stored dtype and each top-level module (embedding, rotary tables, every
decoder layer, final norm, LM head) is switched to FP32 just before it runs and back right after. An
upcast from BF16/FP16 is exact, so every module computes exactly what an FP32-loaded model would, with at
most one module's FP32 copy alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tilepilot.errors import CheckpointError
from tilepilot.model.checkpoint import check_headers
from tilepilot.model.spec import load_spec

# safetensors dtype names -> the dtype transformers should keep the weights in
_STORED = {"BF16": torch.bfloat16, "F16": torch.float16}


@dataclass
class TransformersRun:
    """What transformers computed on prompt + continuation: the prompt's logits and hidden states, and at each
    continuation step its own argmax given the tokens before it."""

    logits: torch.Tensor  # [prompt_len, vocab] FP32
    hidden: list[torch.Tensor]  # per decoder layer [prompt_len, hidden]; the last one is after the final norm
    choices: list[int]  # argmax at each continuation step


def stored_dtype(model_dir: str | Path) -> torch.dtype:
    """The dtype to load in: the checkpoint's own when every weight is BF16 (or every one FP16), else FP32."""
    report = check_headers(model_dir, load_spec(model_dir))
    kinds = set(report.dtypes)
    only = kinds.pop() if len(kinds) == 1 else None
    return _STORED.get(only, torch.float32)


def _swap_to_fp32(module: nn.Module) -> list[tuple[dict, str, torch.Tensor | None, torch.Tensor]]:
    """Replace every non-FP32 floating parameter/buffer of ``module`` by an FP32 copy; returns how to undo it."""
    undo: list[tuple[dict, str, torch.Tensor | None, torch.Tensor]] = []
    seen: set[int] = set()
    for m in module.modules():
        for store in (m._parameters, m._buffers):
            for name, t in store.items():
                if t is None or not t.is_floating_point() or t.dtype == torch.float32 or id(t) in seen:
                    continue
                seen.add(id(t))
                if isinstance(t, nn.Parameter):
                    undo.append((store, name, t, t.data))
                    t.data = t.data.float()
                else:
                    undo.append((store, name, None, t))
                    store[name] = t.float()
    return undo


def _restore(undo: list[tuple[dict, str, torch.Tensor | None, torch.Tensor]]) -> None:
    for store, name, param, original in reversed(undo):
        if param is not None:
            param.data = original
        else:
            store[name] = original


def fp32_units(model: nn.Module) -> list[nn.Module]:
    """The modules switched to FP32 one at a time: the decoder's direct children (each layer separately) and
    the LM head. Found by structure, not by name lists, so any Llama-like causal LM is covered."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    units: list[nn.Module] = []
    for child in base.children():
        units.extend(child if isinstance(child, nn.ModuleList) else [child])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        units.append(head)
    return units


@contextmanager
def one_module_in_fp32(model: nn.Module) -> Iterator[nn.Module]:
    """While active, each unit of ``model`` computes in FP32 and holds FP32 weights only while it runs."""
    handles = []
    pending: dict[int, list] = {}

    def before(mod, _args):
        pending[id(mod)] = _swap_to_fp32(mod)

    def after(mod, _args, _out):
        _restore(pending.pop(id(mod), []))

    for unit in fp32_units(model):
        handles.append(unit.register_forward_pre_hook(before))
        handles.append(unit.register_forward_hook(after))
    try:
        yield model
    finally:
        for h in handles:
            h.remove()
        for undo in pending.values():
            _restore(undo)


def load_reference_model(model_dir: str | Path, tensors: Callable[[str], torch.Tensor] | None = None) -> nn.Module:
    """transformers' model of the checkpoint, in its stored dtype, in eval mode.

    With ``tensors`` (name -> tensor, e.g. ``Checkpoint.get``, which hands out the file mapping without a copy)
    the model is built on the meta device and given those tensors under its own parameter names, so it shares
    the memory the oracle already reads instead of holding a second copy of the weights (8 GB for a 4B model).
    Sharing the tensors must not mean trusting tilepilot's loader: every tensor given is compared with an
    independent read of the safetensors files (one tensor mapped at a time), so a loader that hands out a wrong
    or altered tensor fails here. Without ``tensors``, or for a model whose construction-time buffers cannot be
    rebuilt off the meta device, ``from_pretrained`` loads the weights itself.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = stored_dtype(model_dir)
    if tensors is None:
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if not _materialize_buffers(model):
        return load_reference_model(model_dir)
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    state = {n: tensors(n) for n in names if not (n == "lm_head.weight" and config.tie_word_embeddings)}
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    left = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if left:
        raise CheckpointError(f"transformers expects {left[0]} but the checkpoint does not provide it")
    _check_against_files(model_dir, state)
    return model.eval()


def _check_against_files(model_dir: str | Path, state: dict[str, torch.Tensor]) -> None:
    """Each tensor in ``state`` equals the one stored under its name, read straight from the safetensors files."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            where.update({k: path for k in f.keys() if k in state})
    for name, given in state.items():
        if name not in where:
            raise CheckpointError(f"{name} is not stored in any safetensors file of {model_dir}")
        with safe_open(str(where[name]), framework="pt") as f:
            stored = f.get_tensor(name)
        if stored.dtype != given.dtype or stored.shape != given.shape or not torch.equal(stored, given):
            raise CheckpointError(
                f"the loaded {name} differs from the one stored in {where[name].name}; the checkpoint loader is wrong"
            )
        del stored


def _materialize_buffers(model: nn.Module) -> bool:
    """Buffers computed at construction (RoPE frequencies) are left on the meta device by a meta build; build each
    module that owns one again on the CPU from the model's config. False when a module cannot be built that way."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if any(b.device.type == "meta" for b in child.buffers(recurse=False)) and not list(child.parameters()):
                try:
                    rebuilt = type(child)(config=model.config)
                except TypeError:
                    return False
                setattr(parent, name, rebuilt)
    return not any(b.device.type == "meta" for b in model.buffers())


@torch.no_grad()
def run_reference(
    model: nn.Module, prompt: Sequence[int], continuation: Sequence[int], n_layers: int
) -> TransformersRun:
    """One FP32 forward over ``prompt + continuation[:-1]``: the prompt's logits and hidden states and, per
    continuation step, transformers' argmax (one pass instead of a token-by-token ``generate``; up to the first
    step where it differs from ``continuation`` it is exactly transformers' own greedy)."""
    n = len(prompt)
    ids = torch.tensor([[*prompt, *continuation[:-1]]], dtype=torch.long)
    with one_module_in_fp32(model):
        out = model(ids, output_hidden_states=True, attention_mask=torch.ones_like(ids))
    logits = out.logits[0].float()
    # hidden_states[0] is the embedding; [i+1] the output of layer i (the last one after the final norm).
    hidden = [h[0, :n].float() for h in out.hidden_states[1 : n_layers + 1]]
    choices = [int(t) for t in torch.argmax(logits[n - 1 :], dim=-1)] if continuation else []
    return TransformersRun(logits=logits[:n], hidden=hidden, choices=choices)
