"""Outbound HTTP to a tenant's URL without letting it reach inside our network (SSRF).

A webhook URL is the tenant's choice, so it is checked twice: when registered, and at every
connection. At connection time the host is resolved once, every address must be global, and
the socket connects to one of exactly those addresses (TLS still verifies the certificate for
the host name, SNI included): a DNS answer that changes between the check and the connect
(rebinding) cannot steer the request elsewhere. Redirects are never followed (http.client
follows none); at most MAX_ANSWER bytes of the answer are read, within one total deadline.
`allow_private` (WEBHOOK_ALLOW_PRIVATE_ADDRESSES, development and tests) lifts the address
rule and allows http://.
"""
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from app.errors import BadRequest

MAX_ANSWER = 4096
HTTPS_ONLY = "url must be an https:// URL"
NOT_PUBLIC = "url must point to a public address"
UNRESOLVABLE = "url's host could not be resolved"
MALFORMED = "url must be an absolute URL with a host"
SURROUNDED = "url must not begin or end with spaces"
# Port 0 names no port a receiver can listen on (and would otherwise be taken for the default).
PORT = "url's port must be between 1 and 65535"
# A password in a URL is stored, listed and logged as the URL is: a receiver authenticates the
# service by the signature instead.
CREDENTIALS = "url must not contain credentials (user:password@): the signature authenticates"
NOT_ENCODED = ("url's path and query must be percent-encoded (no spaces or non-ASCII "
               "characters)")
# What an HTTP request line cannot carry: http.client refuses controls and spaces, and can
# encode nothing but ASCII. Such a URL could never be sent, however often it is retried.
UNSENDABLE = re.compile(r"[^\x21-\x7e]")


class Refused(Exception):
    """The URL may not be called; the text is safe to show the tenant."""


def check_url(url, allow_private):
    """Raise 400 unless `url` may be registered (a registration-time check)."""
    try:
        if url != url.strip():
            # urlsplit drops spaces before the scheme (as WHATWG URLs do): the URL would be
            # called as if they were not there, but stored and listed with them.
            raise Refused(SURROUNDED)
        target(url, allow_private)
    except Refused as refused:
        raise BadRequest(str(refused), details={"url": [str(refused)]}) from None


def target(url, allow_private, deadline=None):
    """(scheme, host, port, path, addresses) of a URL that may be called now; TimeoutError
    when the name does not resolve before `deadline` (time.monotonic(); None: no limit)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise Refused(MALFORMED) from None
    try:
        port = parts.port
    except ValueError:  # digits past 65535 are a port out of range; anything else, no URL
        raise Refused(PORT if _port_digits(parts.netloc) else MALFORMED) from None
    if port == 0:
        raise Refused(PORT)
    schemes = ("https", "http") if allow_private else ("https",)
    if parts.scheme not in schemes:
        raise Refused(HTTPS_ONLY)
    if not parts.hostname:
        raise Refused(MALFORMED)
    if parts.username is not None or parts.password is not None:
        raise Refused(CREDENTIALS)
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if UNSENDABLE.search(path):
        raise Refused(NOT_ENCODED)
    return parts.scheme, parts.hostname, port, path, _addresses(parts.hostname, port,
                                                                allow_private, deadline)


def _port_digits(netloc):
    """Whether the port `netloc` names (after any user info and IPv6 brackets) is digits."""
    port = netloc.rpartition("@")[2].rpartition("]")[2].rpartition(":")[2]
    return port.isascii() and port.isdigit()


def _addresses(host, port, allow_private, deadline):
    try:
        found = _resolved(host, port, deadline)
    except (socket.gaierror, UnicodeError):
        raise Refused(UNRESOLVABLE) from None
    addresses = []
    for family, _, _, _, sockaddr in found:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if not allow_private and not is_public(address):
            raise Refused(NOT_PUBLIC)  # every address, or a round-robin could pick a bad one
        addresses.append((family, sockaddr))
    if not addresses:
        raise Refused(UNRESOLVABLE)
    return addresses


def _resolved(host, port, deadline):
    """getaddrinfo's answer. The resolver has no timeout of its own to give: before a deadline
    it runs in a thread of its own, waited for no longer than the deadline (a resolver that
    hangs then finishes on its own, its answer unused)."""
    if deadline is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    outcome = {}

    def resolve():
        try:
            outcome["found"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except Exception as exc:  # pylint: disable=broad-except  # raised in the caller
            outcome["failure"] = exc

    resolver = threading.Thread(target=resolve, daemon=True)
    resolver.start()
    resolver.join(max(deadline - time.monotonic(), 0))
    if resolver.is_alive():
        raise TimeoutError("the host did not resolve within the deadline")
    if "failure" in outcome:
        raise outcome["failure"]
    return outcome["found"]


# IPv6 prefixes whose last 32 bits are an IPv4 address that a connection reaches (through a
# translator or the host's own stack): such an address is as public as that IPv4 address.
IPV4_IN_LAST_32_BITS = tuple(ipaddress.ip_network(prefix) for prefix in (
    "::ffff:0:0/96",     # IPv4-mapped
    "::/96",             # IPv4-compatible (deprecated, RFC 4291); holds :: and ::1 too
    "::ffff:0:0:0/96",   # IPv4-translated (SIIT, RFC 2765)
    "64:ff9b::/96",      # NAT64's well-known prefix (RFC 6052)
))
# Not global, though Python 3.11's ipaddress says they are.
NOT_GLOBAL = tuple(ipaddress.ip_network(prefix) for prefix in (
    "64:ff9b:1::/48",  # NAT64 for a network's own use (RFC 8215), translated inside it
    "192.0.0.0/24",    # IETF protocol assignments (RFC 6890), 192.0.0.8 among them
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated by RFC 7526): whichever relay is nearest
    "fec0::/10",       # site-local (deprecated by RFC 3879, still routed inside some sites)
    "3fff::/20",       # documentation (RFC 9637)
    "5f00::/16",       # SRv6 segment identifiers (RFC 9602), routed inside an SR domain
))


def is_public(address):
    """Whether `address` is on the public internet; one standing for an IPv4 address is
    judged by that address."""
    address = _as_ipv4(address)
    return (address.is_global and not address.is_multicast
            and not any(address in network for network in NOT_GLOBAL))


def _as_ipv4(address):
    if address.version == 6:
        if address.sixtofour is not None:
            return address.sixtofour
        if any(address in prefix for prefix in IPV4_IN_LAST_32_BITS):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


class _Pinned:
    """Connect to an address already checked, never to what the name resolves to later:
    each in turn, each for at most the connect timeout, all of them within the deadline."""

    def __init__(self, addresses, connect_timeout, deadline):
        self.addresses, self.connect_timeout = addresses, connect_timeout
        self.deadline = deadline

    def open_socket(self):
        failure = OSError("no address to connect to")
        for family, sockaddr in self.addresses:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no connection within the deadline")
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(min(self.connect_timeout, remaining))
            try:
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                failure = exc
        raise failure


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, host, port, pinned, timeout):
        super().__init__(host, port, timeout=timeout)
        self.pinned = pinned

    def connect(self):
        self.sock = self.pinned.open_socket()
        self.sock.settimeout(self.timeout)


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, pinned, timeout, context):
        super().__init__(host, port, timeout=timeout, context=context)
        self.pinned = pinned

    def connect(self):
        sock = self.pinned.open_socket()
        sock.settimeout(self.timeout)
        # The certificate is checked for the host name, as if we had connected by name. The
        # handshake is made once the connection holds the socket, so that the deadline's timer
        # can cut a handshake that drips in too.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host,
                                              do_handshake_on_connect=False)
        if time.monotonic() >= self.pinned.deadline:  # the timer fired before it could cut
            raise TimeoutError("no answer within the deadline")
        self.sock.do_handshake()


def post(url, body, headers, allow_private, connect_timeout, total_timeout, ca_file=None):
    """POST `body`; return (status, first MAX_ANSWER bytes of the answer). Raises Refused for
    a URL that may not be called, OSError/HTTPException for a failed exchange, TimeoutError
    when the total deadline passed."""
    # One deadline from the start: resolving the name and connecting count against it too.
    deadline = time.monotonic() + total_timeout
    scheme, host, port, path, addresses = target(url, allow_private, deadline)
    pinned = _Pinned(addresses, connect_timeout, deadline)
    if scheme == "https":
        context = ssl.create_default_context(cafile=ca_file)
        connection = _HTTPSConnection(host, port, pinned, total_timeout, context)
    else:
        connection = _HTTPConnection(host, port, pinned, total_timeout)
    expired = threading.Event()

    def cut():  # the total deadline, however slowly the answer drips in
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(max(deadline - time.monotonic(), 0), cut)
    timer.daemon = True
    timer.start()
    try:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        if expired.is_set() or time.monotonic() > deadline:
            raise TimeoutError("no answer within the deadline")
        # The status came within the deadline, and it is the answer: a body that then stalls
        # or breaks off (cut at the deadline) leaves what was read of it.
        content = bytearray()
        try:
            while len(content) < MAX_ANSWER:
                chunk = answer.read1(MAX_ANSWER - len(content))
                if not chunk:
                    break
                content += chunk
        except (OSError, http.client.HTTPException):
            pass
        return answer.status, bytes(content)
    except OSError:
        if expired.is_set():
            raise TimeoutError("no answer within the deadline") from None
        raise
    finally:
        timer.cancel()
        connection.close()
