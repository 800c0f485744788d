"""A Lease document as a store keeps it (no version of its own) and gives it back (the store's)."""

from __future__ import annotations

from typing import Any


def unversioned(body: dict[str, Any]) -> dict[str, Any]:
    """What a store keeps of a Lease written to it: all but the version it was read at."""
    metadata = {
        key: value
        for key, value in (body.get("metadata") or {}).items()
        if key != "resourceVersion"
    }
    return {**body, "metadata": metadata}


def token_of(body: dict[str, Any]) -> int:
    """The fencing token a writer asks for: the Lease's transitions."""
    return int((body.get("spec") or {}).get("leaseTransitions") or 0)


def version_read(body: dict[str, Any]) -> str:
    """The store's version the writer read this Lease at ("" when it read none)."""
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def stamped(document: dict[str, Any], version: int | str, token: int | str) -> dict[str, Any]:
    """The document as a reader sees it: the store's version and fencing token in place."""
    metadata = {**(document.get("metadata") or {}), "resourceVersion": str(version)}
    spec = {**(document.get("spec") or {}), "leaseTransitions": int(token)}
    return {**document, "metadata": metadata, "spec": spec}
