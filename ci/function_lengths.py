#!/usr/bin/env python3
"""Functions longer than a limit in the project's C++ and CUDA sources (the house rule: none over about 120 lines).

A function is a brace block opened by a signature (a line ending in `{` after a closing parenthesis, possibly with
const/override/noexcept/an initializer list) at namespace or class scope; lambdas and nested blocks count toward
the function around them; its length runs from its opening brace to its closing one. Comments, string literals and
preprocessor lines are skipped. Prints `file:line: name: N lines` for each one over the limit, longest first, and
exits 1 when there is any.

usage: function_lengths.py [--limit N] FILE...
"""
import argparse
import re
import sys

CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|else|do|try)\b")
SCOPE = re.compile(r"^\s*((template\s*<.*>\s*)?(class|struct|union|enum|namespace)\b|extern\s+\"C\")")


def strip(text):
    """The text with comments and string/char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator (1'000)
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(first line, name, lines) of every function defined at namespace or class scope."""
    lines = strip(text).split("\n")
    stack = []  # per open brace: 'scope', 'function' or 'block'
    found = []
    statement = ""  # what came since the last ';', '{' or '}' at this level: the head of the next block
    continued = False  # a preprocessor line ending in a backslash goes on
    for ln, line in enumerate(lines, 1):
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        if directive:
            continue
        for ch in line:
            if ch == "{":
                head = statement.strip()
                in_function = any(kind == "function" for kind, _, _ in stack)
                if in_function:
                    kind = "block"
                elif SCOPE.match(head) or head.endswith("=") or not head:
                    kind = "scope" if SCOPE.match(head) else "block"
                elif ")" in head and not CONTROL.match(head):
                    kind = "function"
                else:
                    kind = "block"
                name = ""
                if kind == "function":
                    m = re.search(r"([~\w:<>]+)\s*\([^()]*(\([^()]*\)[^()]*)*\)[^()]*$", head.split(" : ")[0])
                    name = m.group(1) if m else head[:40]
                stack.append((kind, ln, name))
                statement = ""
            elif ch == "}":
                if stack:
                    kind, start, name = stack.pop()
                    if kind == "function":
                        found.append((start, name, ln - start + 1))
                statement = ""
            elif ch == ";":
                statement = ""
            else:
                statement += ch
        statement += " "
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    long_ones = []
    for path in args.files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for start, name, length in functions(f.read()):
                if length > args.limit:
                    long_ones.append((length, path, start, name))
    for length, path, start, name in sorted(long_ones, reverse=True):
        print(f"{path}:{start}: {name}: {length} lines (limit {args.limit})")
    return 1 if long_ones else 0


if __name__ == "__main__":
    sys.exit(main())
