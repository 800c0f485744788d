"""An in-memory API server for unit tests of the runtime: the calls of `KubeCalls`, on
dicts, with the answers the real `Kube` gives (None when gone, 409 → the existing object,
Retry when a Lease vanished). Every answered call is recorded in `calls`; `fail` makes
the calls of a name raise (an exception instance, or a callable taking the call's
arguments that returns one or None). Objects go in and come out as copies, as over a wire.

It stores what it is given and answers from that: CronJob patches are applied (JSON
patch), a written object gets a new resourceVersion; admission and RBAC are not modelled.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jsonpatch

from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.errors import Retry
from cronlock_operator.reconcile.rbac import RbacKind
from cronlock_sidecar import contract

Name = tuple[str, str]
Failure = BaseException | Callable[..., BaseException | None]


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: dict[str, Failure] = {}
        self._versions = itertools.count(1)

    def _call(self, name: str, *args: Any) -> None:
        """Raise what `fail` says for this call, else record it as answered."""
        failure = self.fail.get(name)
        error = failure if failure is None or isinstance(failure, BaseException) else failure(*args)
        if error is not None:
            raise error
        self.calls.append((name, args))

    def _version(self) -> str:
        return str(next(self._versions))

    def called(self, name: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of `name`, in order."""
        return [args for called, args in self.calls if called == name]


class FakeHolderRbac(_Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.objects: dict[tuple[RbacKind, str, str], dict[str, Any]] = {}

    def read(self, kind: RbacKind, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("read", kind, namespace, name)
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def create(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None:
        self._call("create", kind, namespace, body)
        self._store(kind, namespace, body)

    def replace(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None:
        self._call("replace", kind, namespace, body)
        self._store(kind, namespace, body)

    def labelled(self, kind: RbacKind, namespace: str) -> list[str]:
        self._call("labelled", kind, namespace)
        return [
            name
            for (each, space, name), body in self.objects.items()
            if each == kind
            and space == namespace
            and (body["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by")
            == "cronlock"
        ]

    def delete(self, kind: RbacKind, namespace: str, name: str) -> None:
        self._call("delete", kind, namespace, name)
        self.objects.pop((kind, namespace, name), None)

    def _store(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None:
        metadata = {**body["metadata"], "namespace": namespace, "resourceVersion": self._version()}
        stored = copy.deepcopy({**body, "metadata": metadata})
        self.objects[(kind, namespace, body["metadata"]["name"])] = stored

    def names(self, kind: RbacKind, namespace: str) -> list[str]:
        return sorted(
            name for (each, space, name) in self.objects if (each, space) == (kind, namespace)
        )


class FakeKube(_Recorder):
    def __init__(
        self,
        cronjobs: Sequence[Mapping[str, Any]] = (),
        leases: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__()
        self.cronjobs: dict[Name, dict[str, Any]] = {}
        # Namespaces labelled cronlock.io/enabled=true.
        self.labelled: set[str] = set()
        self.leases: dict[Name, dict[str, Any]] = {}
        self.jobs: dict[Name, dict[str, Any]] = {}
        self.pods: dict[Name, dict[str, Any]] = {}
        self.events: list[
            tuple[str, str, str, bool]
        ] = []  # (object name, reason, message, warning)
        self.rbac = FakeHolderRbac()
        for cronjob in cronjobs:
            self.cronjobs[_name(cronjob)] = copy.deepcopy(dict(cronjob))
        for lease in leases:
            self.leases[_name(lease)] = copy.deepcopy(dict(lease))

    @property
    def holder_rbac(self) -> FakeHolderRbac:
        return self.rbac

    # --- CronJobs
    def patch_cronjob(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        self._call("patch_cronjob", namespace, name, patch)
        stored = self.cronjobs.get((namespace, name))
        if stored is None:
            return None
        patched = jsonpatch.apply_patch(stored, patch)
        patched["metadata"]["resourceVersion"] = self._version()
        self.cronjobs[(namespace, name)] = patched
        return copy.deepcopy(patched)

    def annotate_cronjob(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        self._call("annotate_cronjob", namespace, name, dict(annotations))
        stored = self.cronjobs.get((namespace, name))
        if stored is None:
            return
        merged = {**(stored["metadata"].get("annotations") or {}), **annotations}
        stored["metadata"]["annotations"] = {k: v for k, v in merged.items() if v is not None}

    def list_cronjobs(self, namespaces: Sequence[str], into: ObjectCache) -> None:
        self._call("list_cronjobs", tuple(namespaces))
        for (namespace, _), body in self.cronjobs.items():
            if not namespaces or namespace in namespaces:
                into.put(copy.deepcopy(body))

    def labelled_namespaces(self) -> list[str]:
        self._call("labelled_namespaces")
        return sorted(self.labelled)

    def read_cronjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("read_cronjob", namespace, name)
        return copy.deepcopy(self.cronjobs.get((namespace, name)))

    # --- Pods (whose runs hold Leases)
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("read_pod", namespace, name)
        return copy.deepcopy(self.pods.get((namespace, name)))

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("read_job", namespace, name)
        return copy.deepcopy(self.jobs.get((namespace, name)))

    # --- Leases
    def list_leases(self, namespaces: Sequence[str]) -> Iterator[dict[str, Any]]:
        self._call("list_leases", tuple(namespaces))
        for (namespace, _), body in list(self.leases.items()):
            if not namespaces or namespace in namespaces:
                yield copy.deepcopy(body)

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        name = body["metadata"]["name"]
        self._call("create_lease", namespace, body)
        existing = self.leases.get((namespace, name))
        if existing is not None:
            return copy.deepcopy(existing), False
        metadata = {**body["metadata"], "namespace": namespace, "resourceVersion": self._version()}
        created = copy.deepcopy({**body, "metadata": metadata})
        self.leases[(namespace, name)] = created
        return copy.deepcopy(created), True

    def merge_lease(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self._call("merge_lease", namespace, name, patch)
        stored = self.leases.get((namespace, name))
        if stored is None:
            raise Retry(f"lease {namespace}/{name} vanished; creating it again")
        metadata, wanted = stored["metadata"], patch["metadata"]
        metadata["labels"] = {**(metadata.get("labels") or {}), **wanted.get("labels", {})}
        owners = {owner["uid"]: owner for owner in metadata.get("ownerReferences") or []}
        owners.update({owner["uid"]: owner for owner in wanted.get("ownerReferences", [])})
        metadata["ownerReferences"] = list(owners.values())
        # A strategic merge of annotations: null removes a key.
        notes = {**(metadata.get("annotations") or {}), **wanted.get("annotations", {})}
        metadata["annotations"] = {key: value for key, value in notes.items() if value is not None}
        metadata["resourceVersion"] = self._version()
        return copy.deepcopy(stored)

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("read_lease", namespace, name)
        return copy.deepcopy(self.leases.get((namespace, name)))

    def patch_lease(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> bool:
        self._call("patch_lease", namespace, name, patch)
        stored = self.leases.get((namespace, name))
        if stored is None:
            return False
        test = patch[0] if patch and patch[0].get("op") == "test" else None
        if test is not None and test["value"] != stored["metadata"].get("resourceVersion"):
            return False
        for op in patch:
            if op["op"] == "replace" and op["path"] == "/metadata/ownerReferences":
                stored["metadata"]["ownerReferences"] = op["value"]
            if op["op"] == "add" and op["path"] == "/metadata/annotations":
                stored["metadata"]["annotations"] = dict(op["value"])
            if op["op"] == "add" and op["path"].startswith("/metadata/annotations/"):
                key = op["path"].removeprefix("/metadata/annotations/")
                key = key.replace("~1", "/").replace("~0", "~")
                stored["metadata"].setdefault("annotations", {})[key] = op["value"]
        stored["metadata"]["resourceVersion"] = self._version()
        return True

    def delete_lease(self, namespace: str, name: str, version: str) -> None:
        self._call("delete_lease", namespace, name, version)
        stored = self.leases.get((namespace, name))
        if stored is not None and stored["metadata"].get("resourceVersion") == version:
            del self.leases[(namespace, name)]

    # --- Jobs
    def mark_job(
        self, namespace: str, name: str, annotation: str, value: str, *, outcome: str | None = None
    ) -> bool:
        self._call("mark_job", namespace, name, annotation, value)
        stored = self.jobs.get((namespace, name))
        if stored is None:
            return False
        stored["metadata"].setdefault("annotations", {})[annotation] = value
        if outcome is not None:
            stored["metadata"].setdefault("labels", {})[contract.LABEL_OUTCOME] = outcome
        return True

    def resume_job(self, namespace: str, name: str) -> bool:
        self._call("resume_job", namespace, name)
        stored = self.jobs.get((namespace, name))
        if stored is None or (stored.get("spec") or {}).get("suspend") is not True:
            return False
        stored["spec"]["suspend"] = False
        return True

    def delete_job(self, namespace: str, name: str, version: str | None = None) -> bool:
        self._call("delete_job", namespace, name)
        stored = self.jobs.get((namespace, name))
        if stored is None or (
            version is not None and stored["metadata"].get("resourceVersion") != version
        ):
            return False
        self.jobs.pop((namespace, name), None)
        return True

    # --- Events
    def post_event(
        self, involved: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        self._call("post_event", involved, reason, message, warning)
        self.events.append((str(involved["metadata"]["name"]), reason, message, warning))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _, _ in self.events]


def _name(body: Mapping[str, Any]) -> Name:
    return str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
