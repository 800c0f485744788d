"""The operator's copy of watched objects, kept as compact JSON to bound its memory.

A parsed CronJob costs ten times its JSON in Python objects; with 10,000 CronJobs the
parsed copies alone would pass the operator's memory budget. Objects are parsed again
only when a worker needs them. `managedFields` is dropped: nothing here reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

Key = tuple[str, str]


class ObjectCache:
    """Latest version of each object by (namespace, name)."""

    def __init__(self) -> None:
        self._objects: dict[Key, bytes] = {}

    def put(self, body: Mapping[str, Any]) -> Key:
        metadata = body["metadata"]
        key = (str(metadata["namespace"]), str(metadata["name"]))
        slim = {**body, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
        self._objects[key] = json.dumps(slim, separators=(",", ":")).encode()
        return key

    def pop(self, key: Key) -> None:
        self._objects.pop(key, None)

    def get(self, key: Key) -> dict[str, Any] | None:
        data = self._objects.get(key)
        if data is None:
            return None
        body: dict[str, Any] = json.loads(data)
        return body

    def in_namespace(self, namespace: str) -> Iterator[dict[str, Any]]:
        for (space, _), data in list(self._objects.items()):
            if space == namespace:
                body: dict[str, Any] = json.loads(data)
                yield body

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    def __len__(self) -> int:
        return len(self._objects)
