"""`python -m dvm.vm.cpu.host.build PIECE... [--background PIECE...]`: compile CPU VM pieces into the
disk cache, in the order given (host/startup starts these processes, each with the same list; each
piece is compiled under its machine-wide lock, and one another process holds is left to it). The
pieces after --background are compiled at low priority, so that the programs running meanwhile
keep the cores."""
from __future__ import annotations

import os
import sys


def _lower_priority() -> None:
    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass


def main(argv: list[str]) -> int:
    from .pieces import BACKGROUND_FLAG, BY_NAME, compile_in_this_process
    split = argv.index(BACKGROUND_FLAG) if BACKGROUND_FLAG in argv else len(argv)
    foreground, background = argv[:split], argv[split + 1:]
    unknown = [n for n in foreground + background if n not in BY_NAME]
    if unknown:
        print(f"dvm: unknown CPU VM pieces: {', '.join(unknown)}", file=sys.stderr)
        return 2
    compile_in_this_process(foreground)
    if background:
        _lower_priority()
        compile_in_this_process(background)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
