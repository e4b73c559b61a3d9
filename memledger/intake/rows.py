"""What memledger understood of a user's config files: one row per key, and the options they became.

Every key read from a file is a :class:`Row`: the option it became (``--batch 2``), or why it was ignored (no
memory effect), why it cannot be expressed (refused), that memledger does not know it (unknown), or that it was
absent and a tool's cited default was used (default). :class:`Intake` gathers the rows of every file and the
options, refuses two files that set one option differently, and renders the options as the
``memledger step`` command that judges the run.
"""
from dataclasses import dataclass, field

__all__ = ["NO_EFFECT", "OUTCOMES", "Intake", "Row"]

#: Why most keys of a config are ignored (the table folds such keys into one line per file).
NO_EFFECT = "no memory effect on a training step"

#: A row's outcome: became an option, a default used in the key's absence, ignored, refused, or not known.
OUTCOMES = ("option", "default", "ignored", "refused", "unknown")


@dataclass(frozen=True)
class Row:
    """One key of one file: ``flags`` the memledger options it set (``(("--batch", "2"),)``; a switch's value is
    None), ``why`` one line for everything else."""
    file: str
    key: str
    value: object
    outcome: str
    flags: tuple = ()
    why: str = ""

    @property
    def became(self) -> str:
        """What the row says in the table: the options, or the outcome and why."""
        if self.outcome == "option" and not self.flags:
            return f"no option needed ({self.why})"
        if self.outcome == "option":
            return " ".join(f if v is None else f"{f} {v}" for f, v in self.flags) + (f" ({self.why})" if self.why
                                                                                        else "")
        if self.outcome == "default":
            return "default: " + " ".join(f if v is None else f"{f} {v}" for f, v in self.flags) + f" ({self.why})"
        return f"{self.outcome}: {self.why}"


@dataclass
class Intake:
    """The rows of every file read, in order, and the options they set (flag -> value, None for a switch)."""
    rows: list = field(default_factory=list)
    options: dict = field(default_factory=dict)

    def add(self, row: Row) -> None:
        """Record ``row``; its options join the others, unless another file set one of them differently."""
        for flag, value in row.flags:
            if flag in self.options and self.options[flag] != value and row.outcome == "option":
                first = next(r for r in self.rows if any(f == flag for f, _ in r.flags))
                raise ValueError(f"{row.file}: {row.key} sets {flag} {value}, but {first.file}: {first.key} set "
                                 f"{flag} {self.options[flag]}; remove one of them")
            if row.outcome == "option" or flag not in self.options:
                self.options[flag] = value
        self.rows.append(row)

    def option(self, file: str, key: str, value, *flags, why: str = "") -> None:
        """``key`` became ``flags`` (pairs, or a flag alone for a switch)."""
        self.add(Row(file, key, value, "option", _pairs(flags), why))

    def default(self, file: str, key: str, why: str, *flags) -> None:
        """``key`` is absent: the tool's default (``why`` cites it) becomes ``flags``, unless a file set them."""
        pairs = _pairs(flags)
        if not all(f in self.options for f, _ in pairs) or not pairs:
            self.add(Row(file, key, None, "default", pairs, why))

    def ignore(self, file: str, key: str, value, why: str) -> None:
        self.add(Row(file, key, value, "ignored", (), why))

    def refuse(self, file: str, key: str, value, why: str) -> None:
        self.add(Row(file, key, value, "refused", (), why))

    def unknown(self, file: str, key: str, value) -> None:
        self.add(Row(file, key, value, "unknown", (), "memledger does not know this key"))

    def rest(self, file: str, flat: dict, seen: set, ignorable) -> None:
        """A row for every key of ``file`` that has none yet: read with the option of another key (``seen``), of no
        memory effect (``ignorable(key)``), or not known."""
        rowed = {r.key for r in self.rows if r.file == file}
        for key, value in flat.items():
            if key in rowed:
                continue
            if key in seen:
                self.ignore(file, key, value, "read into the options above")
            elif ignorable(key):
                self.ignore(file, key, value, NO_EFFECT)
            else:
                self.unknown(file, key, value)

    def has(self, flag: str) -> bool:
        return flag in self.options

    def problems(self) -> list:
        """The rows ``--strict`` refuses: keys memledger cannot express or does not know."""
        return [r for r in self.rows if r.outcome in ("refused", "unknown")]

    def argv(self) -> list:
        """The options as command-line arguments of ``memledger step``."""
        out = []
        for flag, value in self.options.items():
            out += [flag] if value is None else [flag, str(value)]
        return out


def _pairs(flags) -> tuple:
    """``("--batch", 2, "--fused")`` -> ``(("--batch", "2"), ("--fused", None))``."""
    out, items = [], list(flags)
    while items:
        flag = items.pop(0)
        value = None if not items or str(items[0]).startswith("--") else items.pop(0)
        out.append((flag, None if value is None else str(value)))
    return tuple(out)
