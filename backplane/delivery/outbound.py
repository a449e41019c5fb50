"""Outbound HTTP to URLs an administrator set: webhook subscriptions and registered tools.

A URL typed into the admin can name anything the backplane's hosts can reach: the cloud's
metadata service (169.254.169.254), the database, Redis, an internal admin page. So these
calls go only to public addresses, and to the networks ``BACKPLANE_OUTBOUND_ALLOWED_NETWORKS``
names (settings; by default none in production, loopback in development and tests).

``outbound_client`` is the only way to make such a call. For a direct connection its transport
checks the address it connects to, not the URL's host string:

1. The host is resolved once (``getaddrinfo``).
2. Every address it resolves to is checked, and one refused address refuses the call: a name
   that answers with a public and a private address would otherwise reach the private one
   whenever the public one fails to connect.
3. The socket is opened to a checked address, never to the name again: a second lookup may
   answer differently (DNS rebinding). The Host header, the TLS SNI and the certificate check
   keep the name, because httpcore takes them from the URL, not from the socket.

Redirects are never followed (httpx's default, kept by the client), so a public endpoint cannot
bounce a call to a private address. When the environment names a proxy (``HTTPS_PROXY``,
``HTTP_PROXY``, ``ALL_PROXY``, minus ``NO_PROXY``, as httpx reads them), the proxy makes the
connection: the target's addresses are checked the same way before the request is handed to it,
but the proxy resolves the name again, so it should enforce the same rule itself.

A refusal is an ``OutboundRefused``, an ``httpx.ConnectError``: the callers treat it as the
connection failure it is (a webhook attempt that failed, a tool that did not answer).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpcore
import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from httpx._utils import get_environment_proxies

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "BACKPLANE_OUTBOUND_ALLOWED_NETWORKS"
# RFC 6598's shared address space (carrier-grade NAT): not global, and not is_private either.
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
# What people call private (RFC 1918, RFC 4193); Python's is_private also covers documentation,
# benchmarking and reserved space, which the message calls reserved instead.
_PRIVATE = tuple(ipaddress.ip_network(cidr) for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
# httpx's own defaults, which its HTTPTransport would use.
_MAX_CONNECTIONS = 100
_MAX_KEEPALIVE_CONNECTIONS = 20


class OutboundRefused(httpx.ConnectError):
    """A call to an address that is neither public nor in ``BACKPLANE_OUTBOUND_ALLOWED_NETWORKS``."""


def address_refusal(address: IPAddress, *, allowed: Iterable[IPNetwork] | None = None) -> str | None:
    """Why a connection to ``address`` is refused ("a private address"), or None when it may go.

    ``allowed`` defaults to the setting. ``is_global`` is the test because it is the IANA
    special-purpose registries' "globally reachable" column: it already excludes private
    (RFC 1918, fc00::/7), loopback, link-local, unspecified, reserved, documentation, benchmark
    and shared (100.64/10) space, which a list of our own would have to keep up with. Multicast is
    excluded on top: ``is_global`` lets IPv4 multicast through. An IPv4-mapped IPv6 address
    (::ffff:10.0.0.5) reaches its IPv4 address, so it is judged as that address.
    """
    judged: IPAddress = address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        judged = address.ipv4_mapped
    networks = settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS if allowed is None else allowed
    if any(judged.version == network.version and judged in network for network in networks):
        return None
    if judged.is_global and not judged.is_multicast:
        return None
    return f"{_kind(judged)} address"


def _kind(address: IPAddress) -> str:
    if address.is_unspecified:
        return "an unspecified"
    if address.is_loopback:
        return "a loopback"
    if address.is_link_local:
        return "a link-local"
    if address.is_multicast:
        return "a multicast"
    if address in _SHARED:
        return "a shared (carrier-grade NAT)"
    if any(address.version == network.version and address in network for network in _PRIVATE):
        return "a private"
    return "a reserved"


def refusal_message(subject: str, reason: str) -> str:
    """``refused: 10.0.0.5 is a private address; allow it with BACKPLANE_OUTBOUND_ALLOWED_NETWORKS``."""
    return f"refused: {subject} is {reason}; allow it with {SETTING}"


def checked_addresses(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, once, each of them checked (see the module's docstring).

    Raises OutboundRefused naming the first refused address, httpcore.ConnectError when the name
    does not resolve (httpx makes it an httpx.ConnectError, as a failed lookup always was).
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise httpcore.ConnectError(f"{host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in found))
    for text in addresses:
        reason = address_refusal(ipaddress.ip_address(text))
        if reason is not None:
            raise OutboundRefused(refusal_message(text if text == host else f"{host} ({text})", reason))
    return addresses


class _CheckingBackend(httpcore.NetworkBackend):
    """httpcore's synchronous backend, connecting only to checked addresses."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        # In the order the resolver gave, as socket.create_connection would try them.
        for address in checked_addresses(host, port):
            try:
                return self._backend.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                 socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None, "getaddrinfo answers with at least one address or raises"
        raise failure

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        raise OutboundRefused(f"refused: the unix socket {path}; outbound calls go over TCP only")

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class OutboundTransport(httpx.HTTPTransport):
    """httpx's transport for direct connections, its connection pool built on the checking backend.

    HTTPTransport takes no network backend (httpx 0.28), so the pool is built here the way its
    ``__init__`` builds one without a proxy (same TLS context from the environment, same limits);
    everything else, request handling and tracing's instrumentation of it included, is httpx's.
    HTTPTransport's ``__init__`` is not called: it would build a pool and a TLS context (the costly
    part) only to have them replaced.
    """

    def __init__(self) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=True),
            max_connections=_MAX_CONNECTIONS,
            max_keepalive_connections=_MAX_KEEPALIVE_CONNECTIONS,
            keepalive_expiry=5.0,
            network_backend=_CheckingBackend(),
        )


class ProxiedOutboundTransport(httpx.HTTPTransport):
    """httpx's transport through a proxy from the environment, checking the target first."""

    def __init__(self, proxy: str) -> None:
        super().__init__(proxy=proxy, limits=httpx.Limits(max_connections=_MAX_CONNECTIONS,
                                                            max_keepalive_connections=_MAX_KEEPALIVE_CONNECTIONS))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        try:
            checked_addresses(request.url.host, port)
        except httpcore.ConnectError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        return super().handle_request(request)


def outbound_client() -> httpx.Client:
    """A client for calls to URLs an administrator set; every connection it opens is checked.

    Environment proxies are kept as httpx would use them: giving httpx a transport turns its own
    reading of them off, so they are mounted here, each through a checking transport.
    """
    mounts: dict[str, httpx.BaseTransport | None] = {
        pattern: None if proxy is None else ProxiedOutboundTransport(proxy)
        for pattern, proxy in get_environment_proxies().items()
    }
    return httpx.Client(transport=OutboundTransport(), mounts=mounts, follow_redirects=False)


def outbound_url_validate(url: str) -> None:
    """A form validator: a URL whose host is a literal address the guard refuses is refused at
    save time. A name is not resolved here, since what it resolves to can change; the connection
    checks it every time."""
    host = urlsplit(url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return
    reason = address_refusal(address)
    if reason is not None:
        raise ValidationError(refusal_message(host, reason), code="outbound_refused")
