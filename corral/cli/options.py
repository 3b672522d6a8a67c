"""Command-line options the way Slurm's commands read them (GNU ``getopt_long``).

- long options as ``--name=value`` or ``--name value``; an unambiguous prefix stands for the whole name;
- short options as ``-Nvalue`` or ``-N value``; flags may be bundled (``-hv``);
- ``--`` ends the options;
- positionals may come between options (``scancel 12 --signal=KILL``), unless the command stops at its
  first positional (``sbatch script.sh --script-arg``).

Every command lists the options it implements and also the options Slurm has that it does not implement
yet, so that a real Slurm option gets ``option --foo is not supported by Corral yet`` rather than being
silently ignored or called unknown. Errors are ``CliError`` with getopt's wording.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from corral.cli.errors import CliError


class Option(msgspec.Struct, frozen=True):
    """One option of a command."""

    name: str  # long name without dashes, e.g. "job-name"; also the key of its parsed values
    short: str = ""  # one-letter form, "" if none
    value: bool = True  # whether it takes an argument
    supported: bool = True  # False: a Slurm option Corral does not implement yet
    aliases: tuple[str, ...] = ()  # other long names, e.g. "jobname" for "name"
    optional: bool = False  # the argument is optional (``--nice`` or ``--nice=N``; never ``--nice N``)


def flag(name: str, short: str = "", *aliases: str) -> Option:
    """An implemented option without an argument."""
    return Option(name, short, value=False, aliases=aliases)


def unsupported(names: str) -> list[Option]:
    """Slurm options Corral does not implement yet: ``"long long/s ..."`` (``/s``: its short form)."""
    options = []
    for spec in names.split():
        name, _, short = spec.partition("/")
        options.append(Option(name, short, value=True, supported=False))
    return options


class ParsedArgs(msgspec.Struct):
    """The options of one command line, in the order given, and its positionals."""

    values: list[tuple[str, str]] = []  # (option name, value or "" for flags)
    positionals: list[str] = []  # arguments that are not options
    rest: list[str] = []  # after the first positional when parsing stops there

    def given(self, name: str) -> bool:
        """True if the option appeared at least once."""
        return any(key == name for key, _ in self.values)

    def last(self, name: str, default: str | None = None) -> str | None:
        """The last value of an option (a later one overrides an earlier one), or ``default``."""
        found = default
        for key, value in self.values:
            if key == name:
                found = value
        return found

    def all(self, name: str) -> list[str]:
        """Every value of a repeatable option, in order."""
        return [value for key, value in self.values if key == name]

    def items(self, name: str) -> list[str]:
        """Every item of a repeatable comma-list option (``-j 5 -j 6,7`` gives 5, 6, 7), blanks dropped."""
        return [item.strip() for value in self.all(name) for item in value.split(",") if item.strip()]


class OptionTable:
    """The options of one command, and the parser over them."""

    def __init__(self, options: Iterable[Option]) -> None:
        self._long: dict[str, Option] = {}
        self._short: dict[str, Option] = {}
        for option in options:
            for name in (option.name, *option.aliases):
                self._long[name] = option
            if option.short:
                self._short[option.short] = option

    def parse(self, argv: Sequence[str], *, stop_at_positional: bool = False) -> ParsedArgs:
        """Parse ``argv``; raise CliError for unknown, unsupported, ambiguous or incomplete options."""
        parsed = ParsedArgs()
        index = 0
        while index < len(argv):
            arg = argv[index]
            index += 1
            if arg == "--":
                self._positionals(parsed, argv[index:], stop_at_positional)
                break
            if arg.startswith("--"):
                index = self._long_option(parsed, argv, index, arg[2:])
            elif arg.startswith("-") and arg != "-":
                index = self._short_options(parsed, argv, index, arg[1:])
            elif stop_at_positional:
                parsed.positionals.append(arg)
                parsed.rest = list(argv[index:])
                break
            else:
                parsed.positionals.append(arg)
        return parsed

    @staticmethod
    def _positionals(parsed: ParsedArgs, args: Sequence[str], stop_at_positional: bool) -> None:
        if stop_at_positional and args:
            parsed.positionals.append(args[0])
            parsed.rest = list(args[1:])
        else:
            parsed.positionals.extend(args)

    def _long_option(self, parsed: ParsedArgs, argv: Sequence[str], index: int, text: str) -> int:
        name, has_value, value = text.partition("=")
        option = self._lookup_long(name)
        _check_supported(option)
        if not option.value:
            if has_value:
                raise CliError(f"option '--{option.name}' doesn't allow an argument")
            parsed.values.append((option.name, ""))
            return index
        if not has_value and option.optional:
            # getopt: an optional argument is only ever attached with "=".
            parsed.values.append((option.name, ""))
            return index
        if not has_value:
            if index >= len(argv):
                raise CliError(f"option '--{option.name}' requires an argument")
            value = argv[index]
            index += 1
        parsed.values.append((option.name, value))
        return index

    def _lookup_long(self, name: str) -> Option:
        exact = self._long.get(name)
        if exact is not None:
            return exact
        candidates = {opt.name: opt for long, opt in self._long.items() if name and long.startswith(name)}
        if len(candidates) == 1:
            return next(iter(candidates.values()))
        if candidates:
            shown = " ".join(f"'--{n}'" for n in sorted(candidates))
            raise CliError(f"option '--{name}' is ambiguous; possibilities: {shown}")
        raise CliError(f"unrecognized option '--{name}'")

    def _short_options(self, parsed: ParsedArgs, argv: Sequence[str], index: int, text: str) -> int:
        for position, letter in enumerate(text):
            option = self._short.get(letter)
            if option is None:
                raise CliError(f"invalid option -- '{letter}'")
            _check_supported(option)
            if not option.value:
                parsed.values.append((option.name, ""))
                continue
            attached = text[position + 1 :]
            if attached:
                parsed.values.append((option.name, attached))
            elif index < len(argv):
                parsed.values.append((option.name, argv[index]))
                index += 1
            else:
                raise CliError(f"option requires an argument -- '{letter}'")
            break
        return index


def _check_supported(option: Option) -> None:
    if not option.supported:
        raise CliError(f"option --{option.name} is not supported by Corral yet")


def parse_count(text: str, option: str, minimum: int = 1) -> int:
    """A whole number of at least ``minimum`` given to ``option``; CliError naming the option otherwise."""
    value = text.strip()
    if not value.isdigit() or len(value) > 9 or int(value) < minimum:
        raise CliError(f'invalid {option} "{text}": use a whole number of at least {minimum}')
    return int(value)


def parse_job_ids(items: Iterable[str], option: str) -> list[int]:
    """Plain job ids; array task (``12_3``) and step (``12.0``) ids are refused by name (``jobrefs`` reads
    task ids where a command supports them)."""
    ids: list[int] = []
    for item in items:
        text = item.strip()
        if "_" in text:
            raise CliError(
                f"{option} {text}: array task ids are not supported here by Corral yet: use the task's own "
                "job id (squeue -r -o %A)"
            )
        if "." in text and text.partition(".")[0].isdigit():
            raise CliError(f"{option} {text}: job steps are not supported here by Corral yet")
        if not text.isdigit() or len(text) > 18 or int(text) == 0:
            raise CliError(f"Invalid job id {text}")
        if int(text) not in ids:
            ids.append(int(text))
    return ids


def version_text() -> str:
    """What ``--version`` prints: the Slurm release whose interface Corral follows, and Corral's own."""
    from corral import __version__

    return f"slurm 23.11.0 (Corral {__version__})"
