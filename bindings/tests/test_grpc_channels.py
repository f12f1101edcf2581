"""The client channels of ifec.live against a daemon slow to accept a connection (its host had not scheduled it: a
loaded CI machine, many containers): the call waits for it. gRPC bounds one connection attempt (TCP, TLS, the HTTP/2
SETTINGS frame) by the channel's minimum reconnect back-off; at 100 ms such calls failed at once as unreachable
("connection attempt timed out before receiving SETTINGS frame"). A plain gRPC server in this process, behind a
relay on loopback that holds each connection 400 ms."""

import concurrent.futures
import select
import socket
import threading

from ifec import live


class _SlowRelay:
    """Accepts on an ephemeral loopback port; `delay` after each connection, relays it to `target` both ways."""

    def __init__(self, target, delay):
        self.target, self.delay, self.connections = target, delay, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept)]
        self.threads[0].start()

    def _accept(self):
        self.sock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                client, _ = self.sock.accept()
            except socket.timeout:
                continue
            self.connections += 1
            t = threading.Thread(target=self._relay, args=(client,))
            self.threads.append(t)
            t.start()

    def _relay(self, client):
        self.stop.wait(self.delay)
        with client, socket.create_connection(("127.0.0.1", self.target)) as server:
            while not self.stop.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.05)
                for s in ready:
                    data = s.recv(16384)
                    if not data:
                        return
                    (server if s is client else client).sendall(data)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.sock.close()


def test_a_daemon_slow_to_accept_a_connection_is_waited_for():
    grpc, pb, rpc = live._grpc()

    class Host(rpc.HostServicer):
        def Status(self, request, context):
            return pb.NodeStatus(node="gpu0")

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    rpc.add_HostServicer_to_server(Host(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    relay = _SlowRelay(port, 0.4)
    try:
        stub = live._RoleStub(f"127.0.0.1:{relay.port}", "Host", None)
        assert stub.Status(pb.Empty(), timeout=5).node == "gpu0"
        assert relay.connections == 1, "one attempt that lasted its 400 ms, not tries cut short"
    finally:
        relay.close()
        server.stop(0)
