"""LICENSE is the Apache License 2.0 exactly, as pyproject.toml and the chart declare."""

from __future__ import annotations

import hashlib
import tomllib

import yaml

from tests.support.paths import ROOT

# sha256 of apache.org's LICENSE-2.0.txt (also Debian's /usr/share/common-licenses/Apache-2.0
# and the LICENSE of the k8s.io/kubernetes module tests/controlplane builds).
APACHE_2_0 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_file_is_the_unmodified_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0


def test_the_package_and_the_chart_declare_that_license_and_ship_the_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((ROOT / "charts" / "cronlock" / "Chart.yaml").read_text())
    assert project["license"] == chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
