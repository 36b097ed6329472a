"""Metrics from the ranks (run/metrics.py): report() calls (node_side/report.py, shipped
as `distrun` into every rank), Hugging Face Trainer's log dicts, tqdm's progress bars and
their postfix, Keras' lines and the job's own patterns, stored bounded in metrics.jsonl
and shown by `metrics` and `inspect`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, run_cli, strict_json

from jupyter_dist.node_side.report import MARK
from jupyter_dist.run.metrics import MetricsSink, latest, read_metrics, summarize_metrics
from jupyter_dist.store import JobStore

# Every rank reports, draws a tqdm bar, and rank 0 prints what a HF Trainer prints.
TRAINING = """\
import os, time
from distrun import report          # shipped into every rank
from jupyter_dist import report as same_report
from tqdm import tqdm
rank = int(os.environ["RANK"])
for i in tqdm(range(30), mininterval=0):
    report(step=i, loss=1.0 / (i + 1) + rank, lr=0.1, note="not a number")
    time.sleep(0.01)
same_report(step=30, loss=0.0)
if rank == 0:
    import distrun, sys
    sys.stdout.write("a line "); sys.stdout.flush()  # report()'s line lands inside it
    report(step=31, loss=0.5); distrun.flush()
    print("in two writes", flush=True)
    print({'loss': 0.41, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.5})
    print({'not': 'a trainer line'})
print("done", rank)
"""


def _sink(tmp_path: Path, cap: int = 20_000) -> MetricsSink:
    record = JobStore(tmp_path / "jobs").create("j", "command: x\n", {"processes": []})
    return MetricsSink(record, cap=cap)


def test_report_lines_trainer_dicts_and_progress_bars_are_read(tmp_path):
    sink = _sink(tmp_path)
    line = MARK + json.dumps({"r": "3", "d": [[1.0, 7, {"loss": 0.5}], [2.0, None, {"x": 1}]]})
    assert sink.take("worker-0", "stdout", "before" + line, 5.0) == "before"
    assert sink.take("rank-0", "stdout", line, 5.0) is None  # all of it ours
    trainer = "{'loss': 0.41, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert sink.take("rank-0", "stdout", trainer, 6.0) == trainer  # still output
    assert sink.take("rank-0", "stdout", "{'a': 1}", 6.5) == "{'a': 1}"  # not a trainer's
    bar = " 10%|█   | 10/100 [00:01<00:09, 9.50it/s]\r 20%|██  | 20/100 [00:02<00:08, 9.80it/s]"
    sink.take("rank-1", "stderr", bar, 7.0)
    sink.take("rank-2", "stderr", "  3%|▎ | 3/100 [00:06<03:14, 2.00s/it]", 7.5)
    sink.take("rank-2", "stderr", "{'loss': 1}", 8.0)  # on stderr: not a trainer's log
    assert sink.latest == {"rank-3": {"loss": 0.5, "x": 1.0},
                           "rank-0": {"loss": 0.41, "grad_norm": 1.5, "learning_rate": 5e-05,
                                      "epoch": 0.5}}  # fmt: skip
    assert sink.progress == {"rank-1": (20, 100, 9.8), "rank-2": (3, 100, 0.5)}
    records, notes = read_metrics(sink.record)
    assert notes == [] and len(records) == 7
    assert records[0] == {"t": 1.0, "k": "rank-3", "s": 7, "m": {"loss": 0.5}}
    rows, reached = summarize_metrics(records)
    loss = next(row for row in rows if row["metric"] == "loss")
    assert (loss["first"], loss["last"], loss["points"], loss["ranks"]) == ("0.5", "0.41", 3, 2)
    assert reached == "3/100"  # the slowest rank's


def test_keras_lines_a_bars_postfix_and_the_jobs_own_patterns_are_read(tmp_path):
    """Keras' progress lines as model.fit writes them to a pipe (bold, redrawn with "\r"
    and "\b"; verbose=2's plain line), each epoch's values at the epoch its line said; a
    tqdm bar's postfix (Lightning's, less its v_num); and a pattern of the job's own
    (nanoGPT's line), its `step` the x-axis."""
    record = JobStore(tmp_path / "jobs").create("j", "command: x\n", {"processes": []})
    sink = MetricsSink(record, patterns=[r"iter (?P<step>\d+): loss (?P<loss>[\d.]+), "
                                         r"time (?P<ms>[\d.]+)ms"])  # fmt: skip
    bold = "\x1b[1m{}\x1b[0m"
    keras = (f"\r{bold.format('1/6')} \x1b[32m━━━\x1b[0m {bold.format('2s')} 511ms/step - "
             "accuracy: 0.6250 - loss: 0.6856" + "\b" * 20 + f"\r{bold.format('6/6')} ━━━━ "
             f"{bold.format('1s')} 56ms/step - accuracy: 0.4583 - loss: 0.7516 - "
             "val_accuracy: 0.5000 - val_loss: 0.7571")  # fmt: skip
    for line in (
        "Epoch 1/2",
        keras,
        "Epoch 2/2",
        "6/6 - 0s - 28ms/step - accuracy: 0.5208 - loss: 0.6835 - val_loss: 0.6999",
    ):
        assert sink.take("rank-0", "stdout", line, 1.0) == line  # still output
    sink.drawn("rank-1", keras.rsplit("\r", 1)[0], 2.0)  # mid-epoch: its progress only
    lightning = ("Epoch 0: 100%|██████████| 8/8 [00:00<00:00, 47.16it/s, v_num=0, "
                 "train_loss=0.532, lr=1e-05]")  # fmt: skip
    sink.take("rank-2", "stderr", lightning, 3.0)
    sink.take("rank-3", "stdout", "iter 10: loss 4.3277, time 62.03ms, mfu 0.00%", 4.0)
    sink.take("rank-3", "stdout", "iter 20: loss 3.9, time 61.5ms, mfu 0.00%", 5.0)
    records, _ = read_metrics(record)
    metrics = [(r["k"], r["s"], r["m"]) for r in records if "m" in r]
    assert metrics == [
        ("rank-0", 1, {"accuracy": 0.4583, "loss": 0.7516, "val_accuracy": 0.5,
                       "val_loss": 0.7571}),
        ("rank-0", 2, {"accuracy": 0.5208, "loss": 0.6835, "val_loss": 0.6999}),
        ("rank-2", None, {"train_loss": 0.532, "lr": 1e-05}),
        ("rank-3", 10, {"loss": 4.3277, "ms": 62.03}),
        ("rank-3", 20, {"loss": 3.9, "ms": 61.5}),
    ], metrics  # fmt: skip
    assert sink.progress["rank-0"][:2] == (6, 6) and sink.progress["rank-1"][:2] == (1, 6)
    assert sink.progress["rank-2"] == (8, 8, 47.16)


@pytest.mark.parametrize(
    ("pattern", "error"),
    [
        (
            "iter (?P<step>\\d+",
            "metrics.pattern 'iter (?P<step>\\\\d+' is not a regular expression",
        ),
        ("loss ([\\d.]+)", "names no metric: give each value a named group"),
        ("iter (?P<step>\\d+)", "names no metric"),
    ],
)
def test_a_metrics_pattern_that_is_no_regex_or_names_no_metric_is_one_line(
    pattern, error, tmp_path
):
    spec = tmp_path / "job.yml"
    spec.write_text("command: python x.py\n")
    for how in (("--metrics-pattern", pattern), ()):
        if not how:
            spec.write_text(json.dumps({"command": "python x.py", "metrics": {"pattern": pattern}}))
        done = run_cli("plan", str(spec), *how)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert error in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_trainer_values_printed_as_strings_are_read_as_numbers(tmp_path):
    """transformers 5 formats its floats (`f"{v:.4g}"`) before printing the dict."""
    sink = _sink(tmp_path)
    line = "{'loss': '5.378', 'grad_norm': '1.046', 'learning_rate': '5e-05', 'epoch': 1, "
    line += "'note': 'warm-up', 'flag': True}"
    assert sink.take("rank-0", "stdout", line, 1.0) == line
    assert sink.latest == {
        "rank-0": {"loss": 5.378, "grad_norm": 1.046, "learning_rate": 5e-05, "epoch": 1.0}
    }


def test_what_cannot_be_read_as_metrics_never_costs_a_line(tmp_path):
    sink = _sink(tmp_path)
    odd = [
        "  1%|▏ | 1/100 [00:01<00:09, 0.00s/it]",  # no rate to invert
        "{'loss': 1e999999, 'x': " + "[" * 200 + "]" * 200 + "}",  # too deep for Python
        "{'loss': " + "9" * 400 + "}",  # an int no float holds
    ]
    for text in odd:
        assert sink.take("rank-0", "stdout", text, 1.0) == text
    big = MARK + json.dumps({"r": "0", "d": [[1.0, 1, {"loss": 10**400}]]})
    assert sink.take("rank-0", "stdout", "kept " + big, 1.0) == "kept "
    assert sink.take("rank-0", "stdout", MARK + "{not json", 1.0) is None


@pytest.mark.slow
def test_a_value_that_is_not_finite_is_kept_by_its_name(tmp_path):
    """A loss gone to NaN, an infinity: stored as "NaN", "Infinity", "-Infinity", so that
    the file (and `metrics --json`, and the REST API) stays JSON any reader takes, where
    Python alone writes a bare NaN; the summary shows it, and a file written with bare NaN
    before still reads, as the name."""
    store = JobStore(tmp_path / "jobs")
    record = store.create(store.new_job_id(), "command: x\n", {"processes": []})
    sink = MetricsSink(record)
    values = [[1.0, 1, {"loss": 0.5}], [2.0, 2, {"loss": float("nan"), "ppl": float("inf")}]]
    sink.take("rank-0", "stdout", MARK + json.dumps({"r": "0", "d": values}), 2.0)
    sink.take("rank-1", "stdout", "{'loss': '-inf', 'learning_rate': 0.1}", 3.0)
    path = record.path / "metrics.jsonl"
    stored = [strict_json(line) for line in path.read_text().splitlines()]
    assert [entry["m"] for entry in stored] == [
        {"loss": 0.5},
        {"loss": "NaN", "ppl": "Infinity"},
        {"loss": "-Infinity", "learning_rate": 0.1},
    ]
    rows, _ = summarize_metrics(read_metrics(record)[0])
    loss = next(row for row in rows if row["metric"] == "loss")
    assert [loss[k] for k in ("first", "last", "min", "max", "points")] == [
        "0.5", "-inf", "-inf", "0.5", 3
    ]  # fmt: skip
    with path.open("a") as handle:  # as a file written before looked
        handle.write('{"t":4.0,"k":"rank-0","s":3,"m":{"loss":NaN}}\n')
    assert read_metrics(record)[0][-1]["m"] == {"loss": "NaN"}
    assert latest(record)["metrics"] == {"loss": "NaN", "ppl": "Infinity", "learning_rate": 0.1}
    shown = run_cli("metrics", record.job_id, "--json", store=store)
    assert shown.returncode == 0, shown.stderr
    lines = [strict_json(line) for line in shown.stdout.splitlines()]
    assert lines[-1] == {"time": 4.0, "rank": 0, "step": 3, "values": {"loss": "NaN"}}
    table = run_cli("metrics", record.job_id, store=store, env={**os.environ, "COLUMNS": "120"})
    assert re.search(
        r"loss\s+│\s+2\s+│\s+0\.5\s+│\s+nan\s+│\s+-inf\s+│\s+0\.5\s+│\s+4", table.stdout
    )


def test_a_keys_records_are_bounded_and_the_store_says_so(tmp_path):
    sink = _sink(tmp_path, cap=10)
    for step in range(45):
        payload = json.dumps({"r": "0", "d": [[float(step), step, {"loss": float(step)}]]})
        sink.take("rank-0", "stdout", MARK + payload, 0.0)
    records, notes = read_metrics(sink.record)
    steps = [r["s"] for r in records]
    assert steps[:10] == list(range(10))  # full rate up to the cap
    assert steps[10:15] == [10, 12, 14, 16, 18]  # then every 2nd
    assert steps[15:] == [20, 24, 28, 32, 36, 40]  # then every 4th, and from 40 every 8th
    assert notes == ["rank-0: over 10 records: from here every 2nd is kept",
                     "rank-0: over 20 records: from here every 4th is kept",
                     "rank-0: over 40 records: from here every 8th is kept"]  # fmt: skip
    assert sink.latest["rank-0"]["loss"] == 44.0  # the latest is always kept
    from jupyter_dist.run.metrics import _ordinal

    assert [_ordinal(n) for n in (2, 4, 16, 21, 32, 111, 1024)] == [
        "2nd", "4th", "16th", "21st", "32nd", "111th", "1024th"
    ]  # fmt: skip


def test_report_outside_a_job_does_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTRUN_")}
    done = subprocess.run(
        [sys.executable, "-c", "from jupyter_dist import report\nreport(step=1, loss=2.0)\n"
         "print('ok')"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert done.stdout == "ok\n"


@pytest.mark.slow
def test_a_jobs_metrics_are_stored_and_shown_without_their_lines_in_the_logs(store, tmp_path):
    spec = tmp_path / "train.yml"
    job = {"script": TRAINING, "resources": {"instance_count": 2},
           "distribution": {"type": "pytorch", "process_count_per_instance": 2}}  # fmt: skip
    spec.write_text(json.dumps(job))
    done = run_cli("run", str(spec), store=store, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "distrun-metrics" not in done.stdout + done.stderr
    (record,) = store.jobs()
    for key in record.log_keys():
        for line in record.iter_log(key, "stdout"):
            assert MARK.strip() not in line.text
    said = [line.text for line in record.iter_log("rank-0", "stdout")]
    assert "a line in two writes" in said, said  # the rank's line, whole, the report out of it
    records, _ = read_metrics(record)
    losses = {(r["k"], r["s"]): r["m"]["loss"] for r in records if "m" in r and "loss" in r["m"]}
    assert losses[("rank-3", 0)] == 4.0 and losses[("rank-2", 29)] == pytest.approx(2 + 1 / 30)
    assert losses[("rank-1", 30)] == 0.0  # `from jupyter_dist import report` too
    assert all("note" not in r.get("m", {}) for r in records)  # not a number: left out
    table = run_cli("metrics", record.job_id, store=store, env={**os.environ, "COLUMNS": "160"})
    assert table.returncode == 0
    assert "learning_rate" in table.stdout and "Progress reached: 30/30" in table.stdout
    csv = run_cli("metrics", record.job_id, "--csv", store=store).stdout.splitlines()
    assert csv[0] == "time,key,step,metric,value"
    assert sum(",loss," in row for row in csv) == 4 * 31 + 2
    lines = run_cli("metrics", record.job_id, "--json", store=store).stdout.splitlines()
    assert len(lines) == len(records)
    shown = [json.loads(line) for line in lines]  # in words: time, rank, step and values
    assert {"time", "rank", "step", "values"} <= set(shown[0]) or "progress" in shown[0]
    assert {(r["rank"], r["step"]) for r in shown if "loss" in r.get("values", {})} >= {
        (3, 0),
        (2, 29),
        (1, 30),
    }
    bars = [r for r in shown if "progress" in r]
    assert bars and set(bars[-1]) == {"time", "rank", "progress", "total", "rate"}
    inspected = run_cli("inspect", record.job_id, store=store, env={**os.environ, "COLUMNS": "160"})
    assert "Metrics (first, last, min and max over every rank)" in inspected.stdout
    none = run_cli("metrics", record.job_id, "--csv", "--json", store=store)
    assert none.returncode == 2


UNCHANGED_LOOPS = """\
import numpy as np, keras
from tqdm import tqdm
for it in range(0, 30, 10):  # nanoGPT's train.py prints this
    print(f"iter {it}: loss {4.5 - it / 10:.4f}, time 62.03ms, mfu 0.00%", flush=True)
with tqdm(range(4), mininterval=0) as bar:  # as Lightning draws its metrics
    for i in bar:
        bar.set_postfix(v_num=0, train_loss=1.0 / (i + 1))
x = np.random.rand(32, 4).astype("float32")
y = (x.sum(1) > 2).astype("int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=2, batch_size=8, verbose=1)
"""


@pytest.mark.slow
def test_curves_come_from_the_loops_people_write_with_no_code_change(store, tmp_path):
    """A TensorFlow job's rank, unchanged: Keras' model.fit (its lines as it writes them to
    the job's pipe), a tqdm bar's postfix, and nanoGPT's iteration lines named once with
    --metrics-pattern: each becomes the rank's curves."""
    (tmp_path / "loops.py").write_text(UNCHANGED_LOOPS)
    spec = tmp_path / "job.yml"
    spec.write_text(json.dumps({
        "command": "python loops.py", "code": str(tmp_path),
        "environment_variables": {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"},
        "distribution": {"type": "tensorflow", "worker_count": 1},
    }))  # fmt: skip
    pattern = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"
    done = run_cli("run", str(spec), "--metrics-pattern", pattern, store=store, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = store.jobs()
    records, _ = read_metrics(record)
    metrics = [(r["s"], sorted(r["m"])) for r in records if "m" in r]
    # The pattern's lines are stdout's, the bar's stderr's: in order within each stream.
    named = [m for m in metrics if m[1] == ["loss"]]
    assert named == [(0, ["loss"]), (10, ["loss"]), (20, ["loss"])], metrics
    assert [r["m"]["loss"] for r in records if r.get("s") in (0, 10, 20)] == [4.5, 3.5, 2.5]
    postfix = [r["m"]["train_loss"] for r in records if "train_loss" in r.get("m", {})]
    assert postfix and postfix[-1] == pytest.approx(0.25, abs=1e-3), postfix
    epochs = [(r["s"], sorted(r["m"])) for r in records if "accuracy" in r.get("m", {})]
    assert epochs == [(1, ["accuracy", "loss"]), (2, ["accuracy", "loss"])], records
    assert any(r.get("p") == [4, 4] for r in records)  # Keras' batches: 4 of 4


@pytest.mark.slow
def test_reports_from_torchrun_workers_are_each_ranks(store):
    """torchrun carries 2 ranks per process: each report is its rank's (RANK)."""
    from jupyter_dist.run.launch import run
    from jupyter_dist.spec import parse_spec

    spec = parse_spec(
        'command: python -c "from distrun import report; import os; '
        "report(step=2, rank=float(os.environ['RANK']))\"\n"
        "resources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2, launcher: torchrun}\n"
    )
    result = run(spec, store=store)
    assert result.ok, result.describe()
    records, _ = read_metrics(store.get(result.job_id))
    assert sorted((r["k"], r["m"]["rank"]) for r in records) == [
        (f"rank-{rank}", float(rank)) for rank in range(4)
    ]


@pytest.mark.slow
def test_a_hugging_face_trainer_run_gives_curves_and_progress_unchanged(store):
    """examples/hf_trainer.yml: a real Trainer (a tiny GPT-2 from a config) on 2 nodes x 2
    ranks with DDP, its script knowing nothing of jupyter-dist: what Trainer prints
    (values formatted as strings by newer transformers) becomes curves, its bar progress."""
    done = run_cli("run", str(EXAMPLES / "hf_trainer.yml"), store=store, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (record,) = store.jobs()
    assert len(record.status()["processes"]) == 4  # 2 nodes x 2 ranks
    records, notes = read_metrics(record)
    assert notes == []
    logged = [r for r in records if "m" in r and "loss" in r["m"]]
    assert len(logged) == 40 // 5  # every 5th of 40 steps, from rank 0 (the one that logs)
    assert {r["k"] for r in logged} == {"rank-0"}
    assert {"grad_norm", "learning_rate", "epoch"} <= set(logged[0]["m"])
    assert logged[-1]["m"]["learning_rate"] < logged[0]["m"]["learning_rate"]  # linear decay
    assert any("train_loss" in r.get("m", {}) for r in records)  # the run's summary line
    rows, reached = summarize_metrics(records)
    assert reached == "40/40"
    assert {"loss", "grad_norm", "learning_rate"} <= {row["metric"] for row in rows}


@pytest.mark.slow
def test_damaged_and_extreme_lines_cost_only_themselves_in_every_reader(tmp_path):
    """metrics.jsonl written by hand or damaged on disk: a progress count of 400 digits, a
    record with no rank, values that are a list, 1e400, an int no float holds. The job
    list (the REST API's `latest`), the summary, --json and --csv read the rest; the bar
    of 400 digits is output, not progress; --csv neutralises names a spreadsheet would run
    as formulas; the table writes out escape sequences instead of sending them."""
    store = JobStore(tmp_path / "jobs")
    record = store.create(store.new_job_id(), "command: x\n", {"processes": []})
    sink = MetricsSink(record)
    huge = "9" * 400
    bar = f" 5%|▌ | {huge}/1000 [00:01<00:09, 1.00it/s]"
    assert sink.take("rank-0", "stderr", bar, 1.0) == bar and sink.progress == {}
    formulas = ["=cmd|' /C calc'!A0", "+SUM(1,1)", "@A1", "-2+3", "\x1b[31mred\x1b[0m"]
    payload = {"r": "1", "d": [[1.0, 1, {"loss": 0.5, **dict.fromkeys(formulas, 1.0)}]]}
    sink.take("rank-1", "stdout", MARK + json.dumps(payload), 1.0)
    with (record.path / "metrics.jsonl").open("a") as handle:
        for line in (
            f'{{"t":2,"k":"rank-0","p":[{huge},1000],"r":1}}',
            '{"m":{"loss":1}}',
            '{"t":2,"k":"rank-0","s":1,"m":[1,2]}',
            '{"t":2,"k":"rank-0","s":2,"m":{"loss":1e400}}',
            f'{{"t":2,"k":"rank-0","s":3,"m":{{"loss":{huge}}}}}',
            '{"t":3,"k":"rank-1","p":[3,10],"r":1.0}',
        ):
            handle.write(line + "\n")
    assert latest(record) == {
        "metrics": {"loss": "Infinity", **dict.fromkeys(formulas, 1.0)},
        "progress": "3/10",
    }
    records, _ = read_metrics(record)
    assert [r.get("m", {}).get("loss") for r in records] == [0.5, "Infinity", None]
    rows, reached = summarize_metrics(records)
    assert reached == "3/10" and {r["metric"] for r in rows} == {"loss", *formulas}
    shown = run_cli("metrics", record.job_id, "--json", store=store)
    assert shown.returncode == 0, shown.stderr
    assert len([strict_json(line) for line in shown.stdout.splitlines()]) == 3
    table = run_cli("metrics", record.job_id, store=store, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "\x1b" not in table.stdout and "\\x1b[31mred\\x1b[0m" in table.stdout
    csv_out = run_cli("metrics", record.job_id, "--csv", store=store)
    assert csv_out.returncode == 0, csv_out.stderr
    import csv

    cells = list(csv.reader(csv_out.stdout.splitlines()))
    names = {row[3] for row in cells[1:]}
    assert {"'=cmd|' /C calc'!A0", "'+SUM(1,1)", "'@A1", "'-2+3", "loss"} <= names
    assert not any(cell.startswith(("=", "+", "@")) for row in cells for cell in row)


def test_report_keeps_every_step_of_many_names_and_leaves_out_what_is_no_number(tmp_path):
    """Per-layer metrics (100 names a step, 600 steps, flushed 512 calls at a time) and one
    name of 1.5 MB: every step's values arrive, in lines the launcher never cuts, and no
    fragment becomes output; strings, bytes and bools are left out, a bool step is none."""
    script = (
        "from distrun import report\n"
        "for step in range(600):\n"
        "    report(step=step, **{f'layer{i}.grad_norm': step + i / 100 for i in range(100)})\n"
        "report(step=True, s='2.5', b=b'1.5', t=True, kept=1.0)\n"
        "report(step=601, **{'x' * 1_500_000: 1.0, 'fine': 2.0})\n"
        "print('done')\n"
    )
    hook = tmp_path / "pyhook"
    hook.mkdir()
    (hook / "distrun.py").write_text(
        (Path(__file__).parents[1] / "jupyter_dist/node_side/report.py").read_text()
    )
    env = {**os.environ, "DISTRUN_JOB_ID": "j", "RANK": "0", "PYTHONPATH": str(hook)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, check=True
    ).stdout
    sink = _sink(tmp_path)
    from jupyter_dist.run.output import MAX_LINE

    kept = []
    for line in out.decode().rstrip("\n").split("\n"):  # as the launcher cuts lines
        assert len(line.encode()) < MAX_LINE
        text = sink.take("rank-0", "stdout", line, 1.0)
        if text is not None:
            kept.append(text)
    assert kept == ["done"]
    records, _ = read_metrics(sink.record)
    steps = {}
    for r in records:
        steps.setdefault(r["s"], {}).update(r["m"])
    assert sorted(s for s in steps if s is not None) == [*range(600), 601]
    assert all(len(steps[s]) == 100 for s in range(600))
    assert steps[None] == {"kept": 1.0} and steps[601] == {"fine": 2.0}


def test_a_job_keeps_its_first_thousand_metric_names_and_says_so(tmp_path):
    """A metric per sample (300k names made `metrics` take 31 s and print 58k rows): past
    MAX_NAMES the later names are left out, said once in the file's notes; the first
    names keep every value."""
    from jupyter_dist.run.metrics import MAX_NAMES

    sink = _sink(tmp_path)
    for step in range(3):
        values = {f"sample{i}": float(i) for i in range(MAX_NAMES + 500)}
        payload = json.dumps({"r": "0", "d": [[float(step), step, values]]})
        sink.take("rank-0", "stdout", MARK + payload, 0.0)
    records, notes = read_metrics(sink.record)
    names = {name for record in records for name in record["m"]}
    assert len(names) == MAX_NAMES and "sample0" in names and f"sample{MAX_NAMES}" not in names
    assert [r["s"] for r in records] == [0, 1, 2]
    assert notes == [f"over {MAX_NAMES} metric names: later ones are left out (the first: "
                     f"'sample{MAX_NAMES}')"]  # fmt: skip
    rows, _ = summarize_metrics(records)
    assert len(rows) == MAX_NAMES
