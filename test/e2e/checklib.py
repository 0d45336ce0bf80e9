"""The pass/fail bookkeeping shared by the Python end-to-end tests: each
check counts, failures print one line, and done() prints the closing
"N passed, N failed" line and exits non-zero on any failure."""
import sys

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, flush=True)


def done(name):
    print(f"{name}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
