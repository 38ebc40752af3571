"""A tiny authoritative DNS server on a loopback UDP port, for the custom-domain TXT proof and
the webhook destinations' names.

It answers TXT questions from ``txt`` (name -> strings) and A/AAAA questions from
``addresses`` (name -> IPv4 and IPv6 addresses) with dnspython's message API, and NXDOMAIN for
anything else; it runs on a daemon thread so it serves whichever event loop the
test uses. Point the server at it with MEDIASRV_DNS_NAMESERVERS=127.0.0.1:<port>.
"""
from __future__ import annotations

import socket
import threading

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class LocalDns:
    def __init__(self) -> None:
        self.txt: dict[str, list[str]] = {}
        self.addresses: dict[str, list[str]] = {}
        self.queries: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="local-dns", daemon=True)

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LocalDns:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                query = dns.message.from_wire(wire)
            except dns.exception.DNSException:
                continue
            self._sock.sendto(self._answer(query).to_wire(), peer)

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        self.queries.append(name)
        if name in self.addresses:
            wanted = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}.get(question.rdtype)
            found = [a for a in self.addresses[name] if wanted and (":" in a) == (wanted == 6)]
            if found:
                response.answer.append(dns.rrset.from_text(question.name, 60, dns.rdataclass.IN,
                                                           question.rdtype, *found))
            return response
        strings = self.txt.get(name)
        if strings is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.TXT:
            quoted = [f'"{s}"' for s in strings]
            response.answer.append(dns.rrset.from_text(question.name, 60, dns.rdataclass.IN,
                                                       dns.rdatatype.TXT, *quoted))
        return response
