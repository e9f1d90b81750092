"""`polarize sinks --model`: tiny random GPT-2 and Llama (grouped KV heads) models saved to
a folder and loaded through the user's path, checked against the model's own
`output_attentions=True` maps and closed forms on them; nothing is downloaded."""

import importlib
import importlib.util
import json
import os

import numpy as np
import pandas as pd
import pytest

from polarize.cli import main
from polarize.transformer import _pretrained

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub reads it on import
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
    reason="needs the llm extra (torch, transformers)",
)
# imported by this file's first test, not at collection: each xdist worker collects every
# file, and the two imports took 2-3 s in each (benchmarks/NOTES.md)
torch = transformers = None

VOCAB, T = 100, 16


@pytest.fixture(autouse=True, scope="module")
def libraries():
    global torch, transformers
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    # in case huggingface_hub was imported before this module set HF_HUB_OFFLINE
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def gpt2(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def llama(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query: 4 query heads share 2 key/value heads
        num_hidden_layers=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(config)


def save_tokenizer(folder) -> None:
    """A word-level tokenizer over the words w0..w98 (id 99 unknown)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)


@pytest.fixture(scope="module")
def ids(tmp_path_factory):
    path = tmp_path_factory.mktemp("ids") / "ids.npy"
    np.save(path, np.random.default_rng(0).integers(0, VOCAB, (3, T)))
    return path


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["sinks", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("build", [gpt2, llama])
def test_streamed_metrics_equal_the_models_own_maps(build, ids, tmp_path, capsys):
    build().save_pretrained(tmp_path / "model")
    model = _pretrained.load(str(tmp_path / "model"))
    sequences = list(np.load(ids))
    full = np.stack([_pretrained.full_maps(model, s) for s in sequences])  # [seq, layers, heads, T, T]
    assert full.shape[1:3] == (2, 4)  # Llama: the 4 query heads, not the 2 key/value heads
    k = 2
    # closed forms on the model's own maps (softmax rows): alpha_k = mean_{i >= k} A[i, k]
    alpha = full[..., k:, k].mean(-1).mean(0)
    bos = full[..., :, 0].mean(-1).mean(0)
    eps = float(np.sort(alpha.ravel())[3:5].mean())  # between two heads: a sink rate of 50%
    streamed = _pretrained.stream_metrics(model, sequences, key=k)
    assert np.allclose(streamed["alpha"].mean(0), alpha, rtol=0, atol=1e-6)
    assert np.allclose(streamed["bos_share"].mean(0), bos, rtol=0, atol=1e-6)
    code, out, _ = run(capsys, "--model", tmp_path / "model", "--token-ids", ids, "--k", k, "--eps", eps,
                       "--json", tmp_path / "s.json", "--out", tmp_path / "s.png")  # fmt: skip
    assert code == 0 and "Sink_2^" in out and (tmp_path / "s.png").is_file()
    record = json.loads((tmp_path / "s.json").read_text())
    assert np.allclose(record["alpha"], alpha, rtol=0, atol=1e-6)
    assert record["sink_rate"] == pytest.approx((alpha > eps).mean(), abs=1e-6) == 0.5
    assert (record["layers"], record["heads"], record["sequences"], record["tokens"]) == (2, 4, 3, T)
    assert (record["k"], record["eps"], record["mass"], record["nonfinite"]) == (k, eps, "abs", 0)


def test_the_npz_path_writes_the_same_json(ids, tmp_path, capsys):
    gpt2().save_pretrained(tmp_path / "model")
    model = _pretrained.load(str(tmp_path / "model"))
    full = np.stack([_pretrained.full_maps(model, s) for s in np.load(ids)])
    np.savez(tmp_path / "maps.npz", attention=full)
    records = []
    for source in (["--model", tmp_path / "model", "--token-ids", ids], [tmp_path / "maps.npz"]):
        assert run(capsys, *source, "--json", tmp_path / "r.json", "--out", tmp_path / "r.png")[0] == 0
        records.append(json.loads((tmp_path / "r.json").read_text()))
    fields = ("sink_rate", "k", "eps", "mass", "layers", "heads", "sequences", "tokens", "status")
    assert {f: records[0][f] for f in fields} == {f: records[1][f] for f in fields}
    assert np.allclose(records[0]["alpha"], records[1]["alpha"], rtol=0, atol=1e-12)


def test_a_head_made_a_sink_by_hand_is_found(ids, tmp_path, capsys):
    # position 0 gets a large embedding along u; head 1 of layer 0 has a constant query
    # along e and a key that reads u, so its score on key 0 is far above all others
    model = gpt2()
    with torch.no_grad():
        u = torch.nn.functional.normalize(torch.randn(32), dim=0)
        model.transformer.wpe.weight[:] = 0
        model.transformer.wpe.weight[0] = 10 * u
        attn = model.transformer.h[0].attn.c_attn  # Conv1D: [in 32, out 3 x 32] = Q | K | V
        e = torch.zeros(8)
        e[0] = 1
        attn.weight[:, 8:16] = 0
        attn.bias[8:16] = 10 * e
        attn.weight[:, 40:48] = 10 * torch.outer(u, e)
        attn.bias[40:48] = 0
    model.save_pretrained(tmp_path / "sink")
    files = ("--json", tmp_path / "s.json", "--out", tmp_path / "s.png")
    code, out, _ = run(capsys, "--model", tmp_path / "sink", "--token-ids", ids, *files)
    record = json.loads((tmp_path / "s.json").read_text())
    assert code == 0 and record["status"] == [["-", "sink", "-", "-"], ["-"] * 4], out
    assert record["alpha"][0][1] > 0.95 and record["sink_rate"] == 1 / 8
    assert "(1 of 8 heads)" in out


def test_a_checkpoint_series_gives_a_row_per_checkpoint(tmp_path, capsys):
    folders = []
    for i, step in enumerate((3000, 1000, 2000)):
        model = llama(seed=i)
        folders.append(tmp_path / f"checkpoint-{step}")
        model.save_pretrained(folders[-1])
        save_tokenizer(folders[-1])
    text = tmp_path / "prompts.txt"
    text.write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9\n\nw5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15\n")
    out_png = tmp_path / "series.png"
    files = ("--out", out_png, "--json", tmp_path / "s.json")
    code, out, err = run(capsys, "--model", *folders, "--text", text, *files)
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "series.csv")
    assert list(frame["step"]) == [3000, 1000, 2000] and len(frame) == 3
    assert {"checkpoint", "sink_rate", "mean_alpha", "bos_share", "nonfinite"} <= set(frame.columns)
    assert out_png.stat().st_size > 10_000
    records = json.loads((tmp_path / "s.json").read_text())
    assert [r["tokens"] for r in records] == [[9, 11]] * 3
    assert [r["step"] for r in records] == [3000, 1000, 2000]
    assert np.allclose(frame["sink_rate"], [r["sink_rate"] for r in records])
    # --max-tokens cuts every line; --steps names the steps of folders without them in their names
    plain = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    for folder, source in zip(plain, folders):
        folder.symlink_to(source)
    code, _, err = run(capsys, "--model", *plain, "--text", text, "--max-tokens", 5, "--steps", 1, 2, 3,
                       "--out", tmp_path / "p.png", "--json", tmp_path / "p.json")  # fmt: skip
    assert code == 0, err
    assert [r["tokens"] for r in json.loads((tmp_path / "p.json").read_text())] == [5] * 3
    assert list(pd.read_csv(tmp_path / "p.csv")["step"]) == [1, 2, 3]
    code, _, err = run(capsys, "--model", *plain, "--text", text)
    assert code == 2 and "cannot tell the training step of" in err


def test_nan_weights_in_a_model_are_reported_per_head(ids, tmp_path, capsys):
    model = gpt2()
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight.fill_(float("nan"))
    model.save_pretrained(tmp_path / "nan")
    code, out, _ = run(capsys, "--model", tmp_path / "nan", "--token-ids", ids, "--json", tmp_path / "n.json",
                       "--out", tmp_path / "n.png")  # fmt: skip
    record = json.loads((tmp_path / "n.json").read_text())
    assert code == 0 and record["nonfinite"] == 4 and record["status"][1] == ["nonfinite"] * 4
    assert record["alpha"][1] == [None] * 4 and record["sink_rate"] == 0.0  # over layer 0's 4 finite heads
    assert "layer 1: Sink_0^0.3 = n/a (4 of 4 heads nonfinite, left out)" in out
    assert "(0 of 4 finite heads; 4 nonfinite)" in out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    gpt2().save_pretrained(folder / "gpt2")
    save_tokenizer(folder / "gpt2")
    mamba = transformers.MambaConfig(hidden_size=16, num_hidden_layers=2, vocab_size=VOCAB, state_size=4)
    transformers.MambaForCausalLM(mamba).save_pretrained(folder / "mamba")
    np.save(folder / "big.npy", np.full((2, 8), VOCAB + 5))
    np.save(folder / "short.npy", np.zeros((2, 4), dtype=np.int64))
    np.save(folder / "long.npy", np.zeros((1, 80), dtype=np.int64))  # GPT-2 here has 64 positions
    (folder / "empty.txt").write_text("\n  \n")
    (folder / "short.txt").write_text("w1 w2\n")
    return folder


IDS = "--token-ids {d}/short.npy"
BAD = {
    "a missing folder": ("--model {d}/none " + IDS, "is not a folder of a saved model"),
    "a name not found offline": ("--model no-such-org/no-such-model " + IDS, "could not be found locally"),
    "no eager attention": ("--model {d}/mamba " + IDS, "has no attention weights"),
    "ids out of vocabulary": ("--model {d}/gpt2 --token-ids {d}/big.npy", "outside the vocabulary"),
    "an empty text file": ("--model {d}/gpt2 --text {d}/empty.txt", "has no non-empty line"),
    "k >= tokens (ids)": ("--model {d}/gpt2 --k 4 " + IDS, "`--k` must be below"),
    "k >= tokens (text)": ("--model {d}/gpt2 --text {d}/short.txt --k 2", "`--k` must be below"),
    "text and ids": (
        "--model {d}/gpt2 --text {d}/empty.txt " + IDS,
        "`--token-ids FILE.npy` with `--model`, not both",
    ),
    "longer than the positions": ("--model {d}/gpt2 --token-ids {d}/long.npy", "takes at most 64 tokens"),
    "an unknown mass": ("--model {d}/gpt2 --mass signed " + IDS, "`--mass`"),
    "two models, revisions": ("--model {d}/gpt2 {d}/gpt2 --revisions a " + IDS, "needs exactly one"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_line(case, saved, capsys):
    args, message = BAD[case]
    code, out, err = run(capsys, *args.format(d=saved).split())
    assert code == 2 and err.startswith("polarize: error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err + out


def test_without_the_llm_extra_it_says_what_to_install(saved, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    code, _, err = run(capsys, "--model", saved / "gpt2", "--token-ids", saved / "short.npy")
    assert code == 2 and err == "polarize: error: `--model` needs torch: pip install -e '.[llm]'  " + (
        "(torch, transformers, safetensors)\n"
    )


def test_training_steps_are_read_from_names_and_trainer_state(tmp_path):
    assert _pretrained.training_step("runs/checkpoint-1500") == 1500
    assert _pretrained.training_step("EleutherAI/pythia-70m", "step143000") == 143000
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "trainer_state.json").write_text('{"global_step": 42}')
    assert _pretrained.training_step(str(tmp_path / "final")) == 42
    assert _pretrained.training_step(str(tmp_path / "nothing")) is None
