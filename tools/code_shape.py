#!/usr/bin/python3
"""Reports the shape of the code that a reader has to hold in mind, and
keeps it from growing: classes in src/ with more than 25 methods or 15 data
members, and functions on the push and pull paths longer than 80 lines.

Both are read by clang itself (libclang, Debian's python3-clang-14) from the
build's compile_commands.json, so templates, macros and nested classes are
counted as the compiler sees them, not guessed from text.

- A class is every class or struct defined in a header under src/ or in a
  source file of the push and pull paths (PATH_SOURCES). Its methods are
  the member functions it declares (constructors, destructor and templates
  included; `= default` and `= delete` left out); its data members are its
  non-static fields. A plain data struct laid out for the hot path may hold
  more: a comment right above it that says "plain data" exempts it.
- A function is every function defined in PATH_SOURCES, lambdas inside it
  counted as its lines.

It also writes docs/architecture.md's index of where each class lives (every
class at namespace scope in a header of include/, src/ or transport/, or in
a path source), and fails when that index no longer matches the code.

What is over the limits today is listed in tools/code_shape_baseline.txt.
The check fails when something over a limit is not listed there, when a
listed one grew, or when one shrank or went under the limits and the list
still says the old figure (`--update` rewrites it): the list only ever
shrinks, towards empty.

Debian's /usr/bin/python3 runs it: python3-clang-14 is its package.

Usage: code_shape.py BUILD_DIR [--update]
       code_shape.py --self-test BUILD_DIR   (plants an over-large class and
                                              function in a copy; each must
                                              be caught)
"""

import json
import os
import shlex
import sys
from collections import defaultdict
from pathlib import Path

MAX_METHODS = 25
MAX_MEMBERS = 15
MAX_FUNCTION_LINES = 80

# The push and pull paths: the client's movers and the shard's apply and
# pull service, and the wire's codecs for both.
PATH_SOURCES = [
    "src/client/data_calls.cc",
    "src/client/split_by_shard.cc",
    "src/client/fan_out.cc",
    "src/client/push_sender.cc",
    "src/client/slot_push.cc",
    "src/client/pull_receiver.cc",
    "src/client/arena_pull.cc",
    "src/client/gpu_access.cc",
    "src/client/shard_links.cc",
    "src/server/server.cc",
    "src/server/push_applier.cc",
    "src/server/pull_server.cc",
    "src/server/apply.cc",
    "src/server/param_table.cc",
    "src/server/lease_table.cc",
    "src/wire/messages_data.cc",
    "src/wire/field_codec.cc",
]

# Where classes are read: all of them go into architecture.md's index; those
# in src/ are held to the limits.
INDEXED = ("include/", "src/", "transport/")
LIMITED = "src/"

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "code_shape_baseline.txt"
ARCHITECTURE = HERE.parent / "docs/architecture.md"
INDEX_BEGIN = "<!-- class-index: written by tools/code_shape.py --update; the code-shape test fails when it is stale -->"
INDEX_END = "<!-- class-index end -->"


def compile_args(entry):
    """The compiler's arguments of a compile_commands.json entry, without
    what only makes output (-o, -c, dependency files) and the source."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    if os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]  # the compiler it wraps
    keep, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MQ", "-MT"):
            skip = True
        elif a == "-c" or a.startswith("-M") or a == entry["file"]:
            continue
        elif a.startswith("-Wshadow="):  # gcc's spelling; clang knows -Wshadow only
            continue
        else:
            keep.append(a)
    # Read every comment (for the "plain data" exemption), and never stop
    # at a warning clang has and gcc has not.
    return keep + ["-fparse-all-comments", "-Wno-everything"]


class Reader:
    def __init__(self, root, build, planted=None):
        import clang.cindex as ci  # python3-clang-14

        self.ci, self.root, self.build = ci, root, build
        # Files as the self-test plants them ({absolute path: text}), handed
        # to clang instead of the tree's: the tree itself is never written.
        self.planted = planted or {}
        self.index = ci.Index.create()
        os.chdir(build)  # the compile commands' paths are relative to it
        with open(build / "compile_commands.json") as f:
            self.commands = {}
            for e in json.load(f):
                path = (Path(e["directory"]) / e["file"]).resolve()
                self.commands[path] = e
        self.classes = {}  # qualified name -> (file, line, methods, members, exempt)
        self.functions = {}  # (file, qualified name) -> lines
        self.unread = []  # what this build does not compile, so clang cannot read
        # Each header's classes outside any other class: docs/architecture.md's
        # index of where each class lives.
        self.header_classes = defaultdict(set)

    def rel(self, cursor):
        f = cursor.location.file
        if f is None:
            return None
        try:
            return Path(f.name).resolve().relative_to(self.root).as_posix()
        except ValueError:
            return None

    def parse(self, source, entry, skip_bodies, unsaved=()):
        ci = self.ci
        options = ci.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES if skip_bodies else 0
        files = list(unsaved) + [(str(p), t) for p, t in self.planted.items()]
        tu = self.index.parse(str(source), args=compile_args(entry), unsaved_files=files,
                              options=options)
        errors = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
        if errors:
            raise SystemExit(f"code_shape: clang cannot parse {source}: {errors[0]}")
        return tu

    def entry_in(self, directory):
        """A compile command of a source in `directory`: its include paths
        and flags are those of the headers beside it."""
        for path, e in self.commands.items():
            if path.parent == directory and path.suffix == ".cc":
                return e
        return None

    def read_headers(self, only_dir=None):
        by_dir = defaultdict(list)
        headers = {h for top in INDEXED for h in (self.root / top).rglob("*.h")}
        headers |= {p for p in self.planted if p.suffix == ".h"}
        for h in sorted(headers):
            by_dir[h.parent].append(h)
        for directory, headers in by_dir.items():
            if only_dir and directory != only_dir:
                continue
            # A backend's headers are read as the transport's sources see
            # them; the public headers as the core's.
            entry = self.entry_in(directory) or self.entry_in(directory.parent)
            if directory.is_relative_to(self.root / "include"):
                entry = self.entry_in(self.root / "src/core")
            if entry is None:  # headers of code this build does not compile
                self.unread.append(directory.relative_to(self.root).as_posix())
                continue
            umbrella = directory / "__code_shape_headers.cc"
            text = "".join(f'#include "{h.name}"\n' for h in headers)
            tu = self.parse(umbrella, entry, True, unsaved=[(str(umbrella), text)])
            self.collect(tu.cursor, functions=False)

    def read_path_sources(self, sources=PATH_SOURCES):
        for rel in sources:
            source = (self.root / rel).resolve()
            entry = self.commands.get(source)
            if entry is None:  # not built here
                self.unread.append(rel)
                continue
            self.collect(self.parse(source, entry, False).cursor, functions=True, only=rel)

    def kind(self, cursor):
        try:
            return cursor.kind
        except ValueError:  # a kind newer than the Python binding knows
            return None

    def collect(self, cursor, functions, only=None):
        """Classes (and, with `functions`, function definitions) under
        `cursor` that src/ (or only the file `only`) defines. Whatever lies
        in another file is not walked into: the standard library alone is
        most of a translation unit."""
        K = self.ci.CursorKind
        class_kinds = (K.CLASS_DECL, K.STRUCT_DECL, K.CLASS_TEMPLATE)
        function_kinds = (K.FUNCTION_DECL, K.CXX_METHOD, K.CONSTRUCTOR, K.DESTRUCTOR,
                          K.FUNCTION_TEMPLATE, K.CONVERSION_FUNCTION)
        for c in cursor.get_children():
            kind = self.kind(c)
            if kind is None:
                continue
            rel = self.rel(c)
            if rel is None or not rel.startswith(INDEXED) or (only and rel != only):
                continue
            if kind in class_kinds and c.is_definition():
                self.add_class(c, rel)
                self.collect(c, functions, only)  # nested classes, inline methods
            elif kind in function_kinds and c.is_definition():
                if functions:
                    lines = c.extent.end.line - c.extent.start.line + 1
                    key = (rel, qualified(c))  # overloads: the longest
                    self.functions[key] = max(lines, self.functions.get(key, 0))
            elif kind in (K.NAMESPACE, K.LINKAGE_SPEC, K.UNEXPOSED_DECL):
                self.collect(c, functions, only)

    def add_class(self, c, rel):
        K = self.ci.CursorKind
        methods = members = 0
        for m in c.get_children():
            kind = self.kind(m)
            if kind in (K.CXX_METHOD, K.CONSTRUCTOR, K.DESTRUCTOR, K.FUNCTION_TEMPLATE,
                        K.CONVERSION_FUNCTION):
                spelled = " ".join(t.spelling for t in m.get_tokens())
                if not (spelled.endswith("= default") or spelled.endswith("= delete")):
                    methods += 1
            elif kind == K.FIELD_DECL:
                members += 1
        exempt = "plain data" in (c.raw_comment or "").lower()
        name = qualified(c)
        self.classes[name] = (rel, c.location.line, methods, members, exempt)
        # At namespace scope where it is defined (Client::Impl included).
        parent = self.kind(c.lexical_parent)
        if parent == K.NAMESPACE and "(anonymous)" not in name:
            self.header_classes[rel].add(name.removeprefix("tessera::"))


def qualified(c):
    parts = []
    while c is not None and c.kind.name != "TRANSLATION_UNIT":
        parts.append(c.spelling or "(anonymous)")
        c = c.semantic_parent
    return "::".join(reversed(parts))


def findings(reader):
    """Every figure over its limit: {(what, name): figure}."""
    found = {}
    for name, (rel, line, methods, members, exempt) in reader.classes.items():
        if exempt or not rel.startswith(LIMITED):
            continue
        if methods > MAX_METHODS:
            found[("methods", name)] = methods
        if members > MAX_MEMBERS:
            found[("members", name)] = members
    for (rel, name), lines in reader.functions.items():
        if lines > MAX_FUNCTION_LINES:
            found[("lines", f"{rel}:{name}")] = lines
    return found


def class_index(reader, held):
    """docs/architecture.md's list of where each class lives: every class
    defined at namespace scope in a header (or a push and pull path
    source), by file. A file this build does not compile (-Dpython=disabled:
    src/python) keeps the row `held` has for it: it cannot be read here."""
    rows = {}
    for rel in reader.header_classes:
        names = ", ".join(f"`{n}`" for n in sorted(reader.header_classes[rel]))
        rows[rel] = f"- `{rel}`: {names}"
    for row in (held or "").splitlines():
        rel = row.split("`")[1] if row.count("`") >= 2 else ""
        if any(rel == u or rel.startswith(u + "/") for u in reader.unread):
            rows[rel] = row
    return "\n".join(rows[rel] for rel in sorted(rows))


def index_in(doc):
    """The class index architecture.md holds now, or None without markers."""
    text = doc.read_text()
    if INDEX_BEGIN not in text or INDEX_END not in text:
        return None
    return text.split(INDEX_BEGIN, 1)[1].split(INDEX_END, 1)[0].strip("\n")


def write_index(doc, index):
    text = doc.read_text()
    head, rest = text.split(INDEX_BEGIN, 1)
    tail = rest.split(INDEX_END, 1)[1]
    doc.write_text(head + INDEX_BEGIN + "\n" + index + "\n" + INDEX_END + tail)


def read_baseline(path):
    listed = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            what, name, figure = line.split()
            listed[(what, name)] = int(figure)
    return listed


def write_baseline(path, found):
    head = ("# tools/code_shape.py: what is over the limits today (methods > 25 or\n"
            "# members > 15 per class in src/; lines > 80 per function on the push and\n"
            "# pull paths). It only shrinks: `tools/code_shape.py build --update`.\n")
    rows = sorted(f"{what} {name} {figure}" for (what, name), figure in found.items())
    path.write_text(head + "".join(r + "\n" for r in rows))


def check(root, build, baseline, update):
    reader = Reader(root, build)
    reader.read_headers()
    reader.read_path_sources()
    if not reader.classes or not reader.functions:
        raise SystemExit("code_shape: read no class or no function: the build's "
                         "compile_commands.json does not cover src/")
    found = findings(reader)
    held = index_in(ARCHITECTURE)
    index = class_index(reader, held)
    if update:
        write_baseline(baseline, found)
        write_index(ARCHITECTURE, index)
        print(f"code_shape: {baseline} lists {len(found)} figures over the limits; "
              f"{ARCHITECTURE.name}'s class index written")
        return 0
    problems = compare(found, read_baseline(baseline))
    if held is None:
        problems.append(f"{ARCHITECTURE.name} has no class index between its markers")
    elif held != index:
        old, new = set(held.splitlines()), set(index.splitlines())
        changed = sorted(new - old) + [f"(no longer) {r}" for r in sorted(old - new)]
        problems.append(f"{ARCHITECTURE.name}'s class index is stale (run --update): "
                        + "; ".join(changed))
    print(f"code_shape: {len(reader.classes)} classes, {len(reader.functions)} functions on the "
          f"push and pull paths read; {len(found)} figures over the limits")
    if reader.unread:
        print(f"code_shape: not read (this build compiles none of it): {', '.join(reader.unread)}")
    for (what, name), figure in sorted(found.items(), key=lambda kv: -kv[1]):
        print(f"  over: {name} {figure} {what} (limit {limit(what)})")
    for p in problems:
        print(f"code_shape: {p}", file=sys.stderr)
    return 1 if problems else 0


def compare(found, listed):
    """What the check fails for: figures over a limit that the baseline
    does not list, or lists lower; listed ones that went down."""
    problems = []
    for key, figure in sorted(found.items()):
        if key not in listed:
            problems.append(f"new: {key[1]} has {figure} {key[0]} (limit "
                            f"{limit(key[0])}): make it smaller")
        elif figure > listed[key]:
            problems.append(f"grew: {key[1]} has {figure} {key[0]}, {listed[key]} before")
    for key, figure in sorted(listed.items()):
        if found.get(key, 0) < figure:
            now = found.get(key)
            problems.append(f"smaller: {key[1]} has {now if now else 'no more than the limit of'} "
                            f"{key[0]}, listed as {figure}: run --update so it stays so")
    return problems


def limit(what):
    return {"methods": MAX_METHODS, "members": MAX_MEMBERS, "lines": MAX_FUNCTION_LINES}[what]


def self_test(root, build):
    """Plants a class of 26 methods and 16 members in a header, and a
    function of 81 lines in a path source, as clang's unsaved files (the
    tree is not written); each must be found over its limit."""
    planted_header = root / "src/core/__code_shape_planted.h"
    path_source = root / PATH_SOURCES[0]
    methods = "".join(f"  void M{i}();\n" for i in range(MAX_METHODS + 1))
    members = "".join(f"  int f{i} = 0;\n" for i in range(MAX_MEMBERS + 1))
    body = "".join(f"  x += {i};\n" for i in range(MAX_FUNCTION_LINES))
    planted = {
        planted_header: "#pragma once\nnamespace planted {\nclass Planted {\n public:\n" + methods
        + members + "};\n}  // namespace planted\n",
        path_source: path_source.read_text() + "\nnamespace planted {\nint Planted(int x) {\n"
        + body + "  return x;\n}\n}  // namespace planted\n",
    }
    reader = Reader(root, build, planted)
    reader.read_headers(only_dir=planted_header.parent)
    reader.read_path_sources(PATH_SOURCES[:1])
    problems = compare(findings(reader), read_baseline(BASELINE))
    want = [("methods", "planted::Planted"), ("members", "planted::Planted"),
            ("lines", f"{PATH_SOURCES[0]}:planted::Planted")]
    missed = [w for w in want if not any(p.startswith(f"new: {w[1]} ") and f" {w[0]} " in p
                                         for p in problems)]
    for w in want:
        print(f"code_shape self-test: {w[1]} {w[0]}: {'MISSED' if w in missed else 'caught'}")
    return 1 if missed else 0


def main(argv):
    update = "--update" in argv
    selftest = "--self-test" in argv
    rest = [a for a in argv if a not in ("--update", "--self-test")]
    if len(rest) != 1:
        raise SystemExit(__doc__)
    build = Path(rest[0]).resolve()
    root = HERE.parent
    try:
        import clang.cindex  # noqa: F401
    except ImportError:
        print("code_shape: SKIPPED: no libclang binding (Debian's python3-clang-14; "
              "tools/dev.sh test installs it)")
        return 77
    if selftest:
        return self_test(root, build)
    return check(root, build, BASELINE, update)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
