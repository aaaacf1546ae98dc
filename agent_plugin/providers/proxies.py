"""Which proxy the environment names for a URL, by httpx's rules: :func:`environment_proxy`.

The wire clients send requests to their httpx transport directly, without an
:class:`httpx.AsyncClient`, so they choose the proxy themselves, the way an ``AsyncClient``
(``trust_env=True``, no transport given) chooses it: ``HTTP_PROXY`` / ``HTTPS_PROXY`` /
``ALL_PROXY`` (lower-case names first, as :func:`urllib.request.getproxies` reads them; a
proxy without a scheme is ``http://``), and ``NO_PROXY``: ``*`` turns proxies off, an IP
address or ``localhost`` matches that host, ``example.com`` matches it and its subdomains,
``host:port`` only that port, ``https://host`` only that scheme. Of the rules that match, the
most specific wins (a port first, then the longer host, then the longer scheme).
httpx keeps these rules private; ``tests/providers/test_proxies.py`` checks this module
against them.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request
from dataclasses import dataclass

import httpx

__all__ = ["environment_proxy"]


def environment_proxy(base_url: str | httpx.URL) -> str | None:
    """The proxy URL for requests to ``base_url``, or ``None`` to connect directly."""
    url = httpx.URL(base_url)
    found = urllib.request.getproxies()
    rules: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        proxy = found.get(scheme)
        if proxy:
            rules[f"{scheme}://"] = proxy if "://" in proxy else f"http://{proxy}"
    for entry in (entry.strip() for entry in found.get("no", "").split(",")):
        if entry == "*":
            return None
        if entry:
            rules[_no_proxy_pattern(entry)] = None
    matching = [
        (rule, proxy)
        for pattern, proxy in rules.items()
        if (rule := _Rule.parse(pattern)) is not None and rule.matches(url)
    ]
    matching.sort(key=lambda item: item[0].priority)
    return matching[0][1] if matching else None


def _no_proxy_pattern(entry: str) -> str:
    if "://" in entry:
        return entry
    if _is_ip(entry, ipaddress.IPv4Address):
        return f"all://{entry}"
    if _is_ip(entry, ipaddress.IPv6Address):
        return f"all://[{entry}]"
    if entry.lower() == "localhost":
        return f"all://{entry}"
    return f"all://*{entry}"


def _is_ip(entry: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        kind(entry.split("/")[0])
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _Rule:
    scheme: str  # "" for any
    host: str  # "" for any
    host_pattern: re.Pattern[str] | None
    port: int | None

    @classmethod
    def parse(cls, pattern: str) -> _Rule | None:
        """The rule of a ``scheme://host:port`` pattern; ``None`` for one httpx cannot parse
        either (httpx.AsyncClient fails on it; a proxy choice should not)."""
        try:
            url = httpx.URL(pattern)
        except httpx.InvalidURL:
            return None
        host = "" if url.host == "*" else url.host
        if not host:
            regex = None
        elif host.startswith("*."):  # subdomains only
            regex = re.compile(rf"^.+\.{re.escape(host[2:])}$")
        elif host.startswith("*"):  # the domain and its subdomains
            regex = re.compile(rf"^(.+\.)?{re.escape(host[1:])}$")
        else:
            regex = re.compile(rf"^{re.escape(host)}$")
        return cls("" if url.scheme == "all" else url.scheme, host, regex, url.port)

    def matches(self, url: httpx.URL) -> bool:
        return (
            (not self.scheme or self.scheme == url.scheme)
            and (self.host_pattern is None or self.host_pattern.match(url.host) is not None)
            and (self.port is None or self.port == url.port)
        )

    @property
    def priority(self) -> tuple[int, int, int]:
        return (0 if self.port is not None else 1, -len(self.host), -len(self.scheme))
