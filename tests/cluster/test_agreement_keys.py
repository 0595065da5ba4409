"""cluster/agreement_keys.py: the entitlement's keys a member tells the others, as keyed
digests -- equal for equal keys wherever their files are, different for another key,
never the secret itself."""

from __future__ import annotations

from pathlib import Path

import cbor2
import pytest

from cluster import link
from cluster.agreement import MemberSettings, entitlement_key_difference
from cluster.agreement_keys import PLUGIN_CODE, entitlement_keys
from migratory.config import Config

SECRET = b"s3cret-hs256-key-of-32-bytes-or-more!"
CLUSTER = {"ClusterMembers": "127.0.0.1:9000,127.0.0.1:9010,127.0.0.1:9020",
           "ClusterPassword": "pw"}


def member(listen: str, **settings: str) -> MemberSettings:
    config = Config.from_mapping({**CLUSTER, "ClusterMemberListen": listen, **settings})
    return MemberSettings.from_config(config, "i")


def token(tmp_path: Path, name: str, key: bytes, **settings: str) -> dict[str, str]:
    (tmp_path / name).write_bytes(key)
    return {"Entitlement": "Token", "EntitlementTokenKeyFile": str(tmp_path / name), **settings}


def test_another_token_key_is_named_and_the_same_key_elsewhere_is_not(tmp_path: Path) -> None:
    """Before, only ``Entitlement`` itself was compared: two members of Token with another
    key linked without a word, each accepting tokens the other denied."""
    mine = member("127.0.0.1:9000", **token(tmp_path, "a.key", SECRET))
    moved = member("127.0.0.1:9010", **token(tmp_path, "b.key", SECRET))  # another path
    assert mine.entitlement_keys == moved.entitlement_keys
    assert entitlement_key_difference(mine, moved) is None
    rotated = member("127.0.0.1:9010", **token(tmp_path, "c.key", SECRET[::-1],
                                              EntitlementTokenIssuer="iss"))
    said = entitlement_key_difference(mine, rotated)
    assert said is not None and said.startswith(
        "the entitlement's keys differ from 127.0.0.1:9010's: EntitlementTokenIssuer, "
        "EntitlementTokenKeyFile (Entitlement Token on both;"), said
    assert entitlement_key_difference(rotated, mine) is not None  # both sides say it


def test_the_secret_is_never_on_the_wire(tmp_path: Path) -> None:
    basic = member("127.0.0.1:9000", Entitlement="Basic", EntitlementAllowToken="hunter2",
                   MonitorToken="monitor-secret")
    frame = link.encode_frame(link.Settings(basic))
    assert b"hunter2" not in frame and b"monitor-secret" not in frame
    keys = dict(basic.entitlement_keys or ())
    assert set(keys) == {"EntitlementAllowToken", "MonitorToken"}
    assert all(len(d) == 16 and d not in ("hunter2", "monitor-secret") for d in keys.values())
    # keyed by ClusterPassword: the digest of a guessable token says nothing without it
    other = Config.from_mapping({**CLUSTER, "ClusterPassword": "another",
                                 "ClusterMemberListen": "127.0.0.1:9000", "Entitlement": "Basic",
                                 "EntitlementAllowToken": "hunter2"})
    assert dict(entitlement_keys(other))["EntitlementAllowToken"] != keys["EntitlementAllowToken"]
    assert link.decode_op(frame[4:]) == link.Settings(basic)  # (the digests round-trip)


def test_another_basic_token_or_monitor_token_is_named() -> None:
    mine = member("127.0.0.1:9000", Entitlement="Basic", EntitlementAllowToken="a")
    theirs = member("127.0.0.1:9010", Entitlement="Basic", EntitlementAllowToken="b",
                    MonitorToken="m")
    said = entitlement_key_difference(mine, theirs)
    assert said is not None and "EntitlementAllowToken, MonitorToken (" in said
    none = member("127.0.0.1:9020", MonitorToken="m")  # another Entitlement: said otherwise
    assert entitlement_key_difference(mine, none) is None


def test_a_custom_plugin_is_compared_by_name_options_and_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = tmp_path / "h119_rights.py"
    plugin.write_text("class Rights:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    custom = {"Entitlement": "Custom", "EntitlementPlugin": "h119_rights:Rights"}
    mine = member("127.0.0.1:9000", **custom, EntitlementPluginOptions="x")
    assert mine.entitlement_keys is not None
    assert {k for k, _ in mine.entitlement_keys} == {
        "EntitlementPlugin", "EntitlementPluginOptions", PLUGIN_CODE, "MonitorToken"}
    said = entitlement_key_difference(mine, member("127.0.0.1:9010", **custom,
                                                   EntitlementPluginOptions="y"))
    assert said is not None and ": EntitlementPluginOptions (" in said
    plugin.write_text("class Rights:\n    allow_all = True\n")  # another version of it
    said = entitlement_key_difference(mine, member("127.0.0.1:9010", **custom,
                                                   EntitlementPluginOptions="x"))
    assert said is not None and f": {PLUGIN_CODE} (" in said


def test_a_malformed_list_of_keys_ends_the_link() -> None:
    body = cbor2.loads(link.encode_frame(link.Settings(member("127.0.0.1:9000")))[4:])
    for wrong in ("x", [["a"]], [["a", 1]], [["", "d"]], [["k" * 65, "d"]], [["a", "b"]] * 17):
        with pytest.raises(link.LinkError, match="'cf' frame: 'ek'"):
            link.decode_op(cbor2.dumps({**body, "ek": wrong}))


def test_a_member_that_does_not_send_them_is_not_compared() -> None:
    mine = member("127.0.0.1:9000", Entitlement="Basic", EntitlementAllowToken="a")
    older = member("127.0.0.1:9010", Entitlement="Basic", EntitlementAllowToken="b")
    assert entitlement_key_difference(mine, older.without_entitlement_keys()) is None
    assert older.without_limits().entitlement_keys is None
