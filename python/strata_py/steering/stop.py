"""Stop strings: text-level, across token boundaries, never emitted, never leaked into a stream.

TextStream turns token ids into text the way StreamDecoder does (bytes, never a split UTF-8 character) and
watches the bytes for stop strings:
  1. push(id) appends the token's bytes to the pending buffer.
  2. If a stop string now occurs in the buffer, the text before its earliest occurrence is returned, the
     stream is `stopped`, and everything from the stop string on is dropped.
  3. Otherwise the longest suffix of the buffer that is a prefix of some stop string is held back (it may
     still become one); the rest is decoded (an incomplete UTF-8 character is held too) and returned.
Why the buffer suffices: from the byte where a stop string starts until it completes, the bytes since then
are a prefix of that stop string, so step 3 never releases them.

The decode loop (speculative.decode) uses the same class to cut a window's emitted prefix right after the
token that completes a stop string, exactly as it cuts after an end-of-generation token.
"""
from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    """Token ids -> text with stop strings held back and cut. skip_special drops control tokens' text."""

    def __init__(self, tokenizer, stops: Sequence[str] = (), skip_special: bool = True):
        self._tok = tokenizer
        self._skip = skip_special
        self.stops = [s.encode("utf-8") for s in stops if s]
        self._buf = b""
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stopped = False
        self.stop_string: str | None = None  # which stop string ended the stream

    def _held(self, buf: bytes) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best

    def push(self, token_id: int) -> str:
        """Feed one token; return the text that can no longer be part of a stop string ("" after a stop)."""
        if self.stopped:
            return ""
        if self._skip and self._tok.is_control(token_id):
            return ""
        buf = self._buf + self._tok.token_bytes(token_id)
        if self.stops:
            first, which = -1, None
            for s in self.stops:
                i = buf.find(s)
                if i >= 0 and (first < 0 or i < first):
                    first, which = i, s
            if first >= 0:
                self.stopped = True
                self.stop_string = which.decode("utf-8")
                self._buf = b""
                return self._dec.decode(buf[:first], final=True)
        h = self._held(buf)
        self._buf = buf[len(buf) - h:] if h else b""
        return self._dec.decode(buf[:len(buf) - h] if h else buf)

    def flush(self) -> str:
        """End of stream: the held bytes (a stop string that never completed is ordinary text)."""
        if self.stopped:
            return ""
        buf, self._buf = self._buf, b""
        return self._dec.decode(buf, final=True)
