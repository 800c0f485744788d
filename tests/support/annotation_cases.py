"""Bad cronlock.io/* annotations and what the operator says of each: the one table the
operator's own tests (tests/unit/operator/test_config.py), lint's and the chart's
annotation policy's (tests/integration/test_annotation_policy.py) are tried on."""

from __future__ import annotations

from typing import Any

from tests.support import gen

PROBED: list[dict[str, Any]] = [
    {
        "name": "main",
        "image": "busybox:1.36",
        "livenessProbe": {"exec": {"command": ["true"]}},
    }
]

BAD: list[tuple[dict[str, str], tuple[gen.Modifier, ...], str, str]] = [
    # (annotations, what else the CronJob has (gen modifiers), annotation named, words in
    # the reason)
    ({"cronlock.io/enabled": "yes"}, (), "cronlock.io/enabled", '"true" nor "false"'),
    ({"cronlock.io/tll": "60s"}, (), "cronlock.io/tll", "did you mean cronlock.io/ttl"),
    ({"cronlock.io/paused": "true"}, (), "cronlock.io/paused", "not a cronlock annotation"),
    ({"cronlock.io/lock": "My_Lock"}, (), "cronlock.io/lock", "lowercase"),
    ({"cronlock.io/lock": "a" * 64}, (), "cronlock.io/lock", "at most 63"),
    ({"cronlock.io/lock": "-reports"}, (), "cronlock.io/lock", "starting and ending"),
    ({"cronlock.io/lock": ""}, (), "cronlock.io/lock", "not a lock name"),
    ({"cronlock.io/lock": "a..b"}, (), "cronlock.io/lock", "not a lock name"),
    ({"cronlock.io/ttl": "abc"}, (), "cronlock.io/ttl", "not a duration"),
    ({"cronlock.io/ttl": "60"}, (), "cronlock.io/ttl", "not a duration"),
    ({"cronlock.io/ttl": "-60s"}, (), "cronlock.io/ttl", "not a duration"),
    ({"cronlock.io/ttl": "4s"}, (), "cronlock.io/ttl", "from 5s to 24h"),
    ({"cronlock.io/ttl": "25h"}, (), "cronlock.io/ttl", "from 5s to 24h"),
    ({"cronlock.io/ttl": "90.5s"}, (), "cronlock.io/ttl", "whole number of seconds"),
    ({"cronlock.io/ttl": "10s"}, (), "cronlock.io/ttl", "at least 19s"),
    ({"cronlock.io/renew": "soon"}, (), "cronlock.io/renew", "not a duration"),
    ({"cronlock.io/renew": "60s"}, (), "cronlock.io/renew", "shorter than the ttl"),
    ({"cronlock.io/renew": "2m"}, (), "cronlock.io/renew", "shorter than the ttl"),
    ({"cronlock.io/renew": "30s"}, (), "cronlock.io/renew", "at least two renewal attempts"),
    ({"cronlock.io/renew": "500ms"}, (), "cronlock.io/renew", "at least 1s"),
    ({"cronlock.io/renew": "0"}, (), "cronlock.io/renew", "at least 1s"),
    ({"cronlock.io/policy": "Skip"}, (), "cronlock.io/policy", 'did you mean "skip"?'),
    ({"cronlock.io/policy": "replce"}, (), "cronlock.io/policy", 'did you mean "replace"?'),
    ({"cronlock.io/policy": "fifo"}, (), "cronlock.io/policy", '"replace", "observe", "queue"'),
    ({"cronlock.io/queue-timeout": "10s"}, (), "cronlock.io/queue-timeout", "only applies with"),
    (
        {"cronlock.io/policy": "queue", "cronlock.io/queue-timeout": "0s"},
        (),
        "cronlock.io/queue-timeout",
        "out of range",
    ),
    (
        {"cronlock.io/policy": "queue", "cronlock.io/wait-timeout": "10s"},
        (),
        "cronlock.io/wait-timeout",
        "does not apply",
    ),
    ({"cronlock.io/wait-timeout": "10s"}, (), "cronlock.io/wait-timeout", "only applies with"),
    ({"cronlock.io/permits": "0"}, (), "cronlock.io/permits", "from 1 to 16"),
    ({"cronlock.io/permits": "17"}, (), "cronlock.io/permits", "from 1 to 16"),
    ({"cronlock.io/permits": "-1"}, (), "cronlock.io/permits", "not a number of permits"),
    ({"cronlock.io/permits": "02"}, (), "cronlock.io/permits", "not a number of permits"),
    ({"cronlock.io/permits": "two"}, (), "cronlock.io/permits", "not a number of permits"),
    ({"cronlock.io/permits": "9" * 40}, (), "cronlock.io/permits", "not a number of permits"),
    ({"cronlock.io/permits": "1.5"}, (), "cronlock.io/permits", "not a number of permits"),
    (
        {"cronlock.io/permits": "2", "cronlock.io/policy": "replace"},
        (),
        "cronlock.io/permits",
        'cannot be used with cronlock.io/policy: "replace" yet',
    ),
    (
        {"cronlock.io/policy": "observe", "cronlock.io/wait-timeout": "10s"},
        (),
        "cronlock.io/wait-timeout",
        'with "observe" a run never waits',
    ),
    (
        {"cronlock.io/policy": "wait", "cronlock.io/wait-timeout": "forever"},
        (),
        "cronlock.io/wait-timeout",
        "not a duration",
    ),
    (
        {"cronlock.io/policy": "wait", "cronlock.io/wait-timeout": "25h"},
        (),
        "cronlock.io/wait-timeout",
        "at most 24h",
    ),
    ({"cronlock.io/max-hold": "soon"}, (), "cronlock.io/max-hold", "not a duration"),
    ({"cronlock.io/max-hold": "169h"}, (), "cronlock.io/max-hold", "expected at most 168h"),
    # The default ttl 60s renews every 20s: at least 40s.
    ({"cronlock.io/max-hold": "39s"}, (), "cronlock.io/max-hold", "shorter than 2 renew periods"),
    (
        {"cronlock.io/policy": "observe", "cronlock.io/max-hold": "10m"},
        (),
        "cronlock.io/max-hold",
        "which never stops a run",
    ),
    ({"cronlock.io/jitter": "soon"}, (), "cronlock.io/jitter", "not a duration"),
    ({"cronlock.io/jitter": "-30s"}, (), "cronlock.io/jitter", "not a duration"),
    ({"cronlock.io/jitter": "30"}, (), "cronlock.io/jitter", "not a duration"),
    ({"cronlock.io/jitter": "1h0m0.001s"}, (), "cronlock.io/jitter", "from 0 (no jitter) to 1h"),
    ({"cronlock.io/jitter": "1000000h"}, (), "cronlock.io/jitter", "from 0 (no jitter) to 1h"),
    ({"cronlock.io/stop": "kill"}, (), "cronlock.io/stop", '"liveness", "signal" or "auto"'),
    (
        {"cronlock.io/stop": "liveness"},
        (gen.containers(*PROBED),),
        "cronlock.io/stop",
        "main already have a livenessProbe",
    ),
    ({"cronlock.io/alert-after": "0"}, (), "cronlock.io/alert-after", "from 1 to 1000"),
    ({"cronlock.io/alert-after": "1001"}, (), "cronlock.io/alert-after", "from 1 to 1000"),
    ({"cronlock.io/alert-after": "three"}, (), "cronlock.io/alert-after", "whole number"),
    ({"cronlock.io/alert-after": "3.0"}, (), "cronlock.io/alert-after", "whole number"),
    (
        {"cronlock.io/alert-after-missed": "-1"},
        (),
        "cronlock.io/alert-after-missed",
        "from 0 (never warn) to 1000",
    ),
    ({"cronlock.io/alert-after-missed": "1001"}, (), "cronlock.io/alert-after-missed", "from 0"),
    (
        {"cronlock.io/alert-after-missed": "3 "},
        (),
        "cronlock.io/alert-after-missed",
        "whole number",
    ),
    ({"cronlock.io/alert-after": "-3"}, (), "cronlock.io/alert-after", "whole number"),
    ({"cronlock.io/keep-skipped-jobs": "yes"}, (), "cronlock.io/keep-skipped-jobs", "nor"),
]
