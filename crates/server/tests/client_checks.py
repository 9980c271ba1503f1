"""The `check` the client scripts here (openai_client.py, anthropic_client.py, agents_client.py)
share: one line per check, exit status 1 on the first failure. They import it from their own
folder, the first entry of sys.path when run as `python path/to/x_client.py` (as
openai_client.sh runs them)."""
import sys

passed = 0


def check(cond, what):
    global passed
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    passed += 1
    print(f"ok: {what}")
