"""Secret-looking variables are masked in every view (dry run, plan, REST) while the
processes still get them."""

from __future__ import annotations

import json
import re

import pytest
from helpers import execute_notebook, run_cli, stream_text

from jupyter_dist.masking import is_secret, masked_plan
from jupyter_dist.run.launch import run
from jupyter_dist.spec import load_spec

SPEC = """\
command: echo "got $HF_TOKEN"
environment_variables: {HF_TOKEN: hf_abcdef123, DB_PASSWORD: pw-98765, MY_VAR: visible}
distribution: {type: pytorch, process_count_per_instance: 2}
"""
SECRETS = ("hf_abcdef123", "pw-98765")


@pytest.mark.slow
def test_plan_masks_secret_values_in_its_table_commands_and_json(tmp_path, store):
    (tmp_path / "job.yml").write_text(SPEC)
    for extra in ([], ["--json"]):
        done = run_cli("plan", str(tmp_path / "job.yml"), *extra, store=store)
        assert done.returncode == 0, done.stderr
        assert "HF_TOKEN=****" in done.stdout or '"HF_TOKEN": "****"' in done.stdout
        assert "visible" in done.stdout and not any(s in done.stdout for s in SECRETS)


@pytest.mark.slow
def test_the_dry_run_masks_them_and_the_job_still_gets_them(tmp_path, kernel_env, store):
    nb = execute_notebook(
        "%%distrun --dry-run --env HF_TOKEN=hf_abcdef123 --env MY_VAR=visible\nprint(1)"
    )
    shown = stream_text(nb.cells[1])
    assert "HF_TOKEN: '****'" in shown and "MY_VAR: visible" in shown
    assert "hf_abcdef123" not in shown
    (tmp_path / "job.yml").write_text(SPEC)
    result = run(load_spec(tmp_path / "job.yml"), store=store)
    lines = [line.text for line in store.get(result.job_id).iter_log("rank-0", "stdout")]
    assert lines == ["got hf_abcdef123"]  # the process has the real value
    shown_plan = json.dumps(masked_plan(store.get(result.job_id).plan()))
    assert not any(s in shown_plan for s in SECRETS) and "visible" in shown_plan


def test_which_names_are_secret_is_configurable(monkeypatch):
    assert is_secret("HF_TOKEN") and is_secret("aws_secret_access_key") and not is_secret("RANK")
    monkeypatch.setenv("DISTRUN_SECRET_NAMES", "WANDB_*, *_PASS")
    assert is_secret("WANDB_API") and is_secret("db_pass") and not is_secret("HF_TOKEN")


# Values a view must never print, whatever their quoting: a quote inside (a shell writes
# it as '"'"'), two characters, a token that the command holds as well.
HOSTILE = """\
command: HF_TOKEN=hf_inline_77 python -c "print('run with hf_zyx-321')"
environment_variables:
  AWS_SECRET_ACCESS_KEY: "aws'quoted'secret"
  API_KEY: "ab"
  HF_TOKEN: hf_zyx-321
  MY_VAR: visible
distribution: {type: pytorch, process_count_per_instance: 2}
"""
HOSTILE_VALUES = ("aws'quoted'secret", "quoted'\"'\"'secret", "hf_zyx-321", "hf_inline_77")


def _leaks(text: str) -> list[str]:
    leaks = [value for value in HOSTILE_VALUES if value in text]
    return leaks + (["ab"] if re.search(r"(?<!\w)ab(?!\w)", text) else [])


@pytest.mark.slow
def test_hostile_values_are_masked_in_every_view(tmp_path, store):
    """plan's table and commands, plan --json, the REST spec and plan: no secret shows,
    quoted by a shell, JSON-escaped, two characters long, or held by the command too."""
    from jupyter_dist.masking import masked_spec
    from jupyter_dist.spec import parse_spec

    (tmp_path / "job.yml").write_text(HOSTILE)
    for extra in ([], ["--json"]):
        done = run_cli("plan", str(tmp_path / "job.yml"), *extra, store=store)
        assert done.returncode == 0, done.stderr
        assert _leaks(done.stdout) == [] and "visible" in done.stdout
    spec = parse_spec(HOSTILE)
    shown_spec = json.dumps(masked_spec(spec.to_dict()))
    assert _leaks(shown_spec) == [] and "HF_TOKEN=****" in shown_spec
    result = run(spec, store=store)
    assert result.ok, result.describe()
    lines = [line.text for line in store.get(result.job_id).iter_log("rank-0", "stdout")]
    assert lines == ["run with hf_zyx-321"]  # the processes still get every value
    shown_plan = json.dumps(masked_plan(store.get(result.job_id).plan()))
    assert _leaks(shown_plan) == [] and "visible" in shown_plan
