"""``shared.parts.process.free_port``: ports for programs started next, out of the way of outgoing
connections."""

from __future__ import annotations

import socket

from shared.parts import process


def test_ports_are_below_the_ephemeral_range_free_and_never_handed_out_twice() -> None:
    low = process._ephemeral_low()
    ports = [process.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports)
    with socket.socket() as sock:  # free when handed out: something may listen on it at once
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_taken_port_is_passed_over(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(process, "_ephemeral_low", lambda: port + 1)  # the span ends at the taken port
        monkeypatch.setattr(process, "_HANDED", set(range(port - 11999, port)))  # every other one handed out
        assert process.free_port() != port
