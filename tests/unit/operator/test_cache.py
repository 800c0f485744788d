"""The watch cache: what goes in comes out (without managedFields), and it is kept small."""

from __future__ import annotations

import json
from typing import Any

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import desired_cronjob
from cronlock_operator.kube.cache import ObjectCache
from tests.support import gen
from tests.support.cronjobs import SETTINGS


def injected_cronjob(namespace: str, name: str) -> dict[str, Any]:
    """An injected CronJob, with managedFields as the API server adds them."""
    user = gen.cronjob(name, gen.in_namespace(namespace))
    body = desired_cronjob(user, parse_config(user, SETTINGS), SETTINGS)
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Apply"}]
    return body


def test_an_object_comes_back_as_it_went_in_without_managed_fields() -> None:
    cache = ObjectCache()
    body = injected_cronjob("ops", "report")
    assert cache.put(body) == ("ops", "report")
    expected = json.loads(json.dumps(body))
    del expected["metadata"]["managedFields"]
    assert cache.get(("ops", "report")) == expected
    assert ("ops", "report") in cache
    assert cache.get(("ops", "other")) is None


def test_in_namespace_pop_and_len() -> None:
    cache = ObjectCache()
    for namespace, name in [("a", "x"), ("a", "y"), ("b", "x")]:
        cache.put(injected_cronjob(namespace, name))
    assert sorted(body["metadata"]["name"] for body in cache.in_namespace("a")) == ["x", "y"]
    cache.pop(("a", "x"))
    cache.pop(("a", "missing"))
    assert len(cache) == 2
    assert [body["metadata"]["name"] for body in cache.in_namespace("a")] == ["y"]


def test_stored_objects_take_less_than_their_compact_json() -> None:
    cache = ObjectCache()
    body = injected_cronjob("ops", "report")
    cache.put(body)
    compact = json.dumps(body, separators=(",", ":")).encode()
    stored = cache._objects[("ops", "report")]  # the representation is what this checks
    assert len(stored) < len(compact) / 2
