"""Manifests as `kubectl apply` reads them: multi-document YAML, Lists, with their lines."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

# What `kubectl apply -f DIR` and pre-commit's `files` pattern take from a directory.
SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Manifest:
    """One object of a file: its body, the line it starts on and its annotation keys' lines."""

    path: str
    line: int
    body: Mapping[str, Any]
    annotation_lines: Mapping[str, int] = field(default_factory=dict)

    def line_of(self, annotation: str | None) -> int:
        """The line of `annotation`'s key, else the object's first line."""
        if annotation is None:
            return self.line
        return self.annotation_lines.get(annotation, self.line)


@dataclass(frozen=True)
class BadYAML:
    """A stream that stops parsing here; the objects before it were still read."""

    path: str
    line: int
    message: str


def read_stream(path: str, text: str) -> Iterator[Manifest | BadYAML]:
    """Every object of `text` (documents, and the items of any `*List`), then a BadYAML
    if the stream does not parse to its end."""
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            yield from _objects(path, node, loader.construct_document(node))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else 1
        column = f" (column {mark.column + 1})" if mark is not None else ""
        what = " ".join(part for part in (error.context, error.problem) if part)
        yield BadYAML(path, line, f"not valid YAML: {what}{column}")
    except yaml.YAMLError as error:
        yield BadYAML(path, 1, f"not valid YAML: {error}")
    finally:
        loader.dispose()


def _objects(path: str, node: yaml.Node, data: Any) -> Iterator[Manifest]:
    if not isinstance(data, Mapping) or not isinstance(node, yaml.MappingNode):
        return
    kind = data.get("kind")
    items = _value_node(node, "items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(data.get("items"), list):
        item_nodes = items.value if isinstance(items, yaml.SequenceNode) else []
        for item_node, item in zip(item_nodes, data["items"], strict=False):
            yield from _objects(path, item_node, item)
        return
    metadata = _value_node(node, "metadata")
    annotations = _value_node(metadata, "annotations") if metadata is not None else None
    lines: dict[str, int] = {}
    if isinstance(annotations, yaml.MappingNode):
        for key, _ in annotations.value:
            if isinstance(key, yaml.ScalarNode):
                lines.setdefault(str(key.value), key.start_mark.line + 1)
    yield Manifest(path, node.start_mark.line + 1, data, lines)


def _value_node(node: yaml.Node, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            found: yaml.Node = value_node
            return found
    return None
