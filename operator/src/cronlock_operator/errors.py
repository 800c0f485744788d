"""The errors of work, raised at the Kubernetes edge (kube/): retry later, refused for good,
gone. What a reconcile decides is a value instead (runtime/workqueue.Result, the
executor's verdicts), as controller-runtime returns a `reconcile.Result` and an error.

At the bottom of the operator's layers; nothing here needs anything but the standard
library.
"""

from __future__ import annotations


class Retry(Exception):
    """Work that should run again later, with backoff: a transient API error or a lost
    race."""


class Gone(Exception):
    """The object, or its whole namespace, is gone (the API server's 404, translated at the
    Kubernetes edge, kube/answers.py): nothing to do; its DELETED event tidies up."""


class Rejected(Exception):
    """The API server refused what cronlock wrote as invalid: retrying cannot help."""
