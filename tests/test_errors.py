"""Error kinds, their HTTP statuses and how errors display [AP-08, AP-09]."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_plugin.errors import BODY_LIMIT, AgentError, ErrorInfo, ErrorKind

SEED_STATUSES = {
    ErrorKind.CONFIG: 500,
    ErrorKind.AUTHENTICATION: 502,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.PROVIDER: 502,
    ErrorKind.TRANSPORT: 503,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TOOL: 500,
    ErrorKind.BUDGET: 413,
    ErrorKind.DECODE: 500,
    ErrorKind.CONFLICT: 409,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.INTERNAL: 500,
    # beyond the seed: what a provider's error says, not only its status (issue 19)
    ErrorKind.OUT_OF_CREDIT: 503,
    ErrorKind.CONTEXT_TOO_LONG: 413,
    ErrorKind.STREAM_INTERRUPTED: 503,
    # bad input: a request over a limit, data that cannot be stored (issue 17)
    ErrorKind.INVALID: 422,
}


def test_status_code_mapping_covers_every_kind() -> None:
    assert set(SEED_STATUSES) == set(ErrorKind)
    for kind, status in SEED_STATUSES.items():
        assert kind.http_status == status
        assert AgentError(kind, "x").http_status == status


@given(st.sampled_from(list(ErrorKind)))
def test_no_kind_maps_to_a_success_status(kind: ErrorKind) -> None:
    assert not 200 <= kind.http_status < 300


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, ErrorKind.AUTHENTICATION),
        (403, ErrorKind.AUTHENTICATION),
        (429, ErrorKind.RATE_LIMITED),
        (413, ErrorKind.BUDGET),
        (408, ErrorKind.UNAVAILABLE),
        (500, ErrorKind.UNAVAILABLE),
        (503, ErrorKind.UNAVAILABLE),
        (529, ErrorKind.UNAVAILABLE),
        (400, ErrorKind.PROVIDER),
        (404, ErrorKind.PROVIDER),
        (422, ErrorKind.PROVIDER),
    ],
)
def test_provider_statuses_classify(status: int, kind: ErrorKind) -> None:
    assert ErrorKind.from_http_status(status) is kind


def test_only_busy_down_or_unreachable_providers_are_retryable() -> None:
    retryable = {k for k in ErrorKind if k.retryable}
    assert retryable == {
        ErrorKind.RATE_LIMITED,
        ErrorKind.UNAVAILABLE,
        ErrorKind.TRANSPORT,
        ErrorKind.STREAM_INTERRUPTED,  # the whole call can be made again
    }
    # an account out of credit is not helped by waiting, nor an overlong conversation
    assert not ErrorKind.OUT_OF_CREDIT.retryable
    assert not ErrorKind.CONTEXT_TOO_LONG.retryable


def test_display_mentions_kind_and_message() -> None:
    error = AgentError(ErrorKind.RATE_LIMITED, "slow down")
    assert str(error) == "[RateLimited] slow down"
    assert "rate_limited" in repr(error)


def test_errors_round_trip_as_plain_data() -> None:
    error = AgentError(
        ErrorKind.UNAVAILABLE, "busy", provider="anthropic", status=529, retry_after=2.5
    )
    data = error.info().model_dump(mode="json", exclude_none=True)
    assert data == {
        "kind": "unavailable",
        "message": "busy",
        "provider": "anthropic",
        "status": 529,
        "retry_after": 2.5,
    }
    again = AgentError.from_info(ErrorInfo.model_validate(data))
    assert (again.kind, again.message, again.status, again.retry_after) == (
        ErrorKind.UNAVAILABLE,
        "busy",
        529,
        2.5,
    )


def test_a_kind_given_as_text_is_coerced() -> None:
    error = AgentError("tool", "x")  # type: ignore[arg-type]
    assert error.kind is ErrorKind.TOOL
    assert str(error) == "[Tool] x"


def test_the_body_is_kept_to_the_limit() -> None:
    error = AgentError(ErrorKind.PROVIDER, "x", body="b" * 2000)
    assert error.body is not None
    assert len(error.body) == BODY_LIMIT
