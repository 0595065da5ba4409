"""Entitlement = Token (JWT through PyJWT: HS256, RS256, ES256, key file or JWKS file,
subject patterns, exp) and Entitlement = Custom (a plugin that may fail)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from migratory.config import Config, ConfigError
from migratory.entitlement import entitlement_from_config
from migratory.entitlement_decisions import ClientIdentity
from migratory.entitlement_token import SubjectPatterns

SECRET = "s" * 40
ALICE = ClientIdentity("alice", None, "127.0.0.1:1")


def who(token: str | None) -> ClientIdentity:
    return ClientIdentity("alice", token, "127.0.0.1:1")


def claims(**extra: Any) -> dict[str, Any]:
    return {
        "sub": "alice",
        "exp": int(time.time()) + 600,
        "subscribe": ["/Stocks/**", "/News/*/Headlines"],
        "publish": ["/Chat/alice"],
        **extra,
    }


def token_config(tmp_path: Path, **settings: str) -> Config:
    return Config.from_mapping({"Entitlement": "Token", **settings})


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("/a/b", "/a/b", True),
        ("/a/b", "/a/c", False),
        ("/a/*", "/a/b", True),
        ("/a/*", "/a/b/c", False),
        ("/a/**", "/a/b", True),
        ("/a/**", "/a/b/c/d", True),
        ("/a/**", "/a", False),
        ("/a/**", "/b/c", False),
        ("/*/x/**", "/q/x/y", True),
        ("/*/x/**", "/q/z/y", False),
        # MQTT topic filters: allowed only when the pattern covers all they can match
        ("/a/*", "/a/+", True),
        ("/a/*", "/a/#", False),
        ("/a/b", "/a/+", False),
        ("/a/*/c", "/a/#", False),
        ("/*/b", "/+/b", True),
        ("/a/**", "/a/#", True),
        ("/a/**", "/a/+/#", True),
        ("/a/b/**", "/a/b/#", False),  # '#' matches /a/b itself too
        ("/a/b/**", "/a/b/c/#", True),
        ("/**", "/#", True),
        ("/*/*", "/#", False),
    ],
)
def test_subject_patterns(pattern: str, subject: str, expected: bool) -> None:
    assert SubjectPatterns.parse([pattern]).match(subject) is expected


def test_bad_patterns_are_refused() -> None:
    for claim in (["a/b"], ["/a/**/b"], "/a/b", [1]):
        with pytest.raises(ValueError):
            SubjectPatterns.parse(claim)


def test_hs256_token(tmp_path: Path) -> None:
    key_file = tmp_path / "secret"
    key_file.write_text(SECRET)
    entitlement = entitlement_from_config(
        token_config(tmp_path, EntitlementTokenKeyFile=str(key_file))
    )
    token = jwt.encode(claims(), SECRET, algorithm="HS256")
    client = who(token)
    assert entitlement.allow_connect(client)
    assert entitlement.allow_subscribe(client, "/Stocks/NYSE/IBM")
    assert entitlement.allow_subscribe(client, "/News/World/Headlines")
    assert not entitlement.allow_subscribe(client, "/News/World/Sport")
    assert entitlement.allow_publish(client, "/Chat/alice")
    assert not entitlement.allow_publish(client, "/Chat/bob")
    assert entitlement.expiry(client) == claims()["exp"] or entitlement.expiry(client)
    # wrong secret, no token, garbage, no exp, another algorithm: all refused
    for bad in (
        jwt.encode(claims(), "t" * 40, algorithm="HS256"),
        None,
        "not.a.token",
        jwt.encode({"sub": "x", "subscribe": ["/a/**"]}, SECRET, algorithm="HS256"),
        jwt.encode(claims(), SECRET, algorithm="HS512"),
    ):
        assert not entitlement.allow_connect(who(bad))
        assert not entitlement.allow_subscribe(who(bad), "/Stocks/NYSE/IBM")


def test_an_expired_token_is_refused_and_says_when(tmp_path: Path) -> None:
    key_file = tmp_path / "secret"
    key_file.write_text(SECRET)
    entitlement = entitlement_from_config(
        token_config(tmp_path, EntitlementTokenKeyFile=str(key_file))
    )
    exp = int(time.time()) - 5
    token = jwt.encode(claims(exp=exp), SECRET, algorithm="HS256")
    assert not entitlement.allow_connect(who(token))
    assert entitlement.expiry(who(token)) == exp


def test_rs256_key_file_and_es256_jwks(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "rsa.pem"
    pem.write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    entitlement = entitlement_from_config(
        token_config(tmp_path, EntitlementTokenAlgorithm="RS256", EntitlementTokenKeyFile=str(pem))
    )
    assert entitlement.allow_connect(who(jwt.encode(claims(), rsa_key, algorithm="RS256")))
    assert not entitlement.allow_connect(who(jwt.encode(claims(), SECRET, algorithm="HS256")))

    keys = {kid: ec.generate_private_key(ec.SECP256R1()) for kid in ("k1", "k2")}
    jwks = {
        "keys": [
            {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key())), "kid": kid}
            for kid, k in keys.items()
        ]
    }
    jwks_file = tmp_path / "keys.json"
    jwks_file.write_text(json.dumps(jwks))
    entitlement = entitlement_from_config(
        token_config(
            tmp_path, EntitlementTokenAlgorithm="ES256", EntitlementTokenJwksFile=str(jwks_file)
        )
    )
    for kid, key in keys.items():
        token = jwt.encode(claims(), key, algorithm="ES256", headers={"kid": kid})
        assert entitlement.allow_subscribe(who(token), "/Stocks/X/Y")
    stranger = ec.generate_private_key(ec.SECP256R1())
    forged = jwt.encode(claims(), stranger, algorithm="ES256", headers={"kid": "k1"})
    assert not entitlement.allow_connect(who(forged))
    unknown = jwt.encode(claims(), keys["k1"], algorithm="ES256", headers={"kid": "k9"})
    assert not entitlement.allow_connect(who(unknown))


def test_algorithm_confusion_and_header_tricks_are_refused(tmp_path: Path) -> None:
    """RS256 configured: an HS256 token whose secret is the server's public key (the
    classic confusion), alg none / None, a `crit` or `b64: false` header, a key offered
    by `jku` / `jwk` in the header, a token without exp, one with an audience while none
    is configured -- all refused; unknown claims are ignored."""
    import base64
    import hashlib
    import hmac

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    pem = tmp_path / "rsa.pem"
    pem.write_bytes(public)
    entitlement = entitlement_from_config(
        token_config(tmp_path, EntitlementTokenAlgorithm="RS256", EntitlementTokenKeyFile=str(pem))
    )

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def crafted(header: dict[str, Any], key: bytes | None) -> str:
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims()).encode())}"
        if key is None:
            return signing_input + "."
        mac = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{b64(mac)}"

    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(stranger.public_key()))
    refused = {
        "HS256 with the public key": crafted({"alg": "HS256", "typ": "JWT"}, public),
        "HS256 with the key stripped": crafted({"alg": "HS256"}, public.strip()),
        "alg none": crafted({"alg": "none"}, None),
        "alg None": crafted({"alg": "None"}, None),
        "crit": jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"crit": ["exp"]}),
        "b64 false": jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"b64": False}),
        "jwk in the header": jwt.encode(claims(), stranger, algorithm="RS256",
                                        headers={"jwk": stranger_jwk}),
        "jku in the header": jwt.encode(claims(), stranger, algorithm="RS256",
                                        headers={"jku": "http://127.0.0.1:1/keys"}),
        "no exp": jwt.encode({k: v for k, v in claims().items() if k != "exp"}, rsa_key,
                             algorithm="RS256"),
        "an audience not configured": jwt.encode(claims(aud="elsewhere"), rsa_key,
                                                 algorithm="RS256"),
    }
    assert {name: entitlement.allow_connect(who(token)) for name, token in refused.items()} == (
        dict.fromkeys(refused, False))
    odd = jwt.encode(claims(zzz={"nested": [1, None]}, role="admin"), rsa_key, algorithm="RS256")
    assert entitlement.allow_subscribe(who(odd), "/Stocks/X/Y")
    assert not entitlement.allow_publish(who(odd), "/Stocks/X/Y")  # "role" grants nothing


def test_token_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="EntitlementTokenKeyFile"):
        Config.from_mapping({"Entitlement": "Token"})
    short = tmp_path / "short"
    short.write_text("tiny")
    config = token_config(tmp_path, EntitlementTokenKeyFile=str(short))
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        entitlement_from_config(config)
    missing = token_config(tmp_path, EntitlementTokenKeyFile=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="Token"):
        entitlement_from_config(missing)
    # RS256's public key set with HS256 (left at its default): every token was refused,
    # each with one INFO line; now start-up stops, saying so
    public = tmp_path / "public.pem"
    public.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048)
                       .public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(ConfigError, match="public key"):
        entitlement_from_config(token_config(tmp_path, EntitlementTokenKeyFile=str(public)))
    # a key file PyJWT cannot use for the algorithm: ConfigError at start-up
    for algorithm, text in (("RS256", "garbage " * 8), ("ES256", public.read_text())):
        wrong = tmp_path / f"wrong-{algorithm}.pem"
        wrong.write_text(text)
        with pytest.raises(ConfigError, match=f"EntitlementTokenKeyFile .*wrong-{algorithm}.pem: "
                                              f"holds no {algorithm} public key"):
            entitlement_from_config(token_config(tmp_path, EntitlementTokenAlgorithm=algorithm,
                                                 EntitlementTokenKeyFile=str(wrong)))
    # a JWKS file without usable keys, or not an object: ConfigError, not a traceback
    for name, text in (("empty", '{"keys": []}'), ("bad", '{"keys": [{"kty": "RSA"}]}'),
                       ("list", "[1]")):
        jwks = tmp_path / f"{name}.jwks"
        jwks.write_text(text)
        with pytest.raises(ConfigError, match=f"Entitlement = Token: EntitlementTokenJwksFile "
                                              f".*{name}.jwks: "):
            entitlement_from_config(token_config(tmp_path, EntitlementTokenAlgorithm="RS256",
                                                 EntitlementTokenJwksFile=str(jwks)))


PLUGIN = '''
class Rules:
    def __init__(self, options):
        self.options = options
        self.calls = 0

    def allow_connect(self, client):
        return client.token == self.options

    def allow_subscribe(self, client, subject):
        self.calls += 1
        if subject.startswith("/Boom/"):
            raise RuntimeError("plugin bug")
        return subject.startswith("/Open/")

    def allow_publish(self, client, subject):
        return "yes"  # not True: denied


class Broken:
    def __init__(self, options):
        raise OSError("cannot reach the rules service")
'''


def test_custom_plugin_decides_caches_and_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_rules.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = Config.from_mapping(
        {
            "Entitlement": "Custom",
            "EntitlementPlugin": "my_rules:Rules",
            "EntitlementPluginOptions": "letmein",
        }
    )
    entitlement = entitlement_from_config(config)
    client = who("letmein")
    assert entitlement.allow_connect(client) and not entitlement.allow_connect(who("x"))
    assert entitlement.allow_subscribe(client, "/Open/a")
    assert entitlement.allow_subscribe(client, "/Open/a")  # cached
    assert not entitlement.allow_subscribe(client, "/Closed/a")
    assert not entitlement.allow_subscribe(client, "/Boom/a")  # raised: denied
    assert not entitlement.allow_publish(client, "/Open/a")
    plugin = entitlement._plugin  # type: ignore[attr-defined]
    assert plugin.calls == 3
    assert entitlement.failures == 1  # type: ignore[attr-defined]
    for spec, message in (
        ("my_rules:Broken", "cannot reach"),
        ("my_rules:Missing", "Missing"),
        ("no_such_module:X", "no_such_module"),
        ("my_rules", "module:Class"),
    ):
        bad = Config.from_mapping({"Entitlement": "Custom", "EntitlementPlugin": spec})
        with pytest.raises(ConfigError, match=message):
            entitlement_from_config(bad)
    sys.modules.pop("my_rules", None)


def test_issuer_and_audience_when_set_are_required(tmp_path: Path) -> None:
    key_file = tmp_path / "secret"
    key_file.write_text(SECRET)
    entitlement = entitlement_from_config(
        token_config(
            tmp_path,
            EntitlementTokenKeyFile=str(key_file),
            EntitlementTokenIssuer="https://auth.example",
            EntitlementTokenAudience="migratory",
        )
    )
    good = claims(iss="https://auth.example", aud="migratory")
    assert entitlement.allow_connect(who(jwt.encode(good, SECRET, algorithm="HS256")))
    for bad in (claims(), claims(iss="https://other", aud="migratory"),
                claims(iss="https://auth.example", aud="someone-else")):
        assert not entitlement.allow_connect(who(jwt.encode(bad, SECRET, algorithm="HS256")))


def signed(payload: str, secret: str = SECRET) -> str:
    """An HS256 JWT of a payload text as given (PyJWT would not encode NaN)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(payload.encode())
    signature = hmac.new(secret.encode(), signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + b64(signature)).decode()


def test_clock_skew_a_token_not_yet_valid_is_refused_until_then_not_for_ever() -> None:
    from migratory.entitlement_token import NOT_BEFORE_LEEWAY, TokenEntitlement

    now = [1_800_000_000.0]
    entitlement = TokenEntitlement(algorithm="HS256", keys=SECRET.encode(),
                                   clock=lambda: now[0])
    exp = int(now[0]) + 600
    # the issuer's clock runs a few seconds ahead: iat and nbf just ahead of ours
    ahead = jwt.encode(claims(exp=exp, iat=int(now[0]) + 5, nbf=int(now[0]) + 5), SECRET,
                       algorithm="HS256")
    assert entitlement.allow_connect(who(ahead))
    later = jwt.encode(claims(exp=exp, nbf=int(now[0]) + 100), SECRET, algorithm="HS256")
    assert not entitlement.allow_connect(who(later))
    assert not entitlement.allow_subscribe(who(later), "/Stocks/a")
    now[0] += 100 - NOT_BEFORE_LEEWAY
    assert entitlement.allow_connect(who(later))  # the first refusal was not kept
    assert entitlement.allow_subscribe(who(later), "/Stocks/a")


def test_garbage_time_claims_are_refused() -> None:
    from migratory.entitlement_token import TokenEntitlement

    entitlement = TokenEntitlement(algorithm="HS256", keys=SECRET.encode())
    exp = int(time.time()) + 600
    assert entitlement.allow_connect(who(signed(f'{{"exp": {exp}}}')))  # the encoder works
    # NaN and Infinity compare false with every time: such a token never expired
    for payload in ('{"exp": NaN}', '{"exp": Infinity}', '{"exp": 1e400}', '{"exp": true}',
                    '{"exp": "never"}', '{"exp": null}', f'{{"exp": {exp}, "nbf": NaN}}',
                    f'{{"exp": {exp}, "subscribe": "/a/b"}}', '[1, 2]', '"x"',
                    # a whole number past a float (an issuer's bug): OverflowError, not
                    # ValueError -- it escaped the refusal and ended the connection 1011
                    '{"exp": 1' + "0" * 400 + "}", f'{{"exp": {exp}, "nbf": -1' + "0" * 400 + "}"):
        assert not entitlement.allow_connect(who(signed(payload))), payload
        assert not entitlement.allow_subscribe(who(signed(payload)), "/Stocks/a"), payload


def test_huge_and_many_junk_tokens_cost_bounded_memory() -> None:
    from migratory.entitlement_token import MAX_TOKEN_CHARS, TokenEntitlement

    entitlement = TokenEntitlement(algorithm="HS256", keys=SECRET.encode())
    assert not entitlement.allow_connect(who("x" * (MAX_TOKEN_CHARS + 1)))
    for i in range(50):  # junk of 60 kB each, all different
        junk = f"{i}." + "y" * 60_000
        assert not entitlement.allow_connect(who(junk))
        assert not entitlement.allow_subscribe(who(junk), "/Stocks/a")
    grants = entitlement._grants  # type: ignore[attr-defined]
    assert len(grants) == 50
    assert sum(len(key) for key in grants) == 50 * 32  # a digest each, not the token
    assert not entitlement.allow_connect(who("\udcff"))  # not UTF-8 encodable: refused


def _expansions(levels: tuple[str, ...]) -> list[str]:
    """Every subject of levels in {a, b} (at most 4 deep) an MQTT filter matches."""
    out: list[tuple[str, ...]] = [()]
    for level in levels:
        if level == "#":
            tails = [(), ("a",), ("b",), ("a", "a"), ("b", "a")]
            out = [head + tail for head in out for tail in tails]
        elif level == "+":
            out = [(*head, x) for head in out for x in ("a", "b", "c")]
        else:
            out = [(*head, level) for head in out]
    return ["/" + "/".join(s) for s in out if len(s) >= 2]  # a subject has 2+ segments



@settings(max_examples=400, deadline=None)
@given(
    pattern=st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3).flatmap(
        lambda head: st.sampled_from([head, [*head, "**"]])),
    filter_=st.lists(st.sampled_from(["a", "b", "+"]), min_size=0, max_size=3).flatmap(
        lambda head: st.sampled_from([head, [*head, "#"]])).filter(bool),
)
def test_a_pattern_allows_a_filter_only_if_it_allows_every_subject_the_filter_matches(
    pattern: list[str], filter_: list[str]
) -> None:
    """Soundness of the MQTT filter check: never a filter that reaches a subject the
    token does not grant (and, for filters without '#', exactly those)."""
    patterns = SubjectPatterns.parse(["/" + "/".join(pattern)])
    subjects = _expansions(tuple(filter_))
    allowed = patterns.match("/" + "/".join(filter_))
    if allowed:
        assert all(patterns.match(s) for s in subjects), (pattern, filter_)
    elif "#" not in filter_ and subjects:
        assert not all(patterns.match(s) for s in subjects), (pattern, filter_)


@settings(max_examples=300, deadline=None)
@example(token="\udcff")  # JSON's "\udcff" in POST /publish
@example(token="x" * 70_000)
@given(token=st.one_of(
    st.text(st.characters(exclude_categories=())),
    st.lists(st.text(alphabet="ABCDEFabcdef0123456789-_=", max_size=40), min_size=1,
             max_size=4).map(".".join),  # three-part shapes, base64url-ish
))
def test_any_text_as_a_token_is_refused_by_every_mode_and_never_raises(token: str) -> None:
    from migratory.entitlement import BasicEntitlement, NoEntitlement
    from migratory.entitlement_token import TokenEntitlement
    from migratory.server.meta_subjects import MetaSubjectEntitlement

    client = who(token)
    token_mode = TokenEntitlement(algorithm="HS256", keys=SECRET.encode())
    assert not token_mode.allow_connect(client)
    assert not token_mode.allow_subscribe(client, "/Stocks/a")
    assert token_mode.expiry(client) is None
    assert not BasicEntitlement("p" * 20).allow_publish(client, "/Stocks/a")
    meta = MetaSubjectEntitlement(NoEntitlement(), "m" * 20)
    assert not meta.allow_subscribe(client, "/migratory/cluster")
    assert meta.allow_connect(client)
