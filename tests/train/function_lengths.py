#!/usr/bin/env python3
"""Fails when a function in src/keel/train/*.cpp runs past LIMIT lines (issue 12: a trainer made
of parts, each stage a short function). Counts from a definition's first line (signature and
initializer list included) to its closing brace; namespace braces do not nest, class and
initializer blocks are not functions. `--report` lists the longest."""
import pathlib
import re
import sys

LIMIT = 100
# Files allowed longer functions (none: every file of train/ keeps to the limit).
EXEMPT = set()


def strip(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//")[0]


def long_functions(path):
    """(first line, length) of every top-level block: from its signature's first line (the line
    after the previous declaration, blank line or comment) to its closing brace."""
    depth, start, head, found = 0, None, "", []
    signature = 1  # where the next top-level declaration begins
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = strip(raw)
        if depth == 0 and re.match(r"\s*(namespace\b.*\{|\}\s*$)", line):
            signature = number + 1
            continue  # namespace open/close
        if depth == 0 and (not line.strip() or line.lstrip().startswith("#")):
            signature = number + 1
            continue
        for ch in line:
            if ch == "{":
                if depth == 0:
                    start, head = signature, line
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    is_function = not re.match(r"\s*(class|struct|enum|union)\b", head) and "=" not in head.split("{")[0]
                    if is_function:
                        found.append((start, number - start + 1))
                    start = None
        if depth == 0 and line.rstrip().endswith((";", "}")):
            signature = number + 1
    return found


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = pathlib.Path(args[0]) if args else pathlib.Path(__file__).resolve().parents[2]
    bad, longest = [], []
    for path in sorted((root / "src" / "keel" / "train").glob("*.cpp")):
        if path.name in EXEMPT:
            continue
        for start, length in long_functions(path):
            longest.append((length, f"{path.relative_to(root)}:{start}"))
            if length > LIMIT:
                bad.append(f"{path.relative_to(root)}:{start}: function of {length} lines (limit {LIMIT})")
    if "--report" in sys.argv:
        for length, where in sorted(longest, reverse=True)[:12]:
            print(f"{length:4d}  {where}")
    print("\n".join(bad) if bad else "every function in src/keel/train is at most %d lines" % LIMIT)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
