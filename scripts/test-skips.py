#!/usr/bin/env python3
"""Lists the tests of a ctest run that did not run (skipped, not run, disabled), each with
its reason, and checks them against the allowlist: make test and make test-asan end with
this list, and .ci/run (CHECK_SKIPS=1) fails when a test outside the allowlist did not run.

    test-skips.py --junit FILE [--allowlist FILE] [--check] [--title TEXT] [--also FILE...]

--junit: ctest's --output-junit file (CMake >= 3.21; Debian 12 has 3.25). A testcase's
status is run, fail, notrun (skipped: SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION, which
gtest_discover_tests sets for GTEST_SKIP; or not run: no executable, a failed fixture) or
disabled. --allowlist: tests/skip-allowlist.txt, one entry a line: a ctest name or an
fnmatch pattern, then its reason (required); '#' starts a comment line. --also: files whose
lines are printed after the list when they exist (the chaos run's summary). --check: exit 1
when a test outside the allowlist did not run, or when the junit file is missing (the tests
did not run at all). Without --check the exit status is 0. Either way a malformed junit file
or allowlist (an entry without a reason) exits 2, naming the file and line. The last line is
`skips: total=N not_run=N allowlisted=N outside=N`.
"""

import argparse
import fnmatch
import os
import sys
import xml.etree.ElementTree as ET


class InputError(Exception):
    """A file this script reads is malformed: the message names it (exit 2)."""


class NoResults(Exception):
    """ctest's junit file is missing: the tests did not run (exit 1 with --check)."""


def read_allowlist(path):
    """[(pattern, reason, 'file:line')] from the allowlist; an entry without a reason is an
    error naming its line."""
    entries = []
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise InputError("%s: cannot read the allowlist: %s" % (path, e.strerror))
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split(None, 1)
        if len(parts) < 2:
            raise InputError("%s:%d: entry %r has no reason; write the ctest name (or an "
                             "fnmatch pattern), then why it may not run" % (path, number, text))
        entries.append((parts[0], parts[1].strip(), "%s:%d" % (path, number)))
    return entries


def reason_of(case):
    """Why a testcase did not run, in one line: its "SKIP:" line, GoogleTest's skip message,
    ctest's own words (no executable, a failed fixture), or the end of its output."""
    out = case.findtext("system-out") or ""
    lines = [l.rstrip() for l in out.split("\n")]
    for l in lines:
        if l.startswith("SKIP:"):
            return l[len("SKIP:"):].strip()
    for i, l in enumerate(lines):  # GTEST_SKIP: "file:line: Skipped", the message, "[  SKIPPED ]"
        if l.endswith(": Skipped"):
            message = []
            for m in lines[i + 1:]:
                if m.startswith("[  SKIPPED ]") or m.startswith("[  "):
                    break
                if m.strip():
                    message.append(m.strip())
            if message:
                return " ".join(message)
    if case.get("status") == "disabled":
        return "ctest's DISABLED property"
    skipped = case.find("skipped")
    ctest_words = skipped.get("message", "") if skipped is not None else ""
    last = next((l.strip() for l in reversed(lines) if l.strip()), "")
    if not last:
        return ctest_words or "no reason given"
    if not ctest_words or ctest_words.lower() in last.lower():
        return last
    return "%s: %s" % (ctest_words, last)


def not_run(junit):
    """(number of testcases, [(name, kind, reason)]) of the junit file; kind is skipped, not
    run or disabled."""
    try:
        root = ET.parse(junit).getroot()
    except OSError as e:
        raise NoResults("%s: cannot read ctest's junit output (%s): the tests did not run"
                        % (junit, e.strerror))
    except ET.ParseError as e:
        raise InputError("%s: not a junit file: %s" % (junit, e))
    cases = root.iter("testcase")
    total = 0
    found = []
    for case in cases:
        total += 1
        status = case.get("status")
        if status in ("run", "fail"):
            continue
        if status == "disabled":
            kind = "disabled"
        elif status == "notrun":
            message = (case.find("skipped").get("message", "")
                       if case.find("skipped") is not None else "")
            kind = "skipped" if message.startswith("SKIP_") else "not run"
        else:
            raise InputError("%s: testcase %s has status %r (ctest writes run, fail, notrun "
                             "or disabled)" % (junit, case.get("name"), status))
        found.append((case.get("name"), kind, reason_of(case)))
    return total, sorted(found)


def allowed_by(name, entries):
    return next((e for e in entries if fnmatch.fnmatchcase(name, e[0])), None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", required=True)
    parser.add_argument("--allowlist")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--title", default="ctest")
    parser.add_argument("--also", action="append", default=[])
    a = parser.parse_args(argv)
    try:
        entries = read_allowlist(a.allowlist) if a.allowlist else []
        total, found = not_run(a.junit)
    except InputError as e:
        print("skips: %s" % e)
        return 2
    except NoResults as e:
        print("skips: %s" % e)
        print("skips: total=0 not_run=? allowlisted=? outside=?")
        return 1 if a.check else 0
    outside = []
    print("== %s: %d tests, %d skipped or not run%s" % (a.title, total, len(found),
                                                      ":" if found else ""))
    for name, kind, reason in found:
        entry = allowed_by(name, entries)
        if entry:
            note = "allowlisted (%s: %s)" % (entry[2], entry[1])
        else:
            note = "NOT in %s" % (a.allowlist or "an allowlist")
            outside.append(name)
        print("  %-8s %s: %s [%s]" % (kind, name, reason, note))
    for path in a.also:
        if os.path.exists(path):
            with open(path) as f:
                for line in f.read().splitlines():
                    print(line)
    if outside:
        print("== %s: %d outside the allowlist (%s): %s" % (
            a.title, len(outside), a.allowlist or "none given",
            ", ".join(outside[:20]) + (" ..." if len(outside) > 20 else "")))
        if a.check:
            print("== a test that did not run is not a pass: make it run, or add it to %s "
                  "with the reason" % (a.allowlist or "an allowlist"))
    print("skips: total=%d not_run=%d allowlisted=%d outside=%d" % (
        total, len(found), len(found) - len(outside), len(outside)))
    return 1 if a.check and outside else 0


if __name__ == "__main__":
    sys.exit(main())
