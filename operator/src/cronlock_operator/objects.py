"""Reading Kubernetes objects as the API server sends them (JSON as dicts): their name,
metadata and annotations, the same way everywhere, missing parts read as empty."""

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


def name_of(obj: Mapping[str, Any]) -> Name:
    """(namespace, name) of an object that has both, as every watched object does."""
    metadata = obj["metadata"]
    return str(metadata["namespace"]), str(metadata["name"])
