"""Config across versions: 524f73f (the previous version) and this one.

A member refuses any key it does not know (``unknown key ...``), so a key added since
524f73f stops a 524f73f member given this version's config: a downgrade must drop it,
and docs/cluster.md ("Downgrading to 524f73f") names each. 524f73f's keys, recorded from
its own ``migratory.config`` (``tests/cluster/upgrade_fixture/record_524f73f.py``), are
all taken here: its config files work on this version.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from migratory.config import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
OLD_KEYS = set(json.loads(
    (ROOT / "tests/cluster/upgrade_fixture/recorded-524f73f.json").read_text()
)["config_keys"])
KEYS = {setting.key for setting in SETTINGS}


def downgrade_section() -> str:
    text = (ROOT / "docs/cluster.md").read_text()
    found = re.search(r"\*\*Downgrading to 524f73f\*\*.*?(?=\n## )", text, re.S)
    assert found, "docs/cluster.md has no 'Downgrading to 524f73f'"
    return found.group(0)


def test_every_key_524f73f_takes_is_taken_here() -> None:
    assert set() == OLD_KEYS - KEYS


def test_every_key_added_since_524f73f_is_named_for_a_downgrade() -> None:
    added = KEYS - OLD_KEYS
    assert added  # (ClusterLogCompactionBytes at least)
    section = downgrade_section()
    unnamed = {key for key in added if f"`{key}`" not in section}
    assert not unnamed, (
        f"{sorted(unnamed)}: added since 524f73f, which refuses them at start; name each "
        "in docs/cluster.md, 'Downgrading to 524f73f' (what an operator going back must drop)"
    )
