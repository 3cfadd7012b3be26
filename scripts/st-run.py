"""Runs the schemathesis command line with one CPython 3.11 defect kept away.

CPython 3.11 before 3.11.8 keeps the AST constructor's recursion depth in state shared by all
threads (python/cpython#106905), so two threads turning source into an AST at once can fail with
"SystemError: AST constructor recursion depth mismatch". Hypothesis does that while it describes
the filters of schemathesis' workers, and the run then reports an error that is not the API's.
Here every `ast.parse` takes one lock; nothing else changes.
"""

import ast
import sys
import threading

_lock = threading.Lock()
_parse = ast.parse


def _locked_parse(*args, **kwargs):
    with _lock:
        return _parse(*args, **kwargs)


ast.parse = _locked_parse

from schemathesis.cli import schemathesis  # noqa: E402  (after the patch, on purpose)

if __name__ == "__main__":
    sys.argv[0] = "st"
    sys.exit(schemathesis())
