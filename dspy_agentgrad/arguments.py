"""Command-line arguments checked before any work: types that refuse a bad value with a message naming it, and
a parser whose argument errors are one line and exit status 2 (shared by ``agentgrad`` and the demo job)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an argument error is one line (``prog: error: ...``, naming the option) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {value}")
    return value


def new_or_folder(text: str) -> Path:
    """An argparse type: a folder to write into, existing or not (never a file, nor under one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: pass a folder")
    path = Path(text)
    for place in (path, *path.parents):
        if place.exists():
            if not place.is_dir():
                raise argparse.ArgumentTypeError(f"{place} is a file, not a folder")
            break
    return path


def folder(text: str) -> Path:
    """An argparse type: an existing folder."""
    path = new_or_folder(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{path} does not exist")
    return path
