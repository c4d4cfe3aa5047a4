"""`python -m bench.report` (issue 15): its pieces checked against independent counts, and the
whole command run in --quick mode (a tiny random GGUF) so the report's code cannot rot: every
engine measured or named with the reason it is not, the report and its plots written, the
summary appended, and an interrupted run resumed without measuring twice."""
import json
import subprocess
import sys
from math import comb
from pathlib import Path

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf

from bench.report import engines, plan, prepare, roofline, shapes, stats
from bench.support import measure

ROOT = Path(__file__).resolve().parents[1]

REPORT = [sys.executable, "-m", "bench.report"]


# pieces -----------------------------------------------------------------------------------------

def test_depth_chain_starts_every_test_at_its_depth():
    p = plan.FULL
    chain = [seq for seq in plan.sequences(p, 2) if seq[0]["name"] == "pp512"][0]
    at = 0
    for op in chain:
        assert op["start"] == at
        at += op["n"]
    starts = {op["name"]: op["start"] for op in chain}
    assert starts == {"pp512": 0, "tg128 @ d512": 512, "fill to 2048": 640, "tg128 @ d2048": 2048,
                      "fill to 4096": 2176, "tg128 @ d4096": 4096}
    assert plan.test_names(p, 2) == ["tg128", "pp512", "tg128 @ d512", "tg128 @ d2048", "tg128 @ d4096",
                                     "pp16", "pp64", "pp256", "pp1024"]
    assert plan.test_names(p, 1) == ["tg128", "pp512"]
    with pytest.raises(ValueError, match="cannot follow pp512"):
        plan.sequences(plan.Plan(depths=(0, 512, 600)), 2)


def test_rotation_puts_each_engine_first_once():
    items = ["a", "b", "c"]
    assert [plan.rotated(items, r)[0] for r in range(3)] == items
    assert all(sorted(plan.rotated(items, r)) == items for r in range(5))


@pytest.mark.parametrize("wins, n", [(5, 5), (0, 5), (4, 5), (3, 6), (7, 10), (0, 0)])
def test_sign_test_is_the_binomial_tail(wins, n):
    tail = sum(comb(n, k) for k in range(max(wins, n - wins), n + 1)) / 2 ** n
    assert measure.two_sided_sign_test(wins, n) == pytest.approx(min(1.0, 2 * tail))


def test_ratio_summary_drops_ties_from_the_sign_test():
    r = stats.ratio_summary([1.2, 1.0, 0.9, 1.5])
    assert (r["wins"], r["n"], r["min"], r["max"], r["median"]) == (2, 3, 0.9, 1.5, 1.1)


def test_prefill_flops_count_every_projection_weight_twice():
    from nanocompile.frontend import weight_shapes

    cfg = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, layers=3, vocab=320)
    projections = sum(int(np.prod(s)) for name, s in weight_shapes(cfg).items()
                      if name.startswith("model.layers.") and len(s) == 2)
    config = {k: getattr(cfg, k) for k in ("hidden_size", "num_attention_heads", "head_dim", "num_key_value_heads",
                                           "intermediate_size", "num_hidden_layers", "vocab_size")}
    n = 8
    attention = 2 * 2 * 3 * 4 * 16 * sum(range(1, n + 1))  # QK^T and PV: each row i sees i + 1 positions
    expected = (2 * projections * n + attention + 2 * 320 * 64) / n
    assert roofline.prefill_flops_per_token(config, n) == pytest.approx(expected)


def test_decode_weight_bytes_match_gguf_librarys_tensor_sizes(tmp_path):
    import gguf

    from nanocompile.models.gguf_file import read_gguf

    cfg = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, layers=2, vocab=320)
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    expected = sum(tensors.values()) - tensors["token_embd.weight"] + tensors["token_embd.weight"] // 320
    assert prepare.weight_bytes_per_token(read_gguf(path)) == expected


def test_native_has_its_row_and_says_why_it_is_missing():
    from nanocompile.engine.precision import PRECISIONS

    native = engines.BY_ID["nc-native"]
    assert native.peer == "llama-file"
    assert engines.missing(native) == (None if "native" in PRECISIONS else "not built (issue 13)")
    assert engines.missing(engines.BY_ID["nc-f32"]) is None


def test_a_run_made_with_another_plan_is_refused(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"key": "something-else", "plan": {}}))
    r = subprocess.run([*REPORT, "--quick", "--runs", str(tmp_path / "runs"), "--run-id", "r1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "was made with another plan" in r.stderr and "Traceback" not in r.stderr


def test_a_record_cut_short_is_measured_again(tmp_path, capsys):
    """A full disk stopped a run in the middle of writing a record (stop 22): resuming drops
    that last line, says so, and keeps every whole record; a broken line before others is an
    error naming the file and the line."""
    from bench.report.jobs import Run

    d = tmp_path / "r1"
    d.mkdir()
    whole = json.dumps({"key": "speed/a", "result": {}})
    (d / "records.jsonl").write_text(whole + "\n" + '{"key": "accuracy/logits/nc-native", "time": "20')
    run = Run(d)
    assert list(run.records) == ["speed/a"] and "cut short" in capsys.readouterr().err
    assert (d / "records.jsonl").read_text() == whole + "\n"
    (d / "records.jsonl").write_text('{"key": "spe\n' + whole + "\n")
    with pytest.raises(SystemExit, match="line 1 is not a record"):
        Run(d)


def test_an_unknown_shape_is_refused_before_anything_runs(tmp_path):
    r = subprocess.run([*REPORT, "--runs", str(tmp_path), "--shapes", "1.5B,14B"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--shapes takes 1.5B, 3B, 7B; got 14B" in r.stderr
    assert not any(tmp_path.iterdir())


def test_an_impossible_depth_is_refused_before_anything_runs(tmp_path):
    r = subprocess.run([*REPORT, "--quick", "--runs", str(tmp_path), "--depths", "0,64,70"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "depth 70 cannot follow pp64" in r.stderr and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())


# the whole command, --quick ---------------------------------------------------------------------

def quick(tmp_path, *extra):
    r = subprocess.run([*REPORT, "--quick", "--runs", str(tmp_path / "runs"), "--results",
                        str(tmp_path / "results.jsonl"), "--doc", str(tmp_path / "doc" / "BENCHMARKS.md"), *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200,
                       env={**__import__("os").environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def started(stdout: str) -> list[str]:
    """The jobs a run started (recorded ones are skipped silently)."""
    return [line.split("] ", 1)[1][:-4] for line in stdout.splitlines() if line.endswith(" ...")]


@pytest.mark.c
def test_quick_report_end_to_end_and_resumed(tmp_path):
    out = quick(tmp_path)
    (run,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    keys = {r["key"] for r in records}
    assert not [r for r in records if "error" in r]
    p = plan.QUICK
    available = [e for e in engines.ENGINES if engines.missing(e) is None]
    assert any(e.family == "llama.cpp" for e in available) and any(e.family == "transformers" for e in available), \
        "the test extra installs llama-cpp-python and transformers"
    for e in available:
        for t in p.threads:
            for r in range(p.rounds_at(t)):
                assert f"speed/{e.id}/t{t}/r{r}" in keys
        assert {f"cost/{e.id}/cold", f"cost/{e.id}/cached", f"accuracy/logits/{e.id}"} <= keys
    assert {"prepare", "accuracy/scores", "appended", "finished"} <= keys
    # the larger shapes' phase, on the tiny model: the first run, then the two engines alternating
    assert {"shape/quick/cold", "shape/quick/speed/nc-native/r0"} <= keys
    assert {f"shape/quick/speed/{e.id}/r0" for e in shapes.peers()} <= keys and shapes.peers()
    assert started(out) == [r["key"] for r in records if r["key"] not in ("appended", "finished")]
    assert not list(run.glob("logits-*.npy")) and not list(run.glob("scratch-*")), "big temporaries are removed"

    speed = {r["key"]: r["result"] for r in records if r["key"].startswith("speed/")}
    for key, result in speed.items():
        ops = [op for seq in plan.sequences(p, int(key.split("/")[2][1:])) for op in seq]
        assert set(result["tests"]) == {op["name"] for op in ops}  # the fills too: prefill at depth
        assert all(t["t_s"] > 0 for t in result["tests"].values())
        assert result["process"]["peak_rss_bytes"] > 10 * 2 ** 20

    doc = (tmp_path / "doc" / "BENCHMARKS.md").read_text()
    for section in ("## Speed", "### Depth", "### Prompt length", "### Threads", "## nanocompile against its peer",
                    "## The machine", "## Accuracy", "## Cost", "## Larger shapes", "Quick mode"):
        assert section in doc
    if engines.missing(engines.BY_ID["nc-native"]):  # its row is in every table, saying why
        assert doc.count("| nanocompile native | not built (issue 13) |") >= 6
        assert "nanocompile native / llama.cpp Q8_0 (the file) | — | — | not built (issue 13)" in doc
    for png in ("bars", "depth", "prompts", "ratios"):
        data = (tmp_path / "doc" / "benchmarks" / f"{png}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and f"benchmarks/{png}.png" in doc

    (summary,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert summary["bench"] == "report" and summary["machine"]["cpu"] and not summary["failures"]
    assert summary["ratios"]["nc-f32/llama-f32"][f"tg{p.tg} t2"]["n"] == p.rounds
    shape = summary["shapes"]["quick"]
    assert set(shape["ratios"]) == {e.id for e in shapes.peers()} and shape["cold"]["seconds"] > 0
    assert all(r[test]["n"] == p.shape_rounds for r in shape["ratios"].values() for test in ("pp", "tg"))
    scores = summary["accuracy"]["scores"]
    # float32 engines agree with the oracle far more closely than int8 does with its float32
    assert scores["nc-f32"]["hf-f32"]["kl_mean"] < 1e-6 < scores["nc-int8"]["nc-f32"]["kl_mean"]

    # an interruption leaves the records of what finished: drop some, as if it had stopped there
    dropped = {f"speed/{available[-1].id}/t2/r1", f"cost/{available[0].id}/cold", f"cost/{available[0].id}/cached"}
    kept = [r for r in records if r["key"] not in dropped | {"appended", "finished"}]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    out = quick(tmp_path)
    assert sorted(started(out)) == sorted(dropped)
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
