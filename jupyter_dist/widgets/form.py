"""The submission form: every option of `%%distrun` as a control, a live YAML preview with
the spec loader's own error messages, and Submit, which runs the magic's own path.

It looks like JupyterLab: controls in two columns that fold into one on a narrow page,
the preview and the problem line drawn with JupyterLab's own CSS variables (light and dark
themes)."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import ipywidgets as w
from IPython.display import display

from jupyter_dist.backends import available, declared_options
from jupyter_dist.diagnose.stall import DEFAULT_STALL_TIMEOUT_S
from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.export import FORMATS, Exported, ExportTarget, export, write
from jupyter_dist.nodes import Inventory, load_inventory
from jupyter_dist.options import BY_NAME, FORM, LaunchOptions, Option, offered
from jupyter_dist.run.job import GRACE_PERIOD_S, RESTART_DELAY_S
from jupyter_dist.spec import JOB_TYPES, JobSpec, spec_from_dict
from jupyter_dist.store import JobStore
from jupyter_dist.widgets.live import run_with_view

_LAUNCHERS = {"pytorch": ["per_process", "torchrun"], "mpi": ["mpirun", "horovodrun"]}

# How the form shows a declared option (options.OPTIONS) where the declaration alone does not
# say: the value a control starts at, the value that means "the spec's default" (not written
# into the spec), a caption and a placeholder. Every other option is a plain control of its
# kind, captioned by its name, with its help as the tooltip.
_START = {
    "nodes": 1,
    "procs_per_node": 1,
    "stall_timeout": DEFAULT_STALL_TIMEOUT_S,
    "grace_period": int(GRACE_PERIOD_S),
    "restart_delay": int(RESTART_DELAY_S),
}
_UNSET = {
    "worker_count": 0,
    "ps_count": 0,
    "threads": 0,
    "scheduler_port": 0,
    "dashboard_port": 0,
    "timeout": 0,
    "stall_timeout": DEFAULT_STALL_TIMEOUT_S,
    "grace_period": int(GRACE_PERIOD_S),
    "on_stall": "warn",
    "max_restarts": 0,
    "restart_delay": int(RESTART_DELAY_S),
}
_CAPTIONS = {
    "procs_per_node": "procs per node",
    "worker_count": "workers (0: nodes)",
    "threads": "threads (0: default)",
    "scheduler_port": "scheduler port (0: free)",
    "dashboard_port": "dashboard port (0: free)",
    "gpus_per_node": "GPUs per node (0: none)",
    "stall_timeout": "stall timeout (s)",
    "grace_period": "grace period (s)",
    "timeout": "timeout (s)",
    "max_restarts": "restarts (max)",
    "restart_delay": "restart delay (s)",
    "ps_count": "parameter servers",
    "name": "job name",
    "code": "code folder",
    "env": "environment",
    "slurm_job": "allocation",
    "detach": "keep running when the notebook closes",
    "no_preflight": "skip the network check",
    "post_mortem": "pause a failed rank for the debugger",
    "preload": "preload modules",
    "metrics_pattern": "metrics patterns",
}
_PLACEHOLDERS = {
    "env": "NAME=VALUE, one a line",
    "code": "folder shipped to every node (optional)",
    "slurm_job": "a job id to run in (else a new allocation)",
    "partition": "the cluster's default",
    "time": "e.g. 01:00:00 (the partition's default)",
    "account": "your default account",
    "qos": "the default QOS",
    "constraint": "node features, e.g. a100",
    "preload": "e.g. torch,transformers (ranks fork from a pool)",
    "metrics_pattern": "a regex a line, e.g. iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)",
}
# Where each declared option sits: the first column, the second, and the Slurm box.
_DISTRIBUTION = ("type", "nodes", "procs_per_node", "launcher")
_TENSORFLOW = ("worker_count", "ps_count", "chief", "evaluator")
_DASK = ("threads", "scheduler_port", "dashboard_port")
_JOB = (
    "name",
    "timeout",
    "stall_timeout",
    "on_stall",
    "grace_period",
    "max_restarts",
    "restart_delay",
    "no_preflight",
    "post_mortem",
    "preload",
    "metrics_pattern",
    "code",
    "env",
)


def _control(option: Option, style: dict) -> w.Widget:
    """The control of a declared option: a dropdown for choices, a checkbox for a flag, a
    bounded number (the spec's own caps; 0 where 0 means the default), a text area for a
    repeatable one, else a text box."""
    common = {
        "description": _CAPTIONS.get(option.name, option.name.replace("_", " ")),
        "tooltip": option.full_help,
    }
    if option.kind == "flag":
        return w.Checkbox(value=False, **common)
    common["style"] = style
    if option.choices:
        start = _UNSET.get(option.name, option.choices[0])
        return w.Dropdown(options=option.choices, value=start, **common)
    if option.kind == "int":
        low, high = option.bounds or (0, 10**7)
        start = _START.get(option.name, _UNSET.get(option.name, low))
        return w.BoundedIntText(value=start, min=min(low, 0), max=high, **common)
    placeholder = _PLACEHOLDERS.get(option.name, "")
    if option.kind == "list":
        return w.Textarea(placeholder=placeholder, **common)
    return w.Text(placeholder=placeholder, **common)


def _value(option: Option, control: w.Widget) -> Any:
    """What a control holds, as LaunchOptions takes it; None for "the spec's default"."""
    value = control.value
    if option.kind == "list":
        return [line.strip() for line in value.splitlines() if line.strip()]
    if isinstance(value, str):
        value = value.strip()
    if value == "" or (option.name in _UNSET and value == _UNSET[option.name]):
        return None
    if option.backend and option.kind == "int" and value == 0:
        return None  # a backend's number left at 0 is its default (GPUs: none)
    return value


class SubmitForm(w.VBox):
    """`%distrun form`, or `jupyter_dist.widgets.form.SubmitForm()`."""

    def __init__(self, nodes_file: str | None = None, **kwargs):
        self.nodes_file = nodes_file
        try:
            self.inventory = load_inventory(nodes_file)
        except DistrunError as exc:
            self.inventory, inventory_problem = Inventory(), str(exc)
        else:
            inventory_problem = ""
        style = {"description_width": "140px"}
        # Every option the form offers, declared once (options.OPTIONS, and each backend's
        # own); the type, the launcher and the backend have controls of their own (their
        # choices come from the job type and the registry).
        self.declared = offered(FORM, declared_options())
        self.controls: dict[str, w.Widget] = {
            "type": w.Dropdown(
                options=JOB_TYPES,
                value="pytorch",
                description="type",
                style=style,
                tooltip=BY_NAME["type"].full_help,
            ),
            "launcher": w.Dropdown(
                options=_LAUNCHERS["pytorch"],
                description="launcher",
                style=style,
                tooltip=BY_NAME["launcher"].full_help,
            ),
            "backend": w.Dropdown(
                # "" (not None, which a Dropdown shows as no choice at all): automatic
                options=[("automatic", "")] + [(name, name) for name in sorted(available())],
                value="",
                description="backend",
                style=style,
                tooltip=BY_NAME["backend"].full_help,
            ),
        }
        for option in self.declared:
            self.controls.setdefault(option.name, _control(option, style))
        c = self.controls
        self.type, self.launcher, self.backend = c["type"], c["launcher"], c["backend"]
        self.nodes, self.procs_per_node, self.env = c["nodes"], c["procs_per_node"], c["env"]
        self.worker_count, self.ps_count = c["worker_count"], c["ps_count"]
        self.chief, self.evaluator, self.code = c["chief"], c["evaluator"], c["code"]
        self.timeout, self.name = c["timeout"], c["name"]
        # A backend's own options, shown while it is chosen.
        self.backend_boxes = {
            name: w.VBox([c[o.name] for o in self.declared if o.backend == name])
            for name in dict.fromkeys(o.backend for o in self.declared if o.backend)
        }
        self.slurm = {o.name: c[o.name] for o in self.declared if o.backend == "slurm"}
        self.node_names = w.SelectMultiple(
            options=[n.name for n in self.inventory.nodes],
            description="nodes to use",
            style=style,
            disabled=self.inventory.is_local,
        )
        self.script = w.Textarea(
            placeholder="Python code every process runs",
            description="code",
            style=style,
            layout=w.Layout(width="95%", height="10em"),
        )
        self.script_path = w.Text(
            placeholder="or a script file to run (python FILE)",
            description="script file",
            style=style,
        )
        self.preview = w.HTML(layout=w.Layout(width="95%"))
        self.problem = w.HTML(_problem_html(inventory_problem))
        self.submit_button = w.Button(description="Submit", button_style="primary")
        # Export: the same job written for another scheduler (nothing runs). Three to a row,
        # each as wide as its column.
        narrow = {"style": {"description_width": "56px"}, "layout": w.Layout(width="auto")}
        self.export_format = w.Dropdown(
            options=list(FORMATS), value="sbatch", description="format", **narrow
        )
        self.export_to = w.Text(
            description="to", placeholder="a file, or a folder ending in / (this folder)", **narrow
        )
        self.image = w.Text(
            description="image", placeholder="container image (kubeflow, jobset, ...)", **narrow
        )
        self.export_button = w.Button(
            description="Export", tooltip="write the job for that scheduler; runs nothing"
        )
        self.output = w.Output()
        self.last_result = None
        self.submit_button.on_click(lambda _: self.submit())
        self.export_button.on_click(lambda _: self.export())
        for control in [*self.controls.values(), self.node_names, self.script, self.script_path]:
            control.observe(lambda _: self.refresh(), names="value")
        self.tf_box = w.VBox([c[name] for name in _TENSORFLOW])
        self.dask_box = w.VBox([c[name] for name in _DASK])
        columns = w.GridBox(
            [
                w.VBox(
                    [
                        _heading("Distribution"),
                        *(c[name] for name in _DISTRIBUTION),
                        self.tf_box,
                        self.dask_box,
                        self.node_names,
                    ]
                ),
                w.VBox(
                    [
                        _heading("Job"),
                        *(c[name] for name in _JOB),
                        _heading("Where it runs"),
                        self.backend,
                        *self.backend_boxes.values(),
                    ]
                ),
            ],
            layout=w.Layout(
                grid_template_columns="repeat(auto-fit, minmax(380px, 1fr))", grid_gap="0 24px"
            ),
        )
        super().__init__(
            [
                _title(),
                columns,
                _heading("Code"),
                self.script,
                self.script_path,
                _heading("Job spec (YAML)"),
                self.preview,
                _heading("Export to another scheduler (runs nothing)"),
                w.GridBox(
                    [self.export_format, self.export_to, self.image],
                    layout=w.Layout(
                        grid_template_columns="repeat(auto-fit, minmax(240px, 1fr))",
                        grid_gap="0 16px",
                        width="95%",
                    ),
                ),
                self.problem,
                w.HBox([self.submit_button, self.export_button, c["detach"]]),
                self.output,
            ],
            layout=w.Layout(
                padding="4px 8px",
                border="var(--jp-border-width, 1px) solid var(--jp-border-color2, #ddd)",
            ),
            **kwargs,
        )
        self.refresh()

    def options(self) -> LaunchOptions:
        """The controls as the magic's options (one model, the same meaning): each declared
        option whose control holds a value, where it applies (this job type, the backend
        chosen: a hidden control's value does not count)."""
        job_type, backend = self.type.value, self.backend.value or None
        values: dict[str, Any] = {"backend_options": {}}
        for option in self.declared:
            if option.job_types and job_type not in option.job_types:
                continue
            if option.backend and backend != option.backend:
                continue
            value = _value(option, self.controls[option.name])
            if option.backend:
                if value not in (None, False):  # an unticked flag is not given
                    values["backend_options"][option] = value
            elif value is not None:
                values[option.name] = value
        if self.node_names.value:
            values["nodes"] = len(self.node_names.value)
        return LaunchOptions(**values)

    def spec(self) -> JobSpec:
        """The job these controls describe, validated like a YAML file (SpecError if not)."""
        if not self.script.value.strip() and not self.script_path.value.strip():
            raise SpecError("code: write the code every process runs, or give a script file")
        spec = self.options().to_spec(self.script.value, base_dir=os.getcwd(), source="form")
        extra = {}
        if self.script_path.value.strip():
            extra["command"] = f"python {Path(self.script_path.value.strip()).expanduser()}"
        if self.node_names.value:
            extra["nodes"] = list(self.node_names.value)
        if extra:
            spec = spec_from_dict({**spec.to_dict(), **extra}, base_dir=os.getcwd(), source="form")
        return spec

    def refresh(self) -> JobSpec | None:
        """Show the YAML, or what is wrong; returns the spec when it is valid."""
        job_type = self.type.value
        self.tf_box.layout.display = None if job_type == "tensorflow" else "none"
        self.dask_box.layout.display = None if job_type == "dask" else "none"
        self.procs_per_node.disabled = job_type == "tensorflow"
        launchers = _LAUNCHERS.get(job_type, [])
        if list(self.launcher.options) != launchers:
            self.launcher.options = launchers
        self.launcher.disabled = not launchers
        for name, box in self.backend_boxes.items():
            box.layout.display = None if self.backend.value == name else "none"
        try:
            spec = self.spec()
        except DistrunError as exc:
            self.problem.value = _problem_html(str(exc))
            self.submit_button.disabled = self.export_button.disabled = True
            return None
        self.preview.value = _code_html(spec.to_yaml())
        self.problem.value = ""
        self.submit_button.disabled = self.export_button.disabled = False
        return spec

    def submit(self):
        """Run the job exactly as `%%distrun` would, its live view below the form."""
        spec = self.refresh()
        if spec is None:
            return None
        self.output.clear_output()
        if self.options().detach:
            return self._detach(spec)
        with self.output:
            try:
                inventory = self.inventory if not self.inventory.is_local else None
                _, result, _ = run_with_view(spec, inventory)
            except DistrunError as exc:
                self.problem.value = _problem_html(str(exc))
                return None
            if not result.ok:
                print(result.describe())
        self.last_result = result
        return result

    def _detach(self, spec: JobSpec) -> str | None:
        """Start the job under a supervisor of its own, as `%%distrun --detach` does; its
        id and how to follow it show below the form. Returns the job's id."""
        from jupyter_dist.run.supervisor import detach

        try:
            detached = detach(spec, store=JobStore(), cwd=os.getcwd(), nodes_file=self.nodes_file)
        except DistrunError as exc:
            self.problem.value = _problem_html(str(exc))
            return None
        said = (
            f"Job {detached.job_id}: {detached.summary}; every rank runs, detached: it runs "
            f"on when this notebook closes. Follow it: %distrun attach {detached.job_id}; "
            f"stop it: %distrun cancel {detached.job_id}"
        )
        with self.output:
            display(w.HTML(html.escape(said)))
        return detached.job_id

    def export(self) -> Exported | None:
        """Write the job as the format chosen, as `%%distrun --export` does; the files
        written and the manifest show below the form, a problem in its problem line."""
        spec = self.refresh()
        if spec is None:
            return None
        try:
            target = ExportTarget.at(
                self.export_to.value.strip() or None,
                stem=self.name.value.strip() or None,
                image=self.image.value.strip() or None,
                source="the form",
            )
            exported = export(spec, self.export_format.value, target)
            written = write(exported)
        except DistrunError as exc:
            self.problem.value = _problem_html(str(exc))
            return None
        self.output.clear_output()
        names = ", ".join(path.name for path in written)
        said = f"Wrote {names} in {exported.folder}; run it with: {exported.how_to_run()}"
        for note in exported.notes():
            said += f". {note}"
        with self.output:
            display(
                w.VBox(
                    [
                        w.HTML(html.escape(said)),
                        w.HTML(_code_html(exported.files[exported.manifest])),
                    ]
                )
            )
        return exported


def _problem_html(message: str) -> str:
    if not message:
        return ""
    return f'<span style="color: var(--jp-error-color1, #d32f2f)">{html.escape(message)}</span>'


def _code_html(text: str) -> str:
    """Text as a code block in JupyterLab's look (the preview of the spec)."""
    style = (
        "margin: 0; padding: 6px 8px; max-height: 16em; overflow: auto;"
        "font-family: var(--jp-code-font-family, monospace);"
        "font-size: var(--jp-code-font-size, 12px);"
        "color: var(--jp-content-font-color1, inherit);"
        "background: var(--jp-cell-editor-background, #f7f7f7);"
        "border: 1px solid var(--jp-cell-editor-border-color, #e0e0e0);"
        "border-radius: var(--jp-border-radius, 2px);"
    )
    return f'<pre class="distrun-form-preview" style="{style}">{html.escape(text)}</pre>'


def _title() -> w.HTML:
    return w.HTML(
        '<div style="font-size: var(--jp-ui-font-size2, 15px); font-weight: 600;'
        'color: var(--jp-ui-font-color0, inherit); margin: 2px 0 4px">'
        "Run a distributed job</div>"
    )


def _heading(text: str) -> w.HTML:
    return w.HTML(
        '<div style="font-size: var(--jp-ui-font-size0, 11px); font-weight: 600;'
        "text-transform: uppercase; letter-spacing: 0.04em;"
        f'color: var(--jp-ui-font-color2, #666); margin: 8px 0 2px">{html.escape(text)}</div>'
    )
