"""Reading Kubernetes objects as the API server sends them (JSON as dicts): their name,
metadata and annotations, the same way everywhere, missing parts read as empty; and the
JSON patch (RFC 6902) parts every conditional write of them uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Name = tuple[str, str]  # (namespace, name)


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    return metadata


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """The object's annotations, empty when it has none."""
    annotations: Mapping[str, str] = metadata_of(obj).get("annotations") or {}
    return annotations


def annotation_path(key: str) -> str:
    """The JSON pointer (RFC 6901) of annotation `key`, `~` and `/` escaped."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def still_at(version: str) -> dict[str, Any]:
    """The patch operation that fails (422) unless the object is still at `version`, so
    the operations after it apply only to the object as read."""
    return {"op": "test", "path": "/metadata/resourceVersion", "value": version}


def name_of(obj: Mapping[str, Any]) -> Name:
    """(namespace, name) of an object that has both, as every watched object does."""
    metadata = obj["metadata"]
    return str(metadata["namespace"]), str(metadata["name"])
