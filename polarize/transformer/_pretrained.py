"""Sink metrics of pretrained causal LMs (transformers), streamed one layer at a time.

torch and transformers (the `llm` extra) are imported inside the functions that need
them: this module loads without them, and `missing_packages` tells the CLI what to
install before anything heavy is imported.

How the weights are caught. A forward hook on each attention module reads the weights
that its eager attention returns (`output[index]`), reduces them at once, head by head
and in float64, with `measure.sinks.head_metrics` (the function the `.npz` path uses),
and replaces them by None in the module's output, so the layer's `[heads, T, T]` maps
are freed before the next layer runs: peak memory is one layer's maps, never
layers x heads x T x T. The modules are the ones transformers itself records for
`output_attentions=True`: the model's `_can_record_outputs["attentions"]` (a class, or an
`OutputRecorder` with the output index and a submodule name, e.g. GPT-2's `.attn`
without its cross-attention), so the hooks see exactly the maps the model would return.
Hooks were chosen over a custom function registered with `AttentionInterface`, which
would have to reimplement each model's eager attention (GPT-2's differs from Llama's):
the hook leaves the model's own computation untouched. Grouped-query models (fewer key
and value heads) repeat K and V before the softmax, so the maps, and the heads counted,
are the query heads. One sequence runs at a time (no padding: every row is a real one).
"""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np

from ..core._choices import SINK_MASS
from ..core._errors import PolarizeError

LLM_EXTRA = "pip install -e '.[llm]'  (torch, transformers, safetensors)"
_STEP = re.compile(r"(?:checkpoint|step|global_step|iter)[-_]?(\d+)", re.IGNORECASE)


def missing_packages() -> list[str]:
    """The packages of the `llm` extra that cannot be imported (none imported here)."""
    missing = []
    for name in ("torch", "transformers"):
        if name in sys.modules:
            if sys.modules[name] is None:
                missing.append(name)
        elif importlib.util.find_spec(name) is None:
            missing.append(name)
    return missing


def training_step(name: str, revision: str | None = None) -> int | None:
    """The training step of a checkpoint: from the revision or the folder's name
    (`checkpoint-1000`, `step1000`), else from `trainer_state.json` (`global_step`) or
    `config.json` (`step`) in a local folder; None when none says it."""
    for text in (revision, Path(name).name):
        if text and (m := _STEP.search(text)):
            return int(m.group(1))
    folder = Path(name)
    for file, field in (("trainer_state.json", "global_step"), ("config.json", "step")):
        try:
            value = json.loads((folder / file).read_text()).get(field)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _refuse_load(name: str, revision: str | None, error: Exception) -> PolarizeError:
    where = f"{name!r}" + (f" at revision {revision!r}" if revision else "")
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, OSError):
        return PolarizeError(
            f"`--model` {where} could not be found locally or downloaded "
            f"(give a saved folder, or a hub name with network access): {detail}"
        )
    return PolarizeError(f"`--model` {where} is not a causal LM that transformers loads: {detail}")


def load(name: str, revision: str | None = None):
    """The causal LM at `name` (a folder or a hub name) with eager attention, in float32
    and eval mode; a `PolarizeError` with one line when it cannot be loaded."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            name, revision=revision, attn_implementation="eager", dtype=torch.float32
        )
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        raise _refuse_load(name, revision, e) from None
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        raise PolarizeError(f"`--model` {name!r} does not run eager attention, so it returns no weights")
    attention_modules(model, name)
    return model.eval()


def tokenizer(name: str, revision: str | None = None):
    """The tokenizer saved with `name`; a `PolarizeError` when there is none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, revision=revision)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PolarizeError(
            f"`--text` needs a tokenizer saved with {name!r}; give --token-ids instead ({e})"
        ) from None


def attention_modules(model, name: str = "") -> list:
    """`(module, index)` of each self-attention layer, in order: the modules transformers
    records for `output_attentions` (see the module docstring)."""
    spec = (getattr(model, "_can_record_outputs", None) or {}).get("attentions")
    specs = spec if isinstance(spec, list) else [spec] if spec is not None else []
    found = []
    for path, module in model.named_modules():
        for s in specs:
            target = getattr(s, "target_class", s if isinstance(s, type) else None)
            suffix = getattr(s, "class_name", s if isinstance(s, str) else None)
            layer = getattr(s, "layer_name", None)
            if not (
                (target is not None and isinstance(module, target)) or (suffix and path.endswith(suffix))
            ):
                continue
            if layer is not None and f".{layer.strip('.')}." not in f".{path}.":
                continue
            found.append((module, getattr(s, "index", 1)))
            break
    if not found:
        raise PolarizeError(
            f"`--model` {name!r} ({type(model).__name__}) has no attention weights to read: "
            "no eager attention module that returns them"
        )
    return found


def vocab_size(model) -> int:
    return int(model.get_input_embeddings().num_embeddings)


def max_positions(model) -> int | None:
    """The longest sequence a model with learned positions takes (None: no limit known)."""
    for field in ("max_position_embeddings", "n_positions"):
        value = getattr(model.config, field, None)
        if isinstance(value, int):
            return value
    return None


def stream_metrics(model, sequences, key: int = 0, mass: str = SINK_MASS) -> dict:
    """Per-sequence, per-layer, per-head metrics `[sequences, layers, heads]` (as
    `sinks.head_metrics` returns them) of `model` on each 1-d token array of `sequences`,
    one layer's maps alive at a time."""
    import torch

    from ..measure import sinks

    modules = attention_modules(model)
    output_index = {id(m): i for m, i in modules}
    layers: list[dict] = []

    def reduce(module, args, output):
        index = output_index[id(module)]
        weights = output[index] if isinstance(output, tuple) and len(output) > index else None
        if weights is None:
            raise PolarizeError(
                f"{type(module).__name__} returned no attention weights under eager attention"
            )
        maps = weights.detach()[0]  # [heads, T, T] of the one sequence
        per_head = [sinks.head_metrics(maps[h : h + 1].double().numpy(), key, mass) for h in range(len(maps))]
        del maps, weights
        layers.append(
            {
                name: np.concatenate([m[name] for m in per_head])
                if name != "bidirectional"
                else any(m[name] for m in per_head)
                for name in per_head[0]
            }
        )
        return (*output[:index], None, *output[index + 1 :])

    handles = [m.register_forward_hook(reduce) for m, _ in modules]
    per_sequence = []
    try:
        with torch.inference_mode():
            for ids in sequences:
                layers.clear()
                model(input_ids=torch.as_tensor(np.asarray(ids)[None], dtype=torch.long), use_cache=False)
                per_sequence.append({name: np.stack([m[name] for m in layers]) for name in layers[0]})
    finally:
        for h in handles:
            h.remove()
    return {name: np.stack([s[name] for s in per_sequence]) for name in per_sequence[0]}


def full_maps(model, ids) -> np.ndarray:
    """Every layer's maps of one sequence from `output_attentions=True`, `[layers, heads, T, T]`
    float64: the model's own path, which holds them all at once (for tests and the benchmark)."""
    import torch

    with torch.inference_mode():
        out = model(
            input_ids=torch.as_tensor(np.asarray(ids)[None], dtype=torch.long),
            output_attentions=True,
            use_cache=False,
        )
    return np.stack([a[0].double().numpy() for a in out.attentions])
