#!/usr/bin/env python3
"""Several parity comparisons in one Python process: torch, diffusers and transformers are imported
once (~8 s of CPU a process on the 2-core CI machine) instead of once per comparison.

  parity_cases.py --bin DIR --case NAME SCRIPT ARGS... [--case NAME SCRIPT ARGS...]

Each case is one run of SCRIPT (a reference script of this folder) as `SCRIPT --bin DIR ARGS...`
would run it alone: its main(argv) gets those arguments, and its exit status is the case's verdict
(an exception or a SystemExit other than 0 is a failure too). Every case runs, whatever the ones
before it gave; each is announced by name, and the names of the failed ones end the output.
Exit 0 when every case passed, else 1.
"""
import importlib
import sys
import time
import traceback


def parse(argv):
    if len(argv) < 2 or argv[0] != "--bin":
        sys.exit("usage: parity_cases.py --bin DIR --case NAME SCRIPT ARGS... [--case NAME SCRIPT ARGS...]")
    bin_dir, cases = argv[1], []
    for a in argv[2:]:
        if a == "--case":
            cases.append([])
        elif not cases:
            sys.exit(f"parity_cases.py: '{a}' before the first --case")
        else:
            cases[-1].append(a)
    if not cases or any(len(c) < 2 or not c[1].endswith(".py") for c in cases):
        sys.exit("parity_cases.py: every --case needs a NAME and a SCRIPT.py")
    return bin_dir, cases


def run(script, argv):
    """SCRIPT's main(argv) as its own process would run it: its exit status (0 on success)."""
    try:
        rc = importlib.import_module(script[:-3]).main(argv)
    except SystemExit as e:
        rc = e.code
    except Exception:  # a failing comparison may raise (a subprocess's exit status, an assertion)
        traceback.print_exc()
        return 1
    if rc is None or rc == 0:
        return 0
    if not isinstance(rc, int):
        print(rc, file=sys.stderr)  # sys.exit("message"): its message, as the interpreter prints it
    return 1


def main(argv):
    sys.stdout.reconfigure(line_buffering=True)  # in order with the tools' own output
    bin_dir, cases = parse(argv)
    failed = []
    for i, (name, script, *args) in enumerate(cases, 1):
        print(f"=== case {i}/{len(cases)}: {name}  ({script} {' '.join(args)})")
        t0 = time.perf_counter()
        rc = run(script, ["--bin", bin_dir, *args])
        print(f"=== {'ok' if rc == 0 else 'FAILED'}: {name} ({time.perf_counter() - t0:.1f} s)")
        if rc != 0:
            failed.append(name)
    print(f"{len(cases) - len(failed)} of {len(cases)} cases passed" + "".join(f"\nFAILED: {n}" for n in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
