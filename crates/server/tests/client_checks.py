"""The `check` the client scripts here (openai_client.py, anthropic_client.py, agents_client.py)
share: one line per check, exit status 1 on the first failure, and at exit the script's count
(`NAME: P passed, F failed, 0 skipped`), which `cargo xtask test` adds to its closing line. They
import it from their own folder, the first entry of sys.path when run as
`python path/to/x_client.py` (as openai_client.sh runs them)."""
import atexit
import os
import sys

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if not cond:
        failed += 1
        print(f"FAIL: {what}")
        sys.exit(1)
    passed += 1
    print(f"ok: {what}")


@atexit.register
def _count():
    print(f"{os.path.basename(sys.argv[0])}: {passed} passed, {failed} failed, 0 skipped", flush=True)
