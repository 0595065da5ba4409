"""POST /publish bodies and the replies to them."""

from __future__ import annotations

import json

import pytest

from migratory.model.message import Qos
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.http import HttpError
from migratory.protocol.http_api import parse_publish, publish_reply


def test_text_content_fields_retained_qos_token() -> None:
    body = {"subject": "/a/b", "content": "193", "fields": {"volume": "6.62M"},
            "retained": True, "qos": "guaranteed", "token": "t"}
    parsed = parse_publish(json.dumps(body).encode(), "http")
    m = parsed.message
    assert (m.subject, m.content, dict(m.fields), m.retained, m.qos, m.closure) == (
        "/a/b", b"193", {"volume": "6.62M"}, True, Qos.GUARANTEED, "http")
    assert parsed.token == "t"


def test_base64_content() -> None:
    parsed = parse_publish(b'{"subject": "/a/b", "content_base64": "/wA="}', "http")
    assert parsed.message.content == b"\xff\x00"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "JSON object"),
        (b"[1]", "JSON object"),
        (b"[" * 100000, "JSON object"),
        (b'{"content": "x"}', "'subject' is required"),
        (b'{"subject": 1}', "'subject' must be a str"),
        (b'{"subject": "/a/b", "content": "x", "content_base64": "eA=="}', "not both"),
        (b'{"subject": "/a/b", "content_base64": "@@"}', "not valid base64"),
        (b'{"subject": "/a/b", "fields": {"a": 1}}', "map text to text"),
        (b'{"subject": "/a/b", "retained": "yes"}', "'retained' must be a bool"),
        (b'{"subject": "/a/b", "qos": "best"}', "'qos' must be"),
        (b'{"subject": "/a/b", "colour": "red"}', "unknown key 'colour'"),
    ],
)
def test_bad_bodies_are_400_naming_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(HttpError) as bad:
        parse_publish(body, "http")
    assert bad.value.status == 400 and message in bad.value.reason


def test_replies() -> None:
    ok = ops.PublishStatus(ops.Status.PUBLISH_OK, "http", "/a/b", Position(7, 3))
    assert publish_reply(ok) == (
        200, b'{"status": "PUBLISH_OK", "subject": "/a/b", "epoch": 7, "seq": 3}\n')
    denied = ops.PublishStatus(ops.Status.PUBLISH_DENIED, "http", "/a/b", None, "no")
    code, body = publish_reply(denied, refused=True)
    assert code == 403 and json.loads(body)["reason"] == "no"
    failed = ops.PublishStatus(ops.Status.PUBLISH_FAILED, "http", "/a", None, "bad subject")
    assert publish_reply(failed, refused=True)[0] == 400
    assert publish_reply(failed)[0] == 503
    big = ops.PublishStatus(ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED, "http", "/a/b")
    assert publish_reply(big)[0] == 413
