"""Signed webhooks: :class:`WebhookDelivery` POSTs reports as JSON signed with HMAC-SHA256,
and :func:`verify_webhook` checks a signature on the receiving side.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import os
import time
from typing import TYPE_CHECKING, Final

from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.proactive.reports import Report
from agent_plugin.redaction import redact_text, register_secret, scrub

if TYPE_CHECKING:
    import httpx

SIGNATURE_HEADER: Final = "X-Agent-Signature"
"""``sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` (see :func:`webhook_signature`)."""
TIMESTAMP_HEADER: Final = "X-Agent-Timestamp"
"""Unix seconds at sending; part of the signed payload, so a receiver can refuse replays."""
KEY_HEADER: Final = "X-Agent-Report-Key"
"""The report's :attr:`Report.key`, for deduplication without parsing the body."""

DEFAULT_SECRET_ENV: Final = "AGENT_WEBHOOK_SECRET"


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The :data:`SIGNATURE_HEADER` value: ``"sha256=" + hex(HMAC-SHA256(secret,
    timestamp + "." + body))``, over the exact body bytes."""
    payload = timestamp.encode("ascii") + b"." + body
    digest = hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_webhook(
    secret: str,
    body: bytes,
    *,
    timestamp: str,
    signature: str,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether a webhook request is authentic and fresh: what a receiver checks.

    ``body`` must be the raw request body (before any JSON parsing), ``timestamp`` and
    ``signature`` the :data:`TIMESTAMP_HEADER` and :data:`SIGNATURE_HEADER` values. A
    timestamp more than ``tolerance`` seconds away from ``now`` (default: the clock) fails,
    which stops a captured request from being replayed later; the comparison of signatures
    takes constant time.
    """
    try:
        sent = int(timestamp)
        stale = abs((time.time() if now is None else now) - sent) > tolerance
    except (ValueError, OverflowError):  # not a number, or one too large for the clock
        return False
    if stale or not signature.isascii():  # compare_digest raises on a non-ASCII str
        return False
    try:
        expected = webhook_signature(secret, timestamp, body)
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(expected, signature)


class WebhookDelivery:
    """POSTs each report as JSON to ``url``, signed with a shared secret.

    Headers: ``Content-Type: application/json``, :data:`SIGNATURE_HEADER`,
    :data:`TIMESTAMP_HEADER` and :data:`KEY_HEADER`. The secret is ``secret`` or else the
    environment variable ``secret_env`` (``AGENT_WEBHOOK_SECRET``), read when the delivery is
    built; without one the delivery refuses to be built, so reports are never sent unsigned.

    A receiver verifies a request like this (or with :func:`verify_webhook`)::

        body = await request.body()                        # the raw bytes, not re-encoded JSON
        timestamp = request.headers["X-Agent-Timestamp"]
        expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body,
                                        hashlib.sha256).hexdigest()
        ok = hmac.compare_digest(expected, request.headers["X-Agent-Signature"]) \\
             and abs(time.time() - int(timestamp)) <= 300
        # then drop the report if X-Agent-Report-Key was seen before

    A 2xx answer is success; any other status, a connection failure or no answer within
    ``timeout`` seconds (for the whole request) raises :class:`AgentError`. Error messages name
    only the scheme, host and port of ``url``: webhook URLs often carry a token in their path.
    One pooled HTTP client serves every delivery; :meth:`aclose` closes it (a later delivery
    opens a new one). ``transport`` replaces httpx's network transport (tests, proxies).
    """

    __slots__ = ("_client", "_secret", "_transport", "_url", "target", "timeout")

    def __init__(
        self,
        url: str,
        *,
        secret: str | None = None,
        secret_env: str = DEFAULT_SECRET_ENV,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import httpx  # loaded with the first webhook, not with the package

        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise AgentError.config(f"WebhookDelivery: invalid url: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise AgentError.config(
                "WebhookDelivery: the url must be an absolute http:// or https:// URL"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise AgentError.config(f"WebhookDelivery: timeout must be a number, got {timeout!r}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise AgentError.config(f"WebhookDelivery: timeout must be positive, got {timeout}")
        if secret is None:
            secret = os.environ.get(secret_env)
        if not secret or not secret.strip():
            raise AgentError.config(
                f"WebhookDelivery needs a signing secret: set the {secret_env} environment "
                "variable or pass secret=..."
            )
        register_secret(secret)  # a signing secret never appears in logs, events or records
        self._url = parsed
        self._secret = secret
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self.timeout = float(timeout)
        port = f":{parsed.port}" if parsed.port is not None else ""
        self.target = f"{parsed.scheme}://{parsed.host}{port}"
        """Scheme, host and port of the url: what logs and errors show of it."""

    def _http(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport,
                timeout=httpx.Timeout(self.timeout),
                follow_redirects=False,
                headers={"user-agent": "fastapi-agent-plugin webhook"},
            )
        return self._client

    async def deliver(self, report: Report) -> None:
        """POST ``report``; raise :class:`AgentError` unless the receiver answers 2xx."""
        import httpx

        body = report.model_dump_json().encode("utf-8")
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            SIGNATURE_HEADER: webhook_signature(self._secret, timestamp, body),
            TIMESTAMP_HEADER: timestamp,
            KEY_HEADER: report.key,
        }
        client = self._http()
        try:
            async with asyncio.timeout(self.timeout):
                response = await client.post(self._url, content=body, headers=headers)
        except (TimeoutError, httpx.TimeoutException):
            raise AgentError(
                ErrorKind.TRANSPORT,
                f"the webhook at {self.target} did not answer within {self.timeout:g} s",
            ) from None
        except httpx.HTTPError as exc:
            detail = scrub(scrub(str(exc), str(self._url)), self._secret)
            raise AgentError(
                ErrorKind.TRANSPORT,
                f"cannot reach the webhook at {self.target}: {type(exc).__name__}: "
                f"{redact_text(detail)}",
            ) from None
        if not response.is_success:
            raise AgentError(
                ErrorKind.from_http_status(response.status_code),
                f"the webhook at {self.target} answered {response.status_code}",
                status=response.status_code,
            )

    async def aclose(self) -> None:
        """Close the pooled HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> WebhookDelivery:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"WebhookDelivery(target={self.target!r}, timeout={self.timeout:g})"
