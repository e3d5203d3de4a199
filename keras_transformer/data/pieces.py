"""A text file read as contiguous pieces, each from its own starting point, in flat memory.

One streaming pass over a plain or gzip file counts its lines and keeps a bounded number of
*marks* (at most `2 * max_marks`, whatever the file's size): where a line starts, as a byte
offset for a plain file, or, for gzip, the compressed offset of a block together with a copy
of the decompressor's state before it (zlib's `Decompress.copy()`: its 32 KiB window) and the
decompressed bytes to drop from there. A piece (a run of lines between two marks) is then
read by seeking to its mark, with no reading of what comes before it, so an order that
interleaves the pieces of a whole corpus costs one read of the corpus per pass.

Lines follow `tf.data.TextLineDataset`'s rule, which the rest of training reads by: they end
at "\n", every "\r" is dropped, and a last line without "\n" counts.
"""

from __future__ import annotations

import dataclasses
import zlib

BLOCK = 1 << 16  # bytes read at a time
GZIP_WBITS = 31  # zlib: a gzip header and trailer


@dataclasses.dataclass
class Mark:
    """Where line `line` starts: for a plain file `offset` is its byte offset; for gzip,
    `offset` is the compressed offset of the block to feed `state` (a decompressor copy, or
    None: a new gzip member starts there) and `drop` the decompressed bytes before the line."""

    line: int
    offset: int
    state: object | None = None
    drop: int = 0


def _is_gzip(path: str) -> bool:
    return path.endswith(".gz")


def _blocks(path: str, mark: Mark | None = None):
    """(compressed offset of the block, decompressor before it, decompressed bytes) for every
    block of `path` from `mark` on (plain files: the bytes themselves, offset and None)."""
    with open(path, "rb") as handle:
        offset = 0 if mark is None else mark.offset
        handle.seek(offset)
        if not _is_gzip(path):
            while chunk := handle.read(BLOCK):
                yield offset, None, chunk
                offset += len(chunk)
            return
        inflate = (
            zlib.decompressobj(GZIP_WBITS)
            if mark is None or mark.state is None
            else mark.state.copy()
        )
        while chunk := handle.read(BLOCK):
            before = inflate.copy()
            data = inflate.decompress(chunk)
            while inflate.eof and inflate.unused_data:  # concatenated gzip members
                rest = inflate.unused_data
                inflate = zlib.decompressobj(GZIP_WBITS)
                data += inflate.decompress(rest)
            yield offset, before, data
            offset += len(chunk)


def _lines(path: str, mark: Mark | None = None):
    """(line number, bytes without "\\n" and "\\r", Mark of the line's start) from `mark` on."""
    number = 0 if mark is None else mark.line
    carry, carry_mark = b"", None
    drop = 0 if mark is None else mark.drop
    for offset, state, data in _blocks(path, mark):
        start = drop
        drop = 0
        while True:
            end = data.find(b"\n", start)
            if carry_mark is None:  # a line starts here
                if _is_gzip(path):
                    carry_mark = Mark(number, offset, state, start)
                else:
                    carry_mark = Mark(number, offset + start)
            if end < 0:
                carry += data[start:]
                break
            yield number, (carry + data[start:end]).replace(b"\r", b""), carry_mark
            number, carry, carry_mark, start = number + 1, b"", None, end + 1
    if carry:
        yield number, carry.replace(b"\r", b""), carry_mark


@dataclasses.dataclass
class LineIndex:
    """A file's line count and marks (see the module docstring)."""

    path: str
    count: int
    marks: list[Mark]

    def read(self, first: int, stop: int):
        """The lines `first` <= i < `stop` (bytes), from the nearest mark at or before `first`."""
        mark = max((m for m in self.marks if m.line <= first), key=lambda m: m.line, default=None)
        for number, line, _ in _lines(self.path, mark):
            if number >= stop:
                return
            if number >= first:
                yield line


def index_lines(path: str, max_marks: int = 64, visit=None) -> LineIndex:
    """One pass over `path`: its line count and at most 2 * `max_marks` marks, evenly spaced
    in lines. `visit(number, line)` sees every line (bytes), e.g. to check it."""
    marks: list[Mark] = []
    every = 1
    count = 0
    for number, line, mark in _lines(path):
        if number % every == 0:
            marks.append(mark)
            if len(marks) > 2 * max_marks:  # keep every other one: memory stays flat
                marks, every = marks[::2], every * 2
        if visit is not None:
            visit(number, line)
        count = number + 1
    return LineIndex(path, count, marks)


def piece_bounds(count: int, marks: list[Mark], pieces: int) -> list[int]:
    """Line numbers that cut `count` lines into up to `pieces` runs, each starting at a mark."""
    starts = sorted({m.line for m in marks} | {0})
    if len(starts) > pieces:
        starts = [starts[i * len(starts) // pieces] for i in range(pieces)]
    return [s for s in starts if s < count] + [count]


__all__ = ["LineIndex", "Mark", "index_lines", "piece_bounds"]
