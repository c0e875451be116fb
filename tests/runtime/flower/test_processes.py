"""`fedcare.runtime.flower.processes`: whether a SuperNode's port is free. A site restarted on its
port right after a clean stop is not refused for the minute a TIME-WAIT connection holds the
port (fedcare 0.2 said `--port 9095: already in use`); a port something listens on is refused."""

import socket

from fedcare.runtime.flower.processes import free_port, port_is_free


def _time_wait(port: int) -> None:
    """Leave a connection to 127.0.0.1:`port` in TIME-WAIT on the server's side (the side that
    closes first waits), as a SuperNode's Runtime API does after serving its launcher and ending."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server closes first: its end (local port `port`) waits out TIME-WAIT
        client.recv(1)
        client.close()


def _states(port: int) -> set[str]:
    """The TCP states (/proc/net/tcp's hex codes) of 127.0.0.1:`port`'s local sockets."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {row[3] for row in rows if row[1] == f"0100007F:{port:04X}"}


def test_a_port_held_only_by_time_wait_is_free_as_the_supernode_binds_it():
    port = free_port()
    _time_wait(port)
    assert "06" in _states(port)  # TIME_WAIT
    with socket.socket() as plain:  # what fedcare 0.2 tried: it fails for a minute
        try:
            plain.bind(("127.0.0.1", port))
            refused_without_reuse = False
        except OSError:
            refused_without_reuse = True
    assert refused_without_reuse
    assert port_is_free(port)
    with socket.socket() as supernode:  # and the SuperNode does bind it
        supernode.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        supernode.bind(("127.0.0.1", port))
        supernode.listen()
        assert not port_is_free(port)  # a listening SuperNode still makes it taken
