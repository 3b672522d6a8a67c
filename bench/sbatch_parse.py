"""What reading ``#SBATCH`` lines costs (issue 13), in CPU seconds, in-process: no cluster.

``before`` is the splitter sbatch used, ``shlex.split`` (POSIX mode), which adds a word's characters one at
a time and so is quadratic in the length of a word; ``after`` is ``sbatch_script.directive_words``. Both
split the same text in the same run: ``-J`` and one word of N characters, then N characters of short words
(``-J a`` repeated). ``refusal`` is ``directive_options`` on a script with one 1 MiB ``#SBATCH`` line, which
is refused by its length before it is read; ``worst script`` reads the largest script sbatch takes (4 MiB)
made of lines of the longest length allowed, each full of ``-J a``.

    python bench/sbatch_parse.py [--sizes 131072,262144,524288,1048576] [--before-max 1048576]
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import time
from collections.abc import Callable

from corral.cli.errors import CliError
from corral.cli.sbatch_args import directive_options
from corral.cli.sbatch_script import MAX_DIRECTIVE_CHARS, MAX_SCRIPT_BYTES, directive_words


def cpu(call: Callable[[], object]) -> float:
    """CPU seconds of one call (a refusal counts as done)."""
    started = time.process_time()
    with contextlib.suppress(CliError, ValueError):
        call()
    return time.process_time() - started


def main() -> None:
    """Print a Markdown table of before/after CPU times per size, then the refusal and the worst script."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="131072,262144,524288,1048576")
    parser.add_argument("--before-max", type=int, default=1 << 20, help="largest N timed with shlex")
    args = parser.parse_args()
    print("| text | N (chars) | before: shlex.split (s) | after: directive_words (s) |")
    print("|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        for name, text in ((" one word", " -J " + "a" * size), ("short words", " -J a" * (size // 5))):
            before = f"{cpu(lambda t=text: shlex.split(t)):.3f}" if size <= args.before_max else "-"
            print(f"| {name.strip()} | {size} | {before} | {cpu(lambda t=text: directive_words(t)):.4f} |")
    refused = "#!/bin/sh\n#SBATCH -J " + "a" * (1 << 20) + "\ntrue\n"
    print(f"\nrefusal of a 1 MiB #SBATCH line: {cpu(lambda: directive_options(refused)):.4f} s")
    line = "#SBATCH" + " -J a" * ((MAX_DIRECTIVE_CHARS - 8) // 5)
    script = "#!/bin/sh\n" + "\n".join([line] * (MAX_SCRIPT_BYTES // (len(line) + 1) - 1)) + "\ntrue\n"
    print(f"worst script ({len(script)} bytes): {cpu(lambda: directive_options(script)):.2f} s")


if __name__ == "__main__":
    main()
