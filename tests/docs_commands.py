"""Runs the commands README.md and docs/*.md show, from the docs themselves,
so that a doc and its command cannot drift apart.

A fenced block is run when the line before it marks it:

    <!-- test: run [timeout=S] -->    bash, from the repository root, with
                                      the build's tessera first on PATH and
                                      build/ where the docs say build/
    <!-- test: compile-c -->          a C program: compiled and linked
                                      against the build's libtessera
    <!-- test: compile-c run=launch --> the same, then run as both workers
                                      of `tessera launch --ps 2 --workers 2`
    <!-- test: syntax -->             bash -n only (a command that needs what
                                      CI lacks, said beside the mark)
    <!-- test: by-TEST -->            bash -n here; the meson test TEST runs
                                      it, taking it from the doc:
                                      docs_commands.py --print by-TEST
                                      SOURCE_ROOT
    <!-- test: output -->             not a command: what one prints

Every other shell or C block is listed as not run, so what is left to mark
stays in sight. Usage: docs_commands.py SOURCE_ROOT BUILD_ROOT
"""

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = re.compile(r"<!--\s*test:\s*([\w-]+)([^>]*?)-->")
FENCE = re.compile(r"^(\s*)```([\w+-]*)")


def blocks(path):
    """(line, mark or None, options, language, text) of each fenced block."""
    lines = path.read_text().splitlines()
    i, mark, options = 0, None, {}
    while i < len(lines):
        m = MARK.search(lines[i])
        if m:
            mark = m.group(1)
            # key=value options; other words say why (a syntax-only mark's reason)
            options = dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            start, indent, language = i + 1, len(f.group(1)), f.group(2)
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i][indent:])
                i += 1
            yield start, mark, options, language, "\n".join(body) + "\n"
            mark, options = None, {}
        elif lines[i].strip():
            mark, options = None, {}  # a mark belongs to the block right after it
        i += 1


def run(text, source, build, timeout):
    env = dict(os.environ)
    env["PATH"] = f"{build / 'tools'}{os.pathsep}{env.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        # The docs say build/...: the build directory being tested.
        Path(tmp, "build").symlink_to(build)
        for entry in source.iterdir():
            if entry.name != "build":
                Path(tmp, entry.name).symlink_to(entry)
        return subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=tmp, env=env,
                              timeout=timeout, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)


def compile_c(text, source, build, then_run):
    # A sanitized build's library needs its runtime linked in (SANITIZE:
    # meson's b_sanitize).
    sanitize = os.environ.get("SANITIZE", "none")
    flags = [] if sanitize in ("", "none") else [f"-fsanitize={sanitize}"]
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp, "doc.c")
        program.write_text(text)
        built = subprocess.run(
            [os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror", *flags,
             f"-I{source / 'include'}", f"-I{build}", str(program), "-o",
             str(Path(tmp, "doc")), f"-L{build}", "-ltessera", f"-Wl,-rpath,{build}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if built.returncode != 0 or then_run is None:
            return built
        # As the doc says to run it: every worker of a real cluster.
        return subprocess.run(
            [str(build / "tools" / "tessera"), "launch", "--ps", "2", "--workers", "2",
             "--transport", "tcp", "--", str(Path(tmp, "doc"))],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=then_run)


def print_blocks(mark_wanted, source):
    """The text of every block marked `mark_wanted`, for the test that runs
    it (an engine test): it runs what the doc shows."""
    docs = [source / "README.md"] + sorted((source / "docs").glob("*.md"))
    found = [text for doc in docs for _, mark, _, _, text in blocks(doc) if mark == mark_wanted]
    if not found:
        print(f"no block is marked '{mark_wanted}'", file=sys.stderr)
        return 1
    sys.stdout.write("".join(found))
    return 0


def main():
    if sys.argv[1] == "--print":
        return print_blocks(sys.argv[2], Path(sys.argv[3]).resolve())
    source, build = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    docs = [source / "README.md"] + sorted((source / "docs").glob("*.md"))
    failed, done, unmarked = [], 0, []
    for doc in docs:
        for line, mark, options, language, text in blocks(doc):
            where = f"{doc.relative_to(source)}:{line}"
            if mark is None:
                if language in ("", "sh", "bash", "console", "c"):
                    unmarked.append(where)
                continue
            started = time.monotonic()
            if mark == "run":
                result = run(text, source, build, float(options.get("timeout", "300")))
            elif mark == "compile-c":
                then_run = float(options.get("timeout", "180")) if "run" in options else None
                result = compile_c(text, source, build, then_run)
            elif mark == "output":
                continue
            elif mark == "syntax" or mark.startswith("by-"):
                result = subprocess.run(["bash", "-n", "-c", text], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
            else:
                failed.append(f"{where}: unknown mark '{mark}'")
                continue
            took = time.monotonic() - started
            done += 1
            if result.returncode != 0:
                failed.append(f"{where}: {mark} exited {result.returncode}:\n{result.stdout}")
                print(f"FAIL {where} ({mark}, {took:.1f} s)")
            else:
                print(f"ok   {where} ({mark}, {took:.1f} s)")
    print(f"{len(unmarked)} shell or C blocks not run yet (no test mark): "
          + ", ".join(unmarked))
    for f in failed:
        print(f)
    print(f"{done - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or done == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
