"""The frames the relay writes itself are frames any websocket client reads."""

from __future__ import annotations

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from tiffany.feed.wsdirect import text_frame


@pytest.mark.parametrize("size", [0, 125, 126, 65_535, 65_536, 300_000])
def test_text_frames_of_every_length_encoding_parse_back(size: int) -> None:
    text = ("é" * size)[:size]
    reader = StreamReader()
    reader.feed_data(text_frame(text))
    reader.feed_eof()
    parse = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parse)
        raise AssertionError("the frame needs no more bytes")
    except StopIteration as done:
        frame = done.value
    assert frame.opcode is Opcode.TEXT
    assert frame.fin  # complete
    assert not frame.rsv1  # uncompressed
    assert frame.data.decode() == text
