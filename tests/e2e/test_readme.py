"""The README's deploy script deploys as written and does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamtx.errors import Aborted

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_script() -> str:
    blocks = re.findall(r"```sql\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no sql block"
    return blocks[0]


def test_readme_script_deploys_and_runs(client):
    created = client.deploy(readme_script())
    assert ("procedure", "enrich") in created.created
    for _ in range(3):
        assert client.push("clicks", {"user_id": [1, 2, 3, 4], "c": [3, 3, 3, 4]}).result().ok
    client.flush()
    assert client.query("SELECT c, n FROM totals ORDER BY c").fetchall() == [(3, 9), (4, 3)]
    assert client.call("total", c=3)[0].fetchall() == [(9,)]
    labels = client.query("SELECT c, n, label FROM enriched ORDER BY n DESC, c LIMIT 2").fetchall()
    assert labels[0] == (3, 9, "rising")
    bad = client.push("clicks", {"user_id": [5], "c": [-1]}).result()
    assert not bad.ok and "negative click" in bad.reason
    with pytest.raises(Aborted):
        bad.raise_for_outcome()
    assert client.query("SELECT sum(n) FROM totals").fetchall() == [(12,)]
