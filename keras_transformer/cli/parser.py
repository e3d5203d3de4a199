"""The commands' argument parser: a flag error in one line, flags never abbreviated."""

from __future__ import annotations

import argparse
import difflib


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the commands' failure contract: a flag error is one line on stderr,
    `<prog>: error: <message> (see <prog> --help)`, and exit status 2 (argparse itself
    prints the whole usage first). Flags are never abbreviated (`--lr` is not `--lr-scale`,
    fairseq's learning rate read as a multiplier); an unknown flag names the closest one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unknown(extras))
        return namespace

    def unknown(self, extras: list[str]) -> str:
        """The message for arguments no flag takes: the first unknown flag and the closest
        known one (a flag it begins, else difflib's nearest), or argparse's own words."""
        flag = next((arg.split("=", 1)[0] for arg in extras if arg.startswith("--")), None)
        if flag is None:
            return f"unrecognized arguments: {' '.join(extras)}"
        known = [name for action in self._actions for name in action.option_strings]
        longer = [name for name in known if name.startswith(flag + "-")]
        close = longer or difflib.get_close_matches(flag, known, n=1)
        return f"unknown flag {flag}" + (f"; did you mean {close[0]}?" if close else "")

    def error(self, message: str):
        message = " ".join(message.split())  # argparse wraps long choice lists over lines
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


__all__ = ["ArgumentParser"]
