"""Secret redaction for events and logs [OP-35].

Credential-looking strings, registered secret values and the values of secret-named fields
become ``[REDACTED]`` at any depth; short look-alikes and ordinary values stay as they are, and
no input, however deep or malformed, makes redaction raise.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from agent_plugin.redaction import (
    ASSIGNED_SECRET,
    MAX_DEPTH,
    MIN_SECRET_LENGTH,
    REDACTED,
    RedactingFilter,
    looks_secret,
    needs_no_redaction,
    redact,
    redact_deep,
    redact_logs,
    redact_text,
    register_secret,
    registered_secrets,
    scrub,
    unregister_secret,
)

ANTHROPIC_KEY = "sk-ant-api03-" + "Ab3_xY-9" * 6
OPENAI_KEY = "sk-proj-" + "k2Jd93LmQ0" * 4
LEGACY_OPENAI_KEY = "sk-" + "a1B2c3D4e5" * 2  # exactly 20 characters after the prefix
GITHUB_TOKENS = [
    "ghp_" + "A1b2C3d4E5" * 4,
    "gho_" + "Z9y8X7w6V5" * 3,
    "ghs_" + "q" * 36,
    "github_pat_11ABCDEFG0" + "x_Y" * 10,
]
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
CREDENTIALED_URLS = [
    "postgres://user:pass@host/db",
    "postgresql+asyncpg://app:s3cr3t!@db.internal:5432/app?sslmode=require",
    "redis://default:hunter2@cache:6379/0",
    "https://deploy:ghs_notreallyatoken@github.com/org/repo.git",
    "HTTPS://User:Pass@Example.com/",
]


# --- strings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    [ANTHROPIC_KEY, OPENAI_KEY, LEGACY_OPENAI_KEY, *GITHUB_TOKENS, JWT, *CREDENTIALED_URLS],
)
def test_credentials_are_redacted_in_strings(secret: str) -> None:
    assert looks_secret(secret)
    assert redact_text(secret) == REDACTED
    embedded = f"use {secret} for this"
    assert redact_text(embedded) == f"use {REDACTED} for this"
    assert secret not in redact_text(embedded)
    assert redact(secret) == REDACTED


def test_every_secret_in_a_string_is_redacted() -> None:
    text = f"key={OPENAI_KEY}, token={GITHUB_TOKENS[0]}\ndsn={CREDENTIALED_URLS[0]} jwt:{JWT}"
    redacted = redact_text(text)
    assert redacted == f"key={REDACTED}, token={REDACTED}\ndsn={REDACTED} jwt:{REDACTED}"


def test_keys_inside_authorization_values_are_redacted() -> None:
    assert redact_text(f"Bearer {ANTHROPIC_KEY}") == REDACTED
    assert redact_text("Authorization: Bearer abcdefghijklmnopqrstuvwx") == (
        f"Authorization: {REDACTED}"
    )
    assert redact_text(f'{{"x-api-key": "{ANTHROPIC_KEY}"}}') == f'{{"x-api-key": "{REDACTED}"}}'


@pytest.mark.parametrize(
    "text",
    [
        "sk-short",
        "sk-" + "a" * 19,  # one short of a key
        "sk-ant-tiny",
        "ghp_short",
        "gh_" + "a" * 30,  # not a GitHub token prefix
        "https://example.com/path?q=1",
        "https://example.com:8080/a:b",
        "https://user@example.com/no-password",
        "mailto:someone@example.com",
        "someone@example.com",
        "eyJhbGciOiJIUzI1NiJ9",  # one JWT segment is just base64
        "risk-assessment-framework-2024-q3",  # words ending in "sk" are not keys
        "task-0123456789abcdefghijklmnop",
        "token",
        "password",
        "Bearer",
        "",
        "Ünïcödé 日本語 🙂",
    ],
)
def test_look_alikes_stay(text: str) -> None:
    assert not looks_secret(text)
    assert redact_text(text) == text
    assert redact(text) == text


# --- fields ---------------------------------------------------------------------------------------

SECRET_FIELDS = [
    "password",
    "secret",
    "token",
    "api_key",
    "apikey",
    "private_key",
    "access_token",
    "refresh_token",
    "authorization",
    "proxy-authorization",
]


@pytest.mark.parametrize("field", SECRET_FIELDS)
@pytest.mark.parametrize("spelling", [str.lower, str.upper, str.title])
def test_secret_named_fields_are_redacted(field: str, spelling: Callable[[str], str]) -> None:
    name = spelling(field)
    assert redact({name: "plain value", "city": "Oslo"}) == {name: REDACTED, "city": "Oslo"}


@pytest.mark.parametrize("value", ["", "x", 12345, 1.5, True, ["a", "b"], {"nested": "v"}])
def test_any_value_of_a_secret_field_is_redacted(value: JsonValue) -> None:
    assert redact({"password": value}) == {"password": REDACTED}


@pytest.mark.parametrize(
    "name",
    [
        "x_api_key",
        "X-Api-Key",
        "xApiKey",
        "accessToken",
        "refreshToken",
        "idToken",
        "clientSecret",
        "client-secret",
        "CLIENT_SECRET",
        "apiKey",
        "API-KEY",
        "openai_api_key",
        "privateKey",
        "ssh-private-key",
        "db_passwd",
        "newPassword",
        "Proxy_Authorization",
        "github_token",
    ],
)
def test_secret_names_match_in_any_case_and_separator_style(name: str) -> None:
    assert redact({name: "plain value", "city": "Oslo"}) == {name: REDACTED, "city": "Oslo"}


@pytest.mark.parametrize(
    "name", ["tokens", "max_tokens", "tokenCount", "secretary", "keyboard", "api", "key", "author"]
)
def test_names_that_only_resemble_secret_names_stay(name: str) -> None:
    assert redact({name: "plain value"}) == {name: "plain value"}


def test_a_null_secret_field_stays_null() -> None:
    assert redact({"token": None}) == {"token": None}


def test_fields_are_redacted_at_any_depth() -> None:
    arguments: JsonValue = {
        "service": "billing",
        "connections": [
            {"name": "primary", "config": {"Password": "hunter2", "host": "db"}},
            {"name": "replica", "auth": [{"ACCESS_TOKEN": "abc", "scope": "read"}]},
        ],
        "headers": {"Authorization": "Basic dXNlcjpwYXNz", "Accept": "application/json"},
        "nested": [[{"refresh_token": "r"}], [{"note": f"key is {OPENAI_KEY}"}]],
    }
    assert redact(arguments) == {
        "service": "billing",
        "connections": [
            {"name": "primary", "config": {"Password": REDACTED, "host": "db"}},
            {"name": "replica", "auth": [{"ACCESS_TOKEN": REDACTED, "scope": "read"}]},
        ],
        "headers": {"Authorization": REDACTED, "Accept": "application/json"},
        "nested": [[{"refresh_token": REDACTED}], [{"note": f"key is {REDACTED}"}]],
    }


def test_ordinary_fields_and_values_stay() -> None:
    arguments: JsonValue = {
        "kind": "token",
        "field": "password",
        "max_tokens": 100,
        "input_tokens": 3,
        "tokenizer": "cl100k",
        "secretary": "Ada",
        "url": "https://example.com/docs",
    }
    assert redact(arguments) == arguments


@pytest.mark.parametrize(
    "value", [None, True, False, 0, -7, 2**40, 3.25, [], {}, [1, None, False, 2.5]]
)
def test_non_string_values_pass_through(value: JsonValue) -> None:
    assert redact(value) == value
    assert redact({"data": value}) == {"data": value}


def test_redact_does_not_touch_its_input() -> None:
    arguments: JsonValue = {"password": "hunter2", "items": [{"token": "t"}], "dsn": JWT}
    redact(arguments)
    assert arguments == {"password": "hunter2", "items": [{"token": "t"}], "dsn": JWT}


_plain = st.text(alphabet="abcdefghij klm.,:/-_0123", max_size=12)
_json: st.SearchStrategy[JsonValue] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _plain,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "city", "items", "n"]), children, max_size=3)
    ),
    max_leaves=8,
)


@given(_json)
@settings(max_examples=50)
def test_values_without_secrets_are_unchanged(value: JsonValue) -> None:
    assert redact(value) == value


@given(_json, st.sampled_from([OPENAI_KEY, ANTHROPIC_KEY, JWT, GITHUB_TOKENS[0]]))
@settings(max_examples=50)
def test_a_planted_secret_never_survives(value: JsonValue, secret: str) -> None:
    planted: JsonValue = {"payload": value, "deep": [{"note": f"see {secret}"}], "Token": secret}
    assert secret not in repr(redact(planted))


# --- redact_deep: what is published or stored -----------------------------------------------


@given(_json)
@settings(max_examples=50)
def test_deep_redaction_leaves_values_without_secrets_alone(value: JsonValue) -> None:
    assert redact_deep(value) == value
    encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert redact_deep(encoded) == encoded  # byte for byte: JSON is re-encoded only if changed


@given(_json, st.sampled_from([OPENAI_KEY, ANTHROPIC_KEY, JWT, GITHUB_TOKENS[0]]))
@settings(max_examples=50)
def test_a_secret_in_json_held_in_a_string_never_survives(value: JsonValue, secret: str) -> None:
    planted: JsonValue = {"payload": value, "password": "hunter2-x", "note": f"see {secret}"}
    for held in (json.dumps(planted), json.dumps(json.dumps(planted))):  # a tool's encoded str
        cleaned = redact_deep({"content": held})
        assert secret not in repr(cleaned)
        assert "hunter2-x" not in repr(cleaned)


def test_deep_redaction_of_json_in_strings_and_assignments_in_text() -> None:
    result = json.dumps(json.dumps({"ok": True, "token": "abc-123", "n": 2}))
    assert json.loads(json.loads(str(redact_deep(result)))) == {
        "ok": True,
        "token": REDACTED,
        "n": 2,
    }
    assert redact_deep("logged in, password: hunter2; api_key=xyz&b=1") == (
        f"logged in, password: {REDACTED}; api_key={REDACTED}&b=1"
    )
    assert redact_deep('"quoted" and "more"') == '"quoted" and "more"'  # not JSON: text
    usage = {"input_tokens": 3, "output_tokens": 4, "max_tokens": 9}
    assert redact_deep(usage) == usage  # counts of tokens are no secret


# --- needs_no_redaction: the look at a whole document that lets it go out as written -------

_REGISTERED = "unfamiliar-shape-0xC0FFEE"
_risky_names = st.sampled_from(
    ["a", "city", "n", "tokens", "max_tokens", "input_tokens", "keyboard", "author", "usage"]
    + [spell(name) for name in SECRET_FIELDS for spell in (str.lower, str.upper, str.title)]
    + ["x-api-key", "xApiKey", "db_passwd", "Proxy_Authorization", "pass-word", "Ṫoken"]
)
_risky_text = st.one_of(
    st.text(alphabet="abcdefghij klm.,:=/-_\"'{}[]0123", max_size=16),
    st.sampled_from(
        [
            *(OPENAI_KEY, JWT, GITHUB_TOKENS[0], CREDENTIALED_URLS[1], _REGISTERED, "[1, [2]]"),
            *("password: hunter2", "api_key=xyz", "Bearer abcdefghijklmnopqrstu", "tokens: 3"),
            *("PASSWORD = x", "{}", "[]", "   [true]", " ", "ǅtoken=x", "paſsword=x"),
        ]
    ),
)
_risky_json: st.SearchStrategy[JsonValue] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _risky_text,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(_risky_names, children, max_size=3)
        | children.map(lambda value: json.dumps(value))  # JSON held in a string, as a tool's
    ),
    max_leaves=10,
)


@given(_risky_json)
@settings(max_examples=400)
def test_a_document_let_through_as_written_is_one_redaction_leaves_alone(value: JsonValue) -> None:
    with registered_secrets(_REGISTERED):
        for document in (
            json.dumps(value, ensure_ascii=False, separators=(",", ":")),
            json.dumps({"content": value}, ensure_ascii=False, separators=(",", ":")),
        ):
            if needs_no_redaction(document):
                parsed = json.loads(document)
                assert redact_deep(parsed) == parsed, document


@given(st.lists(_risky_json, min_size=1, max_size=4))
@settings(max_examples=200)
def test_documents_let_through_together_are_each_one_redaction_leaves_alone(
    values: list[JsonValue],
) -> None:
    documents = [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values]
    with registered_secrets(_REGISTERED):
        if needs_no_redaction(*documents):
            for document in documents:
                parsed = json.loads(document)
                assert redact_deep(parsed) == parsed, document
                assert needs_no_redaction(document)


def test_a_dotted_capital_i_is_an_i_for_the_assignment_rules() -> None:
    # "İ".casefold() is "i" and a combining dot; the rules, ignoring case, take "İ" for "i"
    assert redact_deep("config: prİvate_key=abc123") == f"config: prİvate_key={REDACTED}"
    assert redact_deep("config: apİ_key=sk_live_abcdefgh1234") == f"config: apİ_key={REDACTED}"
    assert not needs_no_redaction('{"c":"config: apİ_key=sk_live_abcdefgh1234"}')


def test_ordinary_documents_go_out_as_written_and_the_rest_are_cleaned() -> None:
    usage = '{"type":"model_response","usage":{"input_tokens":3,"max_tokens":9},"text":"Hi: 4"}'
    assert needs_no_redaction(usage)
    assert needs_no_redaction('{"url":"https://example.com/a?b=1","n":[1,2,{"x":null}]}')
    assert needs_no_redaction('{"content":"{\\"ok\\":true}"}')  # a tool's JSON, in a string
    assert needs_no_redaction('{"text":"line one\\nline \\"two\\"\\t/ three"}')
    for risky in [
        '{"content":"{\\"password\\":\\"hunter2\\"}"}',  # a secret field in JSON in a string
        '{"content":"{\\"note\\":\\"token\\\\u003dabc\\"}"}',  # JSON in JSON in a string
        '{"note":"pass\\u0077ord: hunter2"}',  # a letter written as an escape
        '{"note":"password\\n: hunter2"}',  # an escaped newline is whitespace
        '{"Password":null}',
        '{"x_api_key":1}',
        f'{{"note":"use {OPENAI_KEY}"}}',
        '{"note":"token=abc"}',
        '{"a":' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}",
    ]:
        assert not needs_no_redaction(risky), risky
    with registered_secrets(_REGISTERED):
        assert not needs_no_redaction(f'{{"note":"{_REGISTERED}"}}')
    assert needs_no_redaction(f'{{"note":"{_REGISTERED}"}}')


# --- scrub: one known secret ----------------------------------------------------------------


def test_scrub_replaces_every_occurrence_of_the_secret() -> None:
    secret = "opaque-proxy-token-42"  # a shape no pattern knows
    assert not looks_secret(secret)
    text = f"key {secret} rejected; you sent {secret}."
    assert scrub(text, secret) == f"key {REDACTED} rejected; you sent {REDACTED}."


@pytest.mark.parametrize("secret", [None, ""])
def test_scrub_without_a_secret_changes_nothing(secret: str | None) -> None:
    assert scrub("anything at all", secret) == "anything at all"


def test_scrub_leaves_text_without_the_secret_alone() -> None:
    assert scrub(f"see {OPENAI_KEY}", "another-secret-value") == f"see {OPENAI_KEY}"


# --- the cheap checks before the patterns -------------------------------------------------------

_ASSIGNMENT_PIECES = [
    "password", "PassWord", "paſſword", "passwd", "secret", "SECRET", "token", "toKen",
    "api_key", "apı-key", "APIKEY", "private_key", "prıvatekey", "key", "api", "a", "x1",
    "authorization", "AuthorİzatIon", "basic ", "Bearer ",
    ":", "=", " ", '"', "'", ";", ",", "&", "}", "]", "-", ".", "_", "\n",
]  # fmt: skip


@given(st.lists(st.sampled_from(_ASSIGNMENT_PIECES), max_size=14).map("".join))
@settings(max_examples=300)
def test_assignments_are_found_wherever_the_pattern_matches(text: str) -> None:
    prose = "note " + text  # not JSON: cleaned as text
    expected = ASSIGNED_SECRET.sub(lambda m: m.group(1) + REDACTED, redact_text(prose))
    assert redact_deep(prose) == expected


@pytest.mark.parametrize(
    "text",
    [
        "apıkey=abc123",  # a dotless i matches "i" ignoring case
        "prıvate-key: abc123",
        "paſſword: abc123",  # a long s matches "s" ignoring case
        "toKen=abc123",  # the Kelvin sign matches "k" ignoring case
    ],
)
def test_assignments_with_unicode_case_variants_are_caught(text: str) -> None:
    assert "abc123" not in str(redact_deep(text))


@pytest.mark.parametrize(
    ("text", "credential"),
    [
        ("you sent Authorization: Basic dTpwdzEyMzQ1Ng==", "dTpwdzEyMzQ1Ng"),
        ("Proxy-Authorization: Basic Ym9iOmh1bnRlcg==", "Ym9iOmh1bnRlcg"),
        ("authorization=opaqueGatewayKey", "opaqueGatewayKey"),
        ("Authorization: Bearer short123", "short123"),
    ],
)
def test_authorization_assignments_in_text_lose_their_credentials(
    text: str, credential: str
) -> None:
    """The docs name authorization among the secret names whose ``name: value`` assignments
    lose their value; the rule left it out, so a header echoed in a text body or a log line
    kept credentials shorter than the Basic/Bearer pattern's 16 characters."""
    cleaned = str(redact_deep(text))
    assert credential not in cleaned
    assert REDACTED in cleaned
    assert "uthorization" in cleaned  # the name stays
    assert not needs_no_redaction(json.dumps({"note": text}))


# --- never raising --------------------------------------------------------------------------


def nested_lists(depth: int, bottom: JsonValue) -> JsonValue:
    value = bottom
    for _ in range(depth):
        value = [value]
    return value


def depth_of(value: JsonValue) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack += [(child, depth + 1) for child in item.values()]
        elif isinstance(item, list):
            stack += [(child, depth + 1) for child in item]
    return deepest


@pytest.mark.parametrize("depth", [500, 5000])
@pytest.mark.parametrize(
    ("opening", "closing"), [("[", "]"), ('{"a":', "}"), ('["x",{"list":[', "]}]")]
)
def test_deeply_nested_json_in_a_string_is_cleaned_as_text(
    depth: int, opening: str, closing: str
) -> None:
    """A prompt or a tool result holding JSON nested beyond MAX_DEPTH: text rules apply."""
    plain = opening * depth + "1" + closing * depth
    assert redact_deep(plain) == plain
    assert redact_deep({"content": plain}) == {"content": plain}
    leaky = opening * depth + f'{{"password":"hunter2-x","note":"{OPENAI_KEY}"}}' + closing * depth
    for cleaned in (redact_deep(leaky), redact_deep([leaky]), redact(leaky)):
        assert OPENAI_KEY not in str(cleaned)
    assert "hunter2-x" not in str(redact_deep(leaky))


def test_json_nested_within_the_bound_is_redacted_field_by_field() -> None:
    depth = MAX_DEPTH - 10
    held = json.dumps(nested_lists(depth, {"authorization": "opaque-value", "n": 1}))
    cleaned = redact_deep({"result": held})
    assert isinstance(cleaned, dict)
    assert json.loads(str(cleaned["result"])) == nested_lists(
        depth, {"authorization": REDACTED, "n": 1}
    )


@pytest.mark.parametrize("clean", [redact, redact_deep])
def test_deeply_nested_values_are_cut_at_max_depth(clean: Callable[[JsonValue], JsonValue]) -> None:
    value = nested_lists(10, {"token": "t-1", "deep": nested_lists(5000, f"see {JWT}")})
    cleaned = clean(value)
    assert depth_of(cleaned) == MAX_DEPTH
    json.dumps(cleaned)  # shallow enough for any encoder
    assert JWT not in json.dumps(cleaned)
    top = cleaned
    for _ in range(10):
        assert isinstance(top, list)
        [top] = top
    assert isinstance(top, dict)
    assert top["token"] == REDACTED
    deepest = nested_lists(MAX_DEPTH - 11, REDACTED)
    assert top["deep"] == deepest


def test_values_that_hold_themselves_do_not_loop() -> None:
    looped: dict[str, Any] = {"note": f"key {OPENAI_KEY}"}
    looped["self"] = looped
    chain: list[Any] = []
    chain.append(chain)
    for value in (looped, chain):
        for clean in (redact, redact_deep):
            cleaned = clean(value)
            assert OPENAI_KEY not in repr(cleaned)
            assert depth_of(cleaned) == MAX_DEPTH


def test_values_outside_json_pass_through_or_are_read_as_json() -> None:
    value: Any = {1: f"k {OPENAI_KEY}", None: ("a", f"b {JWT}"), "raw": b"bytes", "set": {1}}
    assert redact(value) == {
        1: f"k {REDACTED}",
        None: ["a", f"b {REDACTED}"],
        "raw": b"bytes",
        "set": {1},
    }


def test_redaction_keeps_nothing_of_what_it_has_seen() -> None:
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for n in range(20):
            redact_deep({f"field-{n}-" * 50_000: 1})  # field names of half a megabyte each
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 1_000_000


_any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
_json_text = st.lists(
    st.sampled_from(['{"a":', '{"token":', "[", "]", "}", '"', "\\", ",", ":", "1", " ", "x"]),
    max_size=40,
).map("".join)
_deep_text = st.tuples(st.integers(0, 3000), st.sampled_from([("[", "]"), ('{"a":', "}")])).map(
    lambda spec: spec[1][0] * spec[0] + "1" + spec[1][1] * spec[0]
)
_anything: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | _any_text
    | _json_text
    | _deep_text
    | st.sampled_from([OPENAI_KEY, JWT, "password: hunter2"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(_any_text | st.sampled_from(["token", "Password"]), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_anything)
@settings(max_examples=300)
def test_redaction_never_raises(value: Any) -> None:
    with registered_secrets(
        "qz-registered-0123456789", '"quoted\\secret"ü', "lone-\ud800-surrogate"
    ):
        redact(value)
        redact_deep(value)
        for text in (value, json.dumps(value, default=str), repr(value)):
            if isinstance(text, str):
                redact_text(text)
                redact_deep(text)
                looks_secret(text)
                scrub(text, text[:9])


@given(st.one_of(_any_text, _json_text, _deep_text))
@settings(max_examples=300)
def test_redaction_of_text_never_raises(text: str) -> None:
    assert isinstance(redact_text(text), str)
    assert isinstance(redact_deep(text), str)


# --- known secrets: redaction by value ------------------------------------------------------

UNFAMILIAR_KEY = "qz" + "0123456789abcdef" * 2 + "01234567"  # a gateway key: qz + 40 hex


def test_an_unfamiliar_key_passes_until_it_is_registered() -> None:
    text = f"the key is {UNFAMILIAR_KEY}."
    assert not looks_secret(UNFAMILIAR_KEY)
    assert redact_text(text) == text
    with registered_secrets(UNFAMILIAR_KEY):
        assert looks_secret(text)
        assert redact_text(text) == f"the key is {REDACTED}."
    assert redact_text(text) == text


def test_every_tool_redacts_a_registered_secret() -> None:
    key = UNFAMILIAR_KEY
    with registered_secrets(key):
        assert redact_text(f"x{key}y") == f"x{REDACTED}y"  # inside a larger word too
        assert redact({"note": f"use {key}", key: [key]}) == {
            "note": f"use {REDACTED}",
            REDACTED: [REDACTED],
        }
        held = json.dumps({"result": {"echo": key}})
        assert json.loads(str(redact_deep(json.dumps(held)))) == json.dumps(
            {"result": {"echo": REDACTED}}, separators=(",", ":")
        )
        assert redact_deep(f"logged: {key}") == f"logged: {REDACTED}"
        assert scrub(f"server said {key}", None) == f"server said {REDACTED}"
        assert scrub(f"{key} and opaque-proxy-token", "opaque-proxy-token") == (
            f"{REDACTED} and {REDACTED}"
        )


AWKWARD = 'pa"ss\\wörd/42 x+y&z'


@pytest.mark.parametrize(
    "written",
    [
        json.dumps(AWKWARD),
        json.dumps(AWKWARD, ensure_ascii=False),
        quote(AWKWARD, safe=""),
        quote(AWKWARD, safe="").lower(),
        quote(AWKWARD),
        quote_plus(AWKWARD),
    ],
    ids=["json", "json-unicode", "url", "url-lower-hex", "url-path", "url-plus"],
)
def test_a_registered_secret_is_found_json_escaped_and_url_encoded(written: str) -> None:
    text = f"GET /login?next={written}&ok=1"
    with registered_secrets(AWKWARD):
        cleaned = redact_text(text)
    assert REDACTED in cleaned
    assert written.strip('"') not in cleaned
    assert cleaned.startswith("GET /login?next=")
    assert cleaned.endswith("&ok=1")


@pytest.mark.parametrize(
    "value", [None, "", "a", "1234567", "REDACTED", "[REDACTED", REDACTED, "EDACTED]"]
)
def test_empty_short_and_marker_values_are_refused(value: str | None) -> None:
    assert not register_secret(value)
    text = f"a 1234567 {REDACTED} stays"
    assert redact_text(text) == text
    unregister_secret(value)  # nothing to undo


def test_the_shortest_accepted_value() -> None:
    value = "x" * MIN_SECRET_LENGTH
    try:
        assert register_secret(value)
        assert redact_text(f"{value[:-1]} {value}") == f"{value[:-1]} {REDACTED}"
    finally:
        unregister_secret(value)


def test_registrations_are_counted() -> None:
    text = f"key {UNFAMILIAR_KEY}"
    assert register_secret(UNFAMILIAR_KEY)
    assert register_secret(UNFAMILIAR_KEY)  # a second app in the process, say
    unregister_secret(UNFAMILIAR_KEY)
    assert redact_text(text) == f"key {REDACTED}"
    unregister_secret(UNFAMILIAR_KEY)
    assert redact_text(text) == text
    unregister_secret(UNFAMILIAR_KEY)  # one too many changes nothing
    assert redact_text(text) == text


def test_registered_secrets_are_unregistered_after_an_error() -> None:
    with pytest.raises(RuntimeError), registered_secrets(UNFAMILIAR_KEY, "short"):
        raise RuntimeError
    assert redact_text(UNFAMILIAR_KEY) == UNFAMILIAR_KEY


@pytest.mark.parametrize(
    ("secrets", "text"),
    [
        (["abcdefgh12", "gh12345678"], "<abcdefgh12345678>"),  # overlapping
        (["hunter2hunter2", "hunter2hunter2hunter2"], "<hunter2hunter2hunter2>"),  # nested
        (["aaaaaaaa"], "<aaaaaaaaaaaaaaaaaaaaa>"),  # overlapping with itself
        (["secret-one-1", "secret-two-2"], "<secret-one-1secret-two-2>"),  # adjacent
    ],
)
def test_overlapping_secrets_leave_no_fragment(secrets: list[str], text: str) -> None:
    with registered_secrets(*secrets):
        assert redact_text(text) == f"<{REDACTED}>"


def test_known_secrets_are_thread_safe() -> None:
    steady = "steady-secret-" + "9" * 20
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            for round_ in range(200):
                mine = f"worker-{worker}-round-{round_}-value"
                with registered_secrets(mine):
                    cleaned = redact_text(f"{steady} {mine}")
                    assert cleaned == f"{REDACTED} {REDACTED}", cleaned
        except BaseException as error:  # reported below
            errors.append(error)

    with registered_secrets(steady):
        threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert redact_text("worker-3-round-7-value") == "worker-3-round-7-value"
    assert redact_text(steady) == steady


# --- logs -------------------------------------------------------------------------------------


class Holder:
    def __repr__(self) -> str:
        return f"Holder({UNFAMILIAR_KEY!r})"


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    logger = logging.getLogger("tests.redaction.logs")
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s %(detail)s"))
    logger.addHandler(handler)
    logger.propagate = False
    redact_logs(logger)
    try:
        with registered_secrets(UNFAMILIAR_KEY):
            yield logger, output
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.filters.clear()


def test_log_records_are_redacted(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, output = logged
    logger.warning("calling with %s and %r", UNFAMILIAR_KEY, Holder(), extra={"detail": ""})
    logger.warning(f"password: hunter2-x, {OPENAI_KEY}", extra={"detail": {"token": "t-9"}})
    try:
        raise ValueError(f"upstream echoed {UNFAMILIAR_KEY}")
    except ValueError:
        logger.exception("failed", extra={"detail": f"dsn {CREDENTIALED_URLS[0]}"}, stack_info=True)
    text = output.getvalue()
    for leaked in (UNFAMILIAR_KEY, "hunter2-x", OPENAI_KEY, "t-9", CREDENTIALED_URLS[0]):
        assert leaked not in text
    assert f"calling with {REDACTED} and Holder('{REDACTED}')" in text
    assert "ValueError: upstream echoed [REDACTED]" in text
    assert "Stack (most recent call last)" in text


def test_a_broken_log_call_is_let_through(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, output = logged
    logger.warning(f"{UNFAMILIAR_KEY} %s %s", "one", extra={"detail": ""})  # one argument short
    assert UNFAMILIAR_KEY not in output.getvalue()
    assert f"{REDACTED} %s %s" in output.getvalue()


def test_redact_logs_installs_one_filter_per_target() -> None:
    logger = logging.getLogger("tests.redaction.install")
    handler = logging.NullHandler()
    try:
        redact_logs(logger, "tests.redaction.install", handler)
        redact_logs(logger, handler)
        assert [type(f) for f in logger.filters] == [RedactingFilter]
        assert [type(f) for f in handler.filters] == [RedactingFilter]
    finally:
        logger.filters.clear()
