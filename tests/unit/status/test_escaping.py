"""Strings from Leases and stores reach the terminal escaped, and JSON/YAML exact: whoever
holds a lock chooses its holder, last holder and freeze notes (docs/SECURITY.md, L6)."""

from __future__ import annotations

import json
import unicodedata

import pytest
import yaml

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.status.model import StatusRow, rows
from cronlock_operator.status.render import (
    as_list,
    printable,
    render_json,
    render_table,
    render_yaml,
)
from tests.unit.status.objects import NOW, cronjob, lease

# Sets the terminal's title, rings its bell, clears the screen.
TITLE_AND_CLEAR = "\x1b]0;owned\x07\x1b[2J"
# Red, then right-to-left from the override on: shows as "stuck-exe.gpj" in a terminal.
RED_REVERSED = "\x1b[31mstuck\u202egpj.exe"
FROZEN_BY = "alice\x9b2J\u2066bob\u2069"  # C1 CSI, bidi isolate
REASON = "migration\r\nDONE\x7f"


def unprintable(text: str) -> list[str]:
    """What in `text` a terminal acts on (or reorders text by), newlines between lines aside."""
    return [
        character
        for character in text.replace("\n", "")
        if unicodedata.category(character) in {"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"}
    ]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (TITLE_AND_CLEAR, r"\x1b]0;owned\x07\x1b[2J"),
        ("csi\x9bJ del\x7f nul\x00", r"csi\x9bJ del\x7f nul\x00"),
        ("tab\tline\ncr\r", r"tab\x09line\x0acr\x0d"),
        ("invoice\u202egpj.exe", r"invoice\u202egpj.exe"),
        (
            "\u2067isolated\u2069 \u200bzero-width \ufeffbom",
            r"\u2067isolated\u2069 \u200bzero-width \ufeffbom",
        ),
        ("line\u2028paragraph\u2029", r"line\u2028paragraph\u2029"),
        ("lone \ud800 surrogate", r"lone \ud800 surrogate"),
        ("tag \U000e0041 char", r"tag \U000e0041 char"),
        # A literal backslash is doubled, so text cannot pass itself off as an escape.
        (r"not \x1b an escape", r"not \\x1b an escape"),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert unprintable(printable(raw)) == []


@pytest.mark.parametrize(
    "text",
    ["", "nightly-29123456-x7k2p_4f0e9a1c", "until 2026-11-29T09:00:00Z by alice", "Zürich 東京 ✓"],
)
def test_printable_leaves_ordinary_text_alone(text: str) -> None:
    assert printable(text) == text


def hostile() -> list[StatusRow]:
    """One lock held by RED_REVERSED, released before by TITLE_AND_CLEAR, frozen by
    FROZEN_BY for REASON; its owner expired, so a warning names the holder too."""
    annotations = {
        "cronlock.io/last-holder": TITLE_AND_CLEAR,
        "cronlock.io/released-at": "2026-11-29T07:00:00.000000Z",
        "cronlock.io/frozen-until": "2026-11-29T09:00:00.000000Z",
        "cronlock.io/frozen-by": FROZEN_BY,
        "cronlock.io/frozen-reason": REASON,
    }
    return rows(
        [cronjob("stuck")],
        [lease("stuck", holder=RED_REVERSED, renewed_ago=3600, annotations=annotations)],
        NOW,
        readings=Readings(),
    )


@pytest.mark.parametrize("width", [200, 80, 40])
def test_the_table_shows_hostile_lease_strings_escaped_in_their_cells(width: int) -> None:
    narrow = render_table(hostile(), width)
    assert unprintable(narrow) == []
    wide = render_table(hostile(), width, wide=True)
    assert unprintable(wide) == []
    row = wide.splitlines()[1].split()
    assert r"\x1b[31mstuck\u202egpj.exe" in row  # HOLDER
    assert r"\x1b]0;owned\x07\x1b[2J" in row  # LAST HOLDER
    assert row[-4:] == ["until", "2026-11-29T09:00:00Z", "by", r"alice\x9b2J\u2066bob\u2069"]
    # Escaped before widths are counted: the columns still line up under their headers.
    lines = wide.splitlines()
    assert lines[1].index(r"\x1b]0;owned") == lines[0].index("LAST HOLDER")


def test_json_and_yaml_keep_the_values_exact_and_escape_them_themselves() -> None:
    status_rows = hostile()
    text = render_json(status_rows)
    assert unprintable(text) == []
    [item] = json.loads(text)["items"]
    assert (item["holder"], item["lastHolder"]) == (RED_REVERSED, TITLE_AND_CLEAR)
    assert item["frozen"] == {"until": "2026-11-29T09:00:00Z", "by": FROZEN_BY, "reason": REASON}
    assert RED_REVERSED in item["problems"][0]  # the problem as found, unescaped
    text = render_yaml(status_rows)
    assert unprintable(text) == []
    assert yaml.safe_load(text) == as_list(status_rows)
