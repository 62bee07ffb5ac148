"""`streamtx demo` (the README's main job) runs both ways of deploying the voter and ends in the same standings."""

from __future__ import annotations

import pytest

from streamtx.procedures.voter import demo

pytestmark = pytest.mark.timeout(300)


def test_both_apps_of_the_demo_end_in_the_same_standings(capsys):
    standings = {}
    for app in demo.APPS:
        assert demo.main(["--app", app, "--votes", "400", "--delete-every", "60", "--batch-size", "7"]) == 0
        out = capsys.readouterr().out
        assert "Leaderboards" in out and "contestants left" in out
        standings[app] = out
    assert standings["state"] == standings["dataflow"]
