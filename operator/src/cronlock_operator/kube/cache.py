"""The operator's copy of watched objects, kept as compressed compact JSON to bound memory.

A parsed CronJob costs many times its JSON in Python objects; at the scale the operator
is sized for, the parsed copies alone would pass its memory budget. Objects are parsed
again only when a worker needs them. `managedFields` is dropped: nothing here reads it.
The JSON is zlib-compressed at level 1: it shrinks the JSON several times over for less
time than parsing it costs anyway (figures in docs/PERFORMANCE.md).

It sits in kube/, as client-go's informer stores sit in its `tools/cache`: the watches and
`Kube.list_cronjobs` fill it with what the API server sent, and the runtime owns each
cache. The pure layers below kube/ never import it (the operator's layers contract).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

Key = tuple[str, str]
LEVEL = 1


class ObjectCache:
    """Latest version of each object by (namespace, name)."""

    def __init__(self) -> None:
        self._objects: dict[Key, bytes] = {}

    def put(self, body: Mapping[str, Any]) -> Key:
        metadata = body["metadata"]
        key = (str(metadata["namespace"]), str(metadata["name"]))
        slim = {**body, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
        self._objects[key] = zlib.compress(json.dumps(slim, separators=(",", ":")).encode(), LEVEL)
        return key

    def pop(self, key: Key) -> None:
        self._objects.pop(key, None)

    def get(self, key: Key) -> dict[str, Any] | None:
        data = self._objects.get(key)
        if data is None:
            return None
        return _load(data)

    def in_namespace(self, namespace: str) -> Iterator[dict[str, Any]]:
        for (space, _), data in list(self._objects.items()):
            if space == namespace:
                yield _load(data)

    def keys(self) -> list[Key]:
        return list(self._objects)

    def keys_in(self, namespace: str) -> list[Key]:
        """The keys of the namespace's objects, sorted (nothing parsed)."""
        return sorted(key for key in list(self._objects) if key[0] == namespace)

    def namespaces(self) -> list[str]:
        """The namespaces of the cached objects, sorted."""
        return sorted({namespace for namespace, _ in list(self._objects)})

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    def __len__(self) -> int:
        return len(self._objects)


def _load(data: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(zlib.decompress(data))
    return body
