"""Stop sequences in streamed text: text is released as soon as it cannot be the start of a stop
sequence, and cut where one begins."""
from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""     # text that might still become a stop sequence
        self.hit = False   # a stop sequence was found: nothing after it is released

    def push(self, text: str) -> str:
        """Takes new text; returns what can be released now."""
        if self.hit:
            return ""
        self.held += text
        cut = min((i for i in (self.held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            out, self.held = self.held[:cut], ""
            return out
        keep = max((_overlap(self.held, s) for s in self.stops), default=0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        """The end of the text: what was held back could not become a stop sequence."""
        out, self.held = ("" if self.hit else self.held), ""
        return out


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of text that is a beginning of stop (shorter than stop)."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
