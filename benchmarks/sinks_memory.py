"""Peak memory of `polarize sinks --model`: streamed layer by layer against the full maps.

A random GPT-2 with many layers and a small width (24 layers x 4 heads, width 64) is
saved once; each path then runs in a fresh process that loads it and scores one
sequence of T = 2048 tokens, and reports its peak resident memory (VmHWM):

- floor: the model's forward pass alone (eager attention, no weights kept);
- streamed: `_pretrained.stream_metrics`, the hooks that reduce each layer's maps and
  drop them before the next layer (what `polarize sinks --model` runs);
- full maps: `output_attentions=True`, the path of tools that store every map
  (layers x heads x T x T float32), reduced afterwards one layer at a time.

    python benchmarks/sinks_memory.py            # writes section (h) of RESULTS.md
    python benchmarks/sinks_memory.py --quick    # 8 layers, T = 512; RESULTS.md untouched
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import record, table  # noqa: E402

CHILD = """
import json, sys, time
import numpy as np
from polarize.transformer import _pretrained
from polarize.measure import sinks
from benchmarks._common import peak_rss_mb

folder, path, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = _pretrained.load(folder)
ids = np.random.default_rng(0).integers(0, 100, tokens)
loaded = peak_rss_mb()
start = time.perf_counter()
if path == "floor":
    import torch
    with torch.inference_mode():
        model(input_ids=torch.as_tensor(ids[None]), use_cache=False)
    alpha = None
elif path == "streamed":
    alpha = _pretrained.stream_metrics(model, [ids])["alpha"][0]
else:
    import torch
    with torch.inference_mode():
        maps = model(input_ids=torch.as_tensor(ids[None]), output_attentions=True, use_cache=False).attentions
    alpha = np.stack([sinks.head_metrics(m[0].double().numpy())["alpha"] for m in maps])
seconds = time.perf_counter() - start
print(json.dumps(dict(peak=peak_rss_mb(), loaded=loaded, seconds=seconds,
                      alpha=None if alpha is None else alpha.tolist())))
"""


def build(folder: str, layers: int, tokens: int) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_head=4, n_embd=64, vocab_size=100, n_positions=tokens)
    config.bos_token_id = config.eos_token_id = 0  # inside the vocabulary of 100
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)


def measure(folder: str, path: str, tokens: int) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, folder, path, str(tokens)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 layers, T = 512; RESULTS.md untouched")
    args = parser.parse_args()
    layers, tokens = (8, 512) if args.quick else (24, 2048)
    heads = 4
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        build(tmp, layers, tokens)
        print(f"model saved in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        runs = {path: measure(tmp, path, tokens) for path in ("floor", "streamed", "full")}
    import numpy as np

    same = float(np.max(np.abs(np.array(runs["streamed"]["alpha"]) - np.array(runs["full"]["alpha"]))))
    maps_mib = layers * heads * tokens * tokens * 4 / 2**20
    floor = runs["floor"]["peak"]
    rows = [
        [
            name,
            f"{r['peak']:.0f}",
            f"{r['peak'] - floor:.0f}",
            f"{r['seconds']:.1f}",
        ]
        for name, r in (
            ("floor (forward only)", runs["floor"]),
            ("streamed", runs["streamed"]),
            ("full maps", runs["full"]),
        )  # fmt: skip
    ]
    ratio = runs["full"]["peak"] / runs["streamed"]["peak"]
    above = (runs["full"]["peak"] - floor) / max(runs["streamed"]["peak"] - floor, 1.0)
    body = (
        f"GPT-2 with random weights, {layers} layers x {heads} heads, width 64, one sequence of "
        f"T = {tokens} tokens, float32; every path in a fresh process (peak RSS = VmHWM). All "
        f"the maps are {maps_mib:.0f} MiB.\n\n"
        + table(["path", "peak RSS (MiB)", "above the floor (MiB)", "seconds"], rows)
        + f"\n\nfull maps / streamed: {ratio:.2f}x peak RSS, {above:.1f}x above the floor; "
        f"largest |alpha_0 streamed - alpha_0 full| = {same:.1e}.\n"
    )
    title = "(h) Sinks of a pretrained model: streamed against full maps"
    record("h-sinks-memory", title, body, quick=args.quick)


if __name__ == "__main__":
    main()
