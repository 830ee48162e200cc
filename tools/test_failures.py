#!/usr/bin/env python3
"""Prints, for each test that failed in a meson test log, the lines that say why.

CI shows only the tail of what a run printed, and meson prints a failed
test's stdout before its stderr: a gtest assertion scrolls out of sight
behind the server logs that follow it. This is printed at the end of a
suite's run so that the tail names the failed assertion.

usage: test_failures.py BUILD_DIR/meson-logs/testlog.json [--lines N]
       test_failures.py --self-test
"""
import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile

FAILED_RESULTS = {"FAIL", "TIMEOUT", "ERROR", "UNEXPECTEDPASS"}
# What gtest, pytest and shell tests print on stdout when they fail.
WHY_STDOUT = re.compile(
    r"Failure|\[  FAILED  \]|Expected|Which is|Value of:|Actual:|error:|Error:|ERROR|"
    r"assert|FAILED|Traceback|not ok|^E  ")
# On stderr, only the sanitizers and crashes: the servers' logs, refusals
# included, are written there by design.
WHY_STDERR = re.compile(
    r"AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error|SUMMARY:|Traceback|"
    r"terminate called|Segmentation fault|Aborted")


# A gtest assertion's block: its message (a Status's text, say) matches no
# pattern, so the lines after "FILE:LINE: Failure" are kept up to the blank
# line or the "[ ... ]" marker that ends the block.
GTEST_FAILURE = re.compile(r":\d+: Failure$")
BLOCK_END = re.compile(r"^\s*$|^\[")


def why_lines(text, pattern, limit):
    lines = []
    in_block = False
    for line in text.splitlines():
        if in_block and BLOCK_END.search(line):
            in_block = False
        if in_block or pattern.search(line):
            lines.append(line)
        if GTEST_FAILURE.search(line):
            in_block = True
    return lines[:limit], max(0, len(lines) - limit)


def report(log, limit):
    try:
        with open(log, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"test_failures: cannot read {log}: {e}", file=sys.stderr)
        return 1
    for r in (r for r in records if r.get("result") in FAILED_RESULTS):
        print(f"== why {r['name']} {r['result']} (exit {r.get('returncode')}, "
              f"{r.get('duration', 0):.0f} s):")
        for stream, pattern in (("stdout", WHY_STDOUT), ("stderr", WHY_STDERR)):
            lines, more = why_lines(r.get(stream) or "", pattern, limit)
            for line in lines:
                print(f"  {stream}: {line[:300]}")
            if more:
                print(f"  {stream}: ... and {more} more such lines ({log})")
            if not lines and stream == "stdout":
                for line in (r.get(stream) or "").splitlines()[-10:]:
                    print(f"  stdout (last lines): {line[:300]}")
    return 0


def self_test():
    """A failed gtest's assertion is printed, a server's refusal on stderr and
    a passing test are not."""
    failed = {"name": "security", "result": "FAIL", "returncode": 1, "duration": 66.2,
              "stdout": "[ RUN      ] Flood.Guesses\nsecurity_test.cc:470: Failure\n"
                        "Expected: (most_fds) <= (bound), actual: 545 vs 540\n"
                        "[  FAILED  ] Flood.Guesses (4633 ms)\n"
                        "[ RUN      ] Start.OnAFreePort\nshard_test.cc:269: Failure\n"
                        "Value of: shard.status().ok()\n  Actual: false\nExpected: true\n"
                        "UNAVAILABLE: listen on 127.0.0.1:20000: the port is in use\n\n"
                        "outside any block\n[  FAILED  ] Start.OnAFreePort (21 ms)\n",
              "stderr": "I [ps0] worker left\nW [ps0] refused: Error: bad proof\n"}
    passed = {"name": "wire", "result": "OK", "returncode": 0, "duration": 0.6,
              "stdout": "Expected: nothing, this passed\n", "stderr": ""}
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "testlog.json")
        with open(log, "w", encoding="utf-8") as f:
            f.write(json.dumps(failed) + "\n" + json.dumps(passed) + "\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = report(log, 40)
    text = out.getvalue()
    checks = {
        "exits 0": rc == 0,
        "names the failed test": "== why security FAIL" in text,
        "prints the assertion": "actual: 545 vs 540" in text and "security_test.cc:470" in text,
        "prints an assertion's message": "the port is in use" in text,
        "ends the block at its blank line": "outside any block" not in text,
        "leaves the server's log out": "refused" not in text,
        "leaves the passing test out": "wire" not in text,
    }
    for what, ok in checks.items():
        print(f"{'ok' if ok else 'FAILED'}: {what}")
    return 0 if all(checks.values()) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?")
    parser.add_argument("--lines", type=int, default=40, help="at most this many lines a test")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.log:
        parser.error("the test log to read is missing")
    return report(args.log, args.lines)


if __name__ == "__main__":
    sys.exit(main())
