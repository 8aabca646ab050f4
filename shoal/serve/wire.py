"""What travels between load generator, router and replicas: request payloads and the client
connection settings (no torch here, so the router and load generator start fast)."""

from __future__ import annotations

import socket

import httpx

VOCAB = 1000
SEQ_LEN = 32


def example_tokens(index: int) -> list[int]:
    """A deterministic request payload (what the load generator sends as request ``index``)."""
    return [1 + (index * 7919 + k * 104729) % (VOCAB - 1) for k in range(SEQ_LEN)]


def no_delay_transport(max_connections: int = 1024) -> httpx.AsyncHTTPTransport:
    """A client transport whose sockets set TCP_NODELAY: httpx writes a POST's headers and body
    separately, and with Nagle's algorithm on the body waits for the server's delayed ACK
    (~40 ms per request on loopback)."""
    return httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        limits=httpx.Limits(max_connections=max_connections,
                            max_keepalive_connections=min(256, max_connections)))
