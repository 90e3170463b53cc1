"""A script written for the `zephyr` command run with plain `python script.py`: say that it did nothing.

The `zephyr` command calls a script's `main()` when the script has no `if __name__ == "__main__":`
block; plain `python script.py` runs only its top level, so such a script defines `main()`,
runs no pipeline and exits 0. Importing zephyr registers `warn_if_main_never_ran` at exit: when
the program's `__main__` is a script file (the one `python` was given) that defines its own
`main()`, has no `__main__` block, and no pipeline ran in this process, one line on stderr says
how to run it (the exit status is left as it is).
"""

from __future__ import annotations

import ast
import atexit
import os
import sys

__all__ = ["has_main_guard", "note_pipeline_started", "uncalled_main_message", "warn_if_main_never_ran"]

_pipeline_started = False


def note_pipeline_started() -> None:
    """A pipeline started in this process (`zephyr.execution.runner.Execution`)."""
    global _pipeline_started
    _pipeline_started = True


def has_main_guard(path: str) -> bool:
    """Whether the script at `path` has a top-level `if __name__ == "__main__":` block."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            return True
    return False


def uncalled_main_message() -> str | None:
    """The warning for this process as it ends, or None when there is nothing to say."""
    if _pipeline_started:
        return None
    main = getattr(sys.modules.get("__main__"), "main", None)
    if getattr(main, "__module__", None) != "__main__" or not hasattr(main, "__code__"):
        return None  # a console script (its `main` is imported), a spawned child (`__mp_main__`), no main()
    path = main.__code__.co_filename  # `__main__.__file__` is gone by now (Python removes it after the script)
    if not sys.argv or not os.path.isfile(path) or os.path.abspath(sys.argv[0]) != os.path.abspath(path):
        return None  # `python -c`, or a main() the script took from elsewhere
    try:
        if has_main_guard(path):
            return None  # the script decides what runs
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    return (f"zephyr: {path} defines main() but nothing called it, so no pipeline ran: `python {path}` runs only the "
            f"script's top level. Run it with `zephyr {path}` (which calls main()), or end the script with "
            f'`if __name__ == "__main__": main()` to run it both ways.')


def warn_if_main_never_ran() -> None:
    message = uncalled_main_message()
    if message:
        print(message, file=sys.stderr, flush=True)


atexit.register(warn_if_main_never_ran)
