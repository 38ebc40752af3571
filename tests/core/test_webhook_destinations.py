"""The literal forms of an IPv4 address a resolver accepts, read without the C library (core
catches no OSError by name): each as ``socket.inet_aton`` reads it, or refused, never looser."""
from __future__ import annotations

import ipaddress
import socket

import pytest

from mediasrv.core.webhooks.destinations import literal_address

FORMS = ["2130706433", "0x7f.1", "127.1", "127.0.0.1", "0177.0.0.1", "0x7f000001", "10.0x10.1", "0",
         "0xffffffff", "169.254.169.254", "0251.0376.0251.0376", "1.2.3.4.5", "256.1", "1.16777216",
         "08.1.1.1", "1..2", "4294967296", "0x1.0x2.0x3.0x4"]


@pytest.mark.parametrize("text", FORMS)
def test_a_numeric_host_reads_as_inet_aton_reads_it(text: str) -> None:
    try:
        expected: ipaddress.IPv4Address | None = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        expected = None
    assert literal_address(text) == expected


def test_names_are_not_literals() -> None:
    assert literal_address("example.com") is None
    assert literal_address("cafe.be") is None
