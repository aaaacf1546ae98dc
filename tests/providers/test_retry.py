"""Retry policy, Retry-After parsing, retry_call and the SSE parsing rules (no network)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.providers.http import SseEvent, iter_sse, sse_lines
from agent_plugin.providers.retry import RetryNotice, RetryPolicy, parse_retry_after, retry_call

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


# --- parse_retry_after ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": " 2 "}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"Retry-After": "4"}, 4.0),
        (httpx.Headers({"Retry-After": "7"}), 7.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"Retry-After-Ms": "1500.5", "Retry-After": "9"}, 1.5005),
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after-ms": "-5", "retry-after": "9"}, 9.0),
    ],
)
def test_parse_retry_after_seconds_and_millis(headers: dict[str, str], expected: float) -> None:
    assert parse_retry_after(headers, now=NOW) == pytest.approx(expected)


def test_parse_retry_after_http_date_in_the_future() -> None:
    when = format_datetime(NOW + timedelta(seconds=10), usegmt=True)
    assert when.endswith("GMT")
    assert parse_retry_after({"retry-after": when}, now=NOW) == pytest.approx(10.0)


def test_parse_retry_after_http_date_in_the_past_means_no_wait() -> None:
    when = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
    assert parse_retry_after({"retry-after": when}, now=NOW) == 0.0


def test_parse_retry_after_http_date_against_the_real_clock() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    wait = parse_retry_after({"retry-after": when})
    assert wait is not None
    assert 28.0 <= wait <= 30.0


@pytest.mark.parametrize(
    "value", ["", "soon", "nan", "inf", "-inf", "1e999", "-1", "12 seconds", "Mon, 99 Foo"]
)
def test_parse_retry_after_garbage_is_absent(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, now=NOW) is None


def test_parse_retry_after_without_the_header() -> None:
    assert parse_retry_after({}) is None
    assert parse_retry_after({"x-ratelimit-reset-requests": "1s"}) is None


# --- RetryPolicy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"base_delay": -0.1},
        {"max_delay": -1.0},
        {"max_retry_after": -1.0},
        {"base_delay": math.nan},
        {"max_delay": math.inf},
        {"max_retry_after": math.nan},
    ],
)
def test_retry_policy_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(AgentError) as caught:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.CONFIG


def test_retry_policy_never_makes_one_attempt() -> None:
    assert RetryPolicy.never().max_attempts == 1


def _unavailable(retry_after: float | None = None) -> AgentError:
    return AgentError(ErrorKind.UNAVAILABLE, "busy", status=503, retry_after=retry_after)


delays = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(base=delays, cap=delays, retry=st.integers(min_value=0, max_value=10_000))
def test_full_jitter_stays_within_the_exponential_ceiling(
    base: float, cap: float, retry: int
) -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=base, max_delay=cap)
    wait = policy.wait_before(retry, _unavailable())
    ceiling = min(base * 2.0 ** min(retry, 64), cap)
    assert 0.0 <= wait <= ceiling


def test_full_jitter_spreads_over_the_whole_interval() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=100.0)
    waits = [policy.wait_before(2, _unavailable()) for _ in range(400)]
    assert max(waits) <= 4.0
    assert min(waits) < 1.0 < 3.0 < max(waits)  # not a fixed delay, not only the top


@given(retry_after=delays, cap=delays, retry=st.integers(min_value=0, max_value=50))
def test_retry_after_is_honoured_up_to_the_cap(retry_after: float, cap: float, retry: int) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=10.0, max_retry_after=cap)
    wait = policy.wait_before(retry, _unavailable(retry_after))
    assert wait == (retry_after if retry_after <= cap else None)


@pytest.mark.parametrize(("retry_after", "wait"), [(60.0, 60.0), (60.5, None), (math.inf, None)])
def test_retry_after_past_the_cap_means_no_retry(retry_after: float, wait: float | None) -> None:
    assert RetryPolicy(max_retry_after=60.0).wait_before(0, _rate_limited(retry_after)) == wait


# --- retry_call (event-loop time is fast-forwarded by looptime) ------------------------------


class Flaky:
    """Fails with the given errors in turn, then answers ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.call_times: list[float] = []

    async def __call__(self) -> str:
        self.calls += 1
        self.call_times.append(asyncio.get_running_loop().time())
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _rate_limited(retry_after: float | None) -> AgentError:
    return AgentError(ErrorKind.RATE_LIMITED, "slow down", status=429, retry_after=retry_after)


@pytest.mark.looptime
@pytest.mark.parametrize(
    "kind",
    [ErrorKind.AUTHENTICATION, ErrorKind.PROVIDER, ErrorKind.DECODE, ErrorKind.BUDGET],
)
async def test_non_retryable_errors_are_raised_at_once(kind: ErrorKind) -> None:
    error = AgentError(kind, "no")
    op = Flaky(error, error)
    notices: list[RetryNotice] = []
    with pytest.raises(AgentError) as caught:
        await retry_call(op, RetryPolicy(), on_retry=notices.append)
    assert caught.value is error
    assert op.calls == 1
    assert notices == []


@pytest.mark.looptime
async def test_other_exceptions_pass_through_untouched() -> None:
    op = Flaky(KeyError("x"))
    with pytest.raises(KeyError):
        await retry_call(op, RetryPolicy())
    assert op.calls == 1


@pytest.mark.looptime
@pytest.mark.parametrize(
    "kind", [ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE, ErrorKind.TRANSPORT]
)
async def test_retryable_errors_are_retried_until_success(kind: ErrorKind) -> None:
    op = Flaky(AgentError(kind, "first"), AgentError(kind, "second"))
    assert await retry_call(op, RetryPolicy(max_attempts=3)) == "ok"
    assert op.calls == 3


@pytest.mark.looptime
async def test_attempts_are_bounded_and_every_retry_is_reported() -> None:
    errors = [_rate_limited(2.0) for _ in range(10)]
    op = Flaky(*errors)
    notices: list[RetryNotice] = []
    with pytest.raises(AgentError) as caught:
        await retry_call(op, RetryPolicy(max_attempts=4), on_retry=notices.append)
    assert op.calls == 4
    assert caught.value is errors[3]
    assert [n.attempt for n in notices] == [1, 2, 3]
    assert {n.max_attempts for n in notices} == {4}
    assert [n.wait for n in notices] == [2.0, 2.0, 2.0]
    assert [n.error for n in notices] == errors[:3]
    assert [n.elapsed for n in notices] == pytest.approx([0.0, 2.0, 4.0])
    # the waits were really slept between the attempts
    gaps = [b - a for a, b in zip(op.call_times, op.call_times[1:], strict=False)]
    assert gaps == pytest.approx([2.0, 2.0, 2.0])


@pytest.mark.looptime
async def test_backoff_without_retry_after_uses_jitter_within_bounds() -> None:
    op = Flaky(_unavailable(), _unavailable(), _unavailable())
    notices: list[RetryNotice] = []
    policy = RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=3.0)
    assert await retry_call(op, policy, on_retry=notices.append) == "ok"
    for notice, ceiling in zip(notices, [1.0, 2.0, 3.0], strict=True):
        assert 0.0 <= notice.wait <= ceiling


@pytest.mark.looptime
async def test_retry_after_longer_than_the_time_left_raises_without_sleeping() -> None:
    loop = asyncio.get_running_loop()
    error = _rate_limited(5.0)
    op = Flaky(error)
    notices: list[RetryNotice] = []
    start = loop.time()
    with pytest.raises(AgentError) as caught:
        await retry_call(op, RetryPolicy(), deadline=start + 3.0, on_retry=notices.append)
    assert caught.value is error
    assert op.calls == 1
    assert notices == []
    assert loop.time() - start == pytest.approx(0.0)


@pytest.mark.looptime
async def test_retry_after_longer_than_max_retry_after_raises_at_once() -> None:
    """Retrying sooner than the server said would only be refused again: give up at once."""
    loop = asyncio.get_running_loop()
    error = _rate_limited(120.0)
    op = Flaky(error)
    notices: list[RetryNotice] = []
    start = loop.time()
    with pytest.raises(AgentError) as caught:
        await retry_call(op, RetryPolicy(max_retry_after=60.0), on_retry=notices.append)
    assert caught.value is error
    assert op.calls == 1
    assert notices == []
    assert loop.time() - start == pytest.approx(0.0)
    # within the cap the same error is waited out and retried
    op = Flaky(_rate_limited(60.0))
    assert await retry_call(op, RetryPolicy(max_retry_after=60.0)) == "ok"
    assert op.calls == 2
    assert loop.time() - start == pytest.approx(60.0)


@pytest.mark.looptime
async def test_deadline_allows_retries_that_fit_and_stops_the_next() -> None:
    loop = asyncio.get_running_loop()
    op = Flaky(*[_rate_limited(1.0) for _ in range(5)])
    with pytest.raises(AgentError):
        await retry_call(op, RetryPolicy(max_attempts=10), deadline=loop.time() + 2.5)
    assert op.calls == 3  # at t=0, 1, 2; a retry at t=3 would pass the deadline


@pytest.mark.looptime
async def test_a_single_attempt_policy_never_retries() -> None:
    op = Flaky(_unavailable())
    with pytest.raises(AgentError):
        await retry_call(op, RetryPolicy.never())
    assert op.calls == 1


# --- iter_sse ------------------------------------------------------------------------------


async def _aiter(items: Iterable[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


async def _events(lines: list[str]) -> list[SseEvent]:
    return [event async for event in iter_sse(_aiter(lines))]


async def test_sse_comments_are_skipped() -> None:
    lines = [": OPENROUTER PROCESSING", "", ":", 'data: {"a":1}', ": keep-alive", ""]
    assert await _events(lines) == [SseEvent(None, '{"a":1}')]


async def test_sse_multi_line_data_joins_with_newlines() -> None:
    lines = ["data: first", "data: second", "data:", "data: fourth", ""]
    assert await _events(lines) == [SseEvent(None, "first\nsecond\n\nfourth")]


async def test_sse_event_names_belong_to_their_event_only() -> None:
    lines = ["event: message_start", "data: {}", "", "data: [DONE]", "", "event:", "data: x", ""]
    assert await _events(lines) == [
        SseEvent("message_start", "{}"),
        SseEvent(None, "[DONE]"),
        SseEvent(None, "x"),
    ]


async def test_sse_keeps_trailing_whitespace_and_drops_only_one_leading_space() -> None:
    lines = ['data: {"type":"ping"}      ', "", "data:no-space", "", "data:  two", ""]
    assert await _events(lines) == [
        SseEvent(None, '{"type":"ping"}      '),
        SseEvent(None, "no-space"),
        SseEvent(None, " two"),
    ]


async def test_sse_final_event_without_a_blank_line_is_dispatched() -> None:
    assert await _events(["data: one", "", "event: last", "data: two"]) == [
        SseEvent(None, "one"),
        SseEvent("last", "two"),
    ]


async def test_sse_events_without_data_and_unknown_fields_are_ignored() -> None:
    lines = ["event: ping", "", "id: 7", "retry: 10", "", "data", "", "foo: bar", "data: z", ""]
    assert await _events(lines) == [SseEvent(None, ""), SseEvent(None, "z")]


# --- splitting a byte stream into SSE lines ------------------------------------------------

SSE_BODY = (
    "\ufeffevent: a\r\n"
    'data: {"t": "line\u2028sep \x0c ff \x1c fs \u00e9\u4e2d\U0001f600"}\r\n'
    "\r\n"
    ": comment\r"
    "data: cr\r"
    "\r"
    "data: lf   \n"
    "\n"
    "data: last"
)
SSE_LINES = [
    "event: a",
    'data: {"t": "line\u2028sep \x0c ff \x1c fs \u00e9\u4e2d\U0001f600"}',
    "",
    ": comment",
    "data: cr",
    "",
    "data: lf   ",
    "",
    "data: last",
]


async def _chunks(data: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    previous = 0
    for cut in [*sorted(cuts), len(data)]:
        yield data[previous:cut]
        previous = cut


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(SSE_BODY.encode())), max_size=12))
async def test_sse_lines_split_only_at_cr_and_lf_wherever_the_chunks_break(
    cuts: list[int],
) -> None:
    body = SSE_BODY.encode()
    lines = [line async for line in sse_lines(_chunks(body, cuts))]
    assert lines == SSE_LINES


async def test_sse_lines_of_an_empty_body_and_a_trailing_newline() -> None:
    assert [line async for line in sse_lines(_chunks(b"", []))] == []
    assert [line async for line in sse_lines(_chunks(b"data: x\r\n", [8]))] == ["data: x"]


@pytest.mark.parametrize(
    ("body", "cuts", "lines"),
    [
        (b"a\r", [2], ["a"]),  # a CR at the very end ends the line
        (b"a\r\nb", [2], ["a", "b"]),  # CRLF split between chunks is one line end
        (b"a\r\r\nb", [2, 3], ["a", "", "b"]),  # CR, then CRLF: two line ends
        (b"a\r\n\nb", [2, 3], ["a", "", "b"]),
        (b"\xef\xbb\xbfdata: x", [1, 2, 3], ["data: x"]),  # a BOM cut into bytes
        (b"\xef\xbb\xbf\xef\xbb\xbfx", [3], ["\ufeffx"]),  # only one BOM is dropped
        (b"a\r\xc3\xa9", [2, 3], ["a", "\u00e9"]),  # CR, then a character cut in two
    ],
)
async def test_sse_lines_at_awkward_cuts(body: bytes, cuts: list[int], lines: list[str]) -> None:
    assert [line async for line in sse_lines(_chunks(body, cuts))] == lines


async def test_a_long_line_in_small_chunks_is_split_in_linear_time() -> None:
    # 1 MB in 1 KB chunks: rescanning what was buffered for each chunk took ~10 s here
    line = "data: " + "x" * 1_000_000
    data = (line + "\n\n").encode()
    loop = asyncio.get_running_loop()
    start = loop.time()
    lines = [item async for item in sse_lines(_chunks(data, list(range(0, len(data), 1024))))]
    assert loop.time() - start < 1.0
    assert lines == [line, ""]
