"""Raw HTTP/2 frames for the hostile gRPC probes: what no well-behaved client sends. All traffic
on 127.0.0.1; every read is bounded by a socket timeout."""

from __future__ import annotations

import socket
import struct

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


def frame(typ: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((typ, flags)) + struct.pack(">I", sid) + payload


def settings(**values: int) -> bytes:
    """A SETTINGS frame (RFC 9113 6.5.2 identifiers by name)."""
    ids = {"header_table_size": 1, "enable_push": 2, "max_concurrent_streams": 3, "initial_window_size": 4, "max_frame_size": 5, "max_header_list_size": 6}
    return frame(4, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


def grpc_message(msg: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + struct.pack(">I", len(msg)) + msg


def request_headers(path: str, extra: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "t"), ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def header_block(headers, encoder: hpack.Encoder | None = None) -> bytes:
    return (encoder or hpack.Encoder()).encode(headers)


def raw_connection(port: int, **peer_settings: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(PREFACE + settings(**peer_settings))
    return s


def read_frames(sock: socket.socket, timeout: float = 10.0, stop=None) -> tuple[list[tuple[int, int, int, bytes]], bool]:
    """Raw frames the server sends until it closes (or ``stop(frames)`` holds, or ``timeout``),
    and whether it closed the connection."""
    sock.settimeout(timeout)
    buf, frames, closed = b"", [], False
    while stop is None or not stop(frames):
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            closed = True
            break
        if not data:
            closed = True
            break
        buf += data
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9 : 9 + n]))
            buf = buf[9 + n :]
    return frames, closed


def goaway_code(frames) -> int | None:
    for typ, _, _, payload in frames:
        if typ == 7:
            return int.from_bytes(payload[4:8], "big")
    return None
