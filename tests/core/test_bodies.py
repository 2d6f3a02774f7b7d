"""Reading what a request sends within its limits, whatever the server's
stream does: an upload or a body in chunks is read no further than one
byte past the limit, a stream that returns less than asked is read to its
end, and a 503's Retry-After is whole seconds, never less than asked."""

from __future__ import annotations

import io
from typing import Optional

import pytest

from streamer_core.errors import InvalidInput, PayloadTooLarge
from streamer_core.web.http import read_chunked_body, read_upload, retry_after


class Counted(io.BytesIO):
    """A body stream that counts the bytes read from it and, as a server's
    input may, returns at most ``piece`` bytes a read."""

    def __init__(self, data: bytes, piece: Optional[int] = None) -> None:
        super().__init__(data)
        self.piece = piece
        self.taken = 0

    def read(self, size: Optional[int] = -1) -> bytes:
        if self.piece is not None and (size is None or size < 0 or size > self.piece):
            size = self.piece
        data = super().read(size)
        self.taken += len(data)
        return data


def test_an_upload_over_the_limit_is_refused_having_read_one_byte_past_it():
    upload = Counted(b"x" * 1_000_000)
    with pytest.raises(PayloadTooLarge, match='the file "file" is larger than 1000 bytes'):
        read_upload(upload, "file", 1000)
    assert upload.taken == 1001, "read past the limit: a huge upload would be held in memory whole"
    assert read_upload(Counted(b"y" * 1000), "file", 1000) == b"y" * 1000
    with pytest.raises(InvalidInput, match="is empty"):
        read_upload(Counted(b""), "file", 1000)


@pytest.mark.parametrize("piece", [None, 7, 4096])
def test_a_body_in_chunks_is_read_whole_however_the_stream_hands_it_over(piece):
    """A server's stream may return fewer bytes than asked before its end
    (a chunk at a time): the body is still read whole, not cut at the first
    short read, and one over the limit is refused one byte past it."""
    body = b'{"x": "' + b"a" * 20_000 + b'"}'
    assert read_chunked_body(Counted(body, piece), 50_000) == body
    over = Counted(b"b" * 200_000, piece)
    with pytest.raises(PayloadTooLarge, match="more than the 50000 bytes"):
        read_chunked_body(over, 50_000)
    assert over.taken == 50_001


class Loading(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__("the model is loading")
        self.retry_after_s = seconds


@pytest.mark.parametrize("seconds, header", [(0.2, 1), (1.0, 1), (1.2, 2), (7.9, 8)])
def test_retry_after_is_whole_seconds_rounded_up(seconds, header):
    """``Retry-After`` takes whole seconds: a wait of 1.2 s is said as 2, not
    1 (a client coming back after 1 s would be refused again), never 0."""
    assert retry_after(Loading(seconds)) == header
