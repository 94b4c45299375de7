"""`python -m dvm.vm.cpu.host.build [--background] PIECE...`: compile CPU VM pieces into the disk
cache (host/startup starts these processes; each piece under its machine-wide lock). --background:
at low priority, so that the programs running meanwhile keep the cores."""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["--background"]:
        argv = argv[1:]
        try:
            os.nice(10)
        except (AttributeError, OSError):
            pass
    from .pieces import BY_NAME, compile_in_this_process
    unknown = [n for n in argv if n not in BY_NAME]
    if unknown:
        print(f"dvm: unknown CPU VM pieces: {', '.join(unknown)}", file=sys.stderr)
        return 2
    compile_in_this_process(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
