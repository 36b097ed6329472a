"""Strict checks of Kubernetes manifests against the models that Kubeflow's and
Kubernetes' own Python packages carry (no API server runs here): every key must be a field
of its model (an unknown or misspelt one fails), every value of its type, every required
field there, and the enumerations the operators document hold.

- `kubeflow.org/v1` kinds: kubeflow-training's models (PyTorchJob, TFJob, MPIJob, ...), with
  the pods' fields from the kubernetes client's models (V1PodTemplateSpec, ...): classes
  with `openapi_types` and `attribute_map`, whose constructors refuse a missing required
  field.
- JobSet (`jobset.x-k8s.io/v1alpha2`): kubeflow-trainer-api's pydantic models, whose
  validation checks types, required fields and enums once the keys are known.
- ConfigMap: the kubernetes client's V1ConfigMap.
"""

from __future__ import annotations

import re
import typing
from typing import Any

# Enumerations of the operators' APIs that their Python models leave unchecked
# (kubeflow/training-operator pkg/apis/kubeflow.org/v1: ReplicaSpec, RunPolicy, TFJobSpec),
# and the replica types each kind knows.
ENUMS = {
    ("KubeflowOrgV1ReplicaSpec", "restart_policy"): {"Always", "OnFailure", "Never", "ExitCode"},
    ("KubeflowOrgV1RunPolicy", "clean_pod_policy"): {"All", "Running", "None"},
    ("KubeflowOrgV1MPIJobSpec", "clean_pod_policy"): {"All", "Running", "None"},
    ("KubeflowOrgV1TFJobSpec", "success_policy"): {"", "AllWorkers"},
    ("V1PodSpec", "restart_policy"): {"Always", "OnFailure", "Never"},
    ("V1Container", "image_pull_policy"): {"Always", "Never", "IfNotPresent"},
}
REPLICA_TYPES = {
    "PyTorchJob": ("pytorch_replica_specs", {"Master", "Worker"}),
    "TFJob": ("tf_replica_specs", {"Chief", "Master", "Worker", "PS", "Evaluator"}),
    "MPIJob": ("mpi_replica_specs", {"Launcher", "Worker"}),
}
OPENAPI_KINDS = {
    ("kubeflow.org/v1", "PyTorchJob"): "KubeflowOrgV1PyTorchJob",
    ("kubeflow.org/v1", "TFJob"): "KubeflowOrgV1TFJob",
    ("kubeflow.org/v1", "MPIJob"): "KubeflowOrgV1MPIJob",
    ("v1", "ConfigMap"): "V1ConfigMap",
}


class Invalid(Exception):
    """A manifest that does not fit its schema; the message says where and why."""


def check(document: dict) -> None:
    """Check one resource (a parsed YAML document) strictly; Invalid if it does not fit."""
    key = (document.get("apiVersion"), document.get("kind"))
    if key == ("jobset.x-k8s.io/v1alpha2", "JobSet"):
        from kubeflow_trainer_api.models import JobsetV1alpha2JobSet

        _check_pydantic(document, JobsetV1alpha2JobSet, "JobSet")
        try:
            JobsetV1alpha2JobSet.from_dict(document)
        except Exception as exc:  # pydantic's ValidationError: types, required, enums
            raise Invalid(f"JobSet: {exc}") from None
        return
    if key not in OPENAPI_KINDS:
        raise Invalid(f"unknown apiVersion/kind: {key}")
    _check_openapi(document, OPENAPI_KINDS[key], key[1])
    if key[1] in REPLICA_TYPES:
        field, allowed = REPLICA_TYPES[key[1]]
        replicas = document["spec"].get(_json_key("Kubeflow" + key[1], field), {})
        unknown = set(replicas) - allowed
        if unknown:
            raise Invalid(f"{key[1]}: unknown replica type {sorted(unknown)}; valid: {allowed}")


def _model(name: str):
    from kubeflow.training import models as kubeflow
    from kubernetes.client import models as k8s

    found = getattr(kubeflow, name, None) or getattr(k8s, name, None)
    if found is None:
        raise Invalid(f"no model {name}")
    return found


def _json_key(_cls: str, attr: str) -> str:
    head, *rest = attr.split("_")
    return head + "".join(part.title() for part in rest)


def _check_openapi(value: Any, type_name: str, where: str) -> None:
    """`value` against an openapi-generator type string ('str', 'list[V1Container]',
    'dict(str, KubeflowOrgV1ReplicaSpec)', a model's name)."""
    if type_name in ("str", "datetime"):
        if not isinstance(value, str):
            raise Invalid(f"{where}: expected a string, found {value!r}")
        return
    if type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise Invalid(f"{where}: expected an integer, found {value!r}")
        return
    if type_name == "bool":
        if not isinstance(value, bool):
            raise Invalid(f"{where}: expected true or false, found {value!r}")
        return
    if type_name == "object":
        return
    listed = re.fullmatch(r"list\[(.+)\]", type_name)
    if listed:
        if not isinstance(value, list):
            raise Invalid(f"{where}: expected a list, found {value!r}")
        for i, item in enumerate(value):
            _check_openapi(item, listed.group(1), f"{where}[{i}]")
        return
    mapped = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if mapped:
        if not isinstance(value, dict):
            raise Invalid(f"{where}: expected a mapping, found {value!r}")
        for k, item in value.items():
            _check_openapi(item, mapped.group(1), f"{where}.{k}")
        return
    cls = _model(type_name)
    if not isinstance(value, dict):
        raise Invalid(f"{where}: expected a mapping ({type_name}), found {value!r}")
    by_key = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in by_key:
            raise Invalid(f"{where}: unknown field {key!r} in {type_name}")
        attr = by_key[key]
        _check_openapi(item, cls.openapi_types[attr], f"{where}.{key}")
        allowed = ENUMS.get((type_name, attr))
        if allowed is not None and item not in allowed:
            raise Invalid(f"{where}.{key}: {item!r} is not one of {sorted(allowed)}")
    try:  # the generated constructors refuse a missing required field
        cls(**{by_key[k]: v for k, v in value.items()})
    except ValueError as exc:
        raise Invalid(f"{where}: {exc}") from None


def _check_pydantic(value: Any, model, where: str) -> None:
    """Every key of `value` is a field (by its alias) of `model`, all the way down."""
    if not isinstance(value, dict):
        raise Invalid(f"{where}: expected a mapping, found {value!r}")
    fields = {(f.alias or name): f.annotation for name, f in model.model_fields.items()}
    for key, item in value.items():
        if key not in fields:
            raise Invalid(f"{where}: unknown field {key!r} in {model.__name__}")
        _check_annotation(item, fields[key], f"{where}.{key}")


def _check_annotation(value: Any, annotation: Any, where: str) -> None:
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and str(origin) == "types.UnionType"):
        inner = [a for a in args if a is not type(None)]
        if value is not None and len(inner) == 1:
            _check_annotation(value, inner[0], where)
        return
    if origin in (list, typing.List) and isinstance(value, list):  # noqa: UP006
        for i, item in enumerate(value):
            _check_annotation(item, args[0], f"{where}[{i}]")
        return
    if origin in (dict, typing.Dict) and isinstance(value, dict):  # noqa: UP006
        for key, item in value.items():
            _check_annotation(item, args[1], f"{where}.{key}")
        return
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        _check_pydantic(value, annotation, where)
