"""The errors of work, raised at the Kubernetes edge (kube/): retry later, refused for good,
gone. What a reconcile decides is a value instead (runtime/workqueue.Result, the
executor's verdicts), as controller-runtime returns a `reconcile.Result` and an error.

They live in kube/, beside `answers`, which translates the client's exceptions into them;
the runtime and the commands above catch them, and nothing below kube/ can raise them
(the operator's layers contract): the pure layers return values. Nothing here needs
anything but the standard library.
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
