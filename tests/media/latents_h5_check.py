#!/usr/bin/python3
"""Independent reader for dlo's latents HDF5 files (lib/dlo/media/latents_h5.h), with h5py.

Run with Debian's /usr/bin/python3 and its python3-h5py (the project venv has no h5py).

  latents_h5_check.py check EXPECT.json
      Checks the file named in EXPECT.json: its datasets (names, float32, shapes, contiguous),
      attributes, the /_complete flags and names, and every complete dataset's values, which are
      computed here from (index, gen) by the formula below (the C++ tests write the same).
  latents_h5_check.py crash MPIEXEC BIN NP PARENT
      Runs BIN (tests/media/latents_h5_crash.cpp) under MPIEXEC -np NP: first a batch in which one
      rank kills itself (SIGKILL) after some writes, then checks with h5py what it left; then a
      resumed run that writes what is missing, and checks the whole file again.

EXPECT.json: {"path": FILE, "order": [names of /_complete in order],
              "datasets": {NAME: {"shape": [...], "attrs": {...}, "fingerprint": S,
                                  "complete": bool, "index": I, "gen": G}}}
Exit status 0 when everything matches; 1 with one line per mismatch.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np


def expected_values(index, gen, shape):
    """value(index, gen, e) for element e in C order; exact in float32 (all terms < 2^24, halves)."""
    n = int(np.prod(shape))
    e = np.arange(n, dtype=np.int64)
    sign = np.where(e % 2 == 1, -1.0, 1.0)
    v = sign * ((index + 1) * 1000 + gen * 100000) + (e % 997) * 0.5
    return v.astype(np.float32).reshape(shape)


def check(expect):
    errors = []
    with h5py.File(expect["path"], "r") as f:
        if int(f.attrs.get("dlo_latents_version", -1)) != 1:
            errors.append("root attribute dlo_latents_version is not 1")
        if not isinstance(f.attrs.get("layout"), str):
            errors.append("root attribute layout is not a string")
        flags_ds = f["_complete"]
        if flags_ds.dtype != np.uint8:
            errors.append(f"/_complete dtype {flags_ds.dtype}")
        names = [str(n) for n in flags_ds.attrs["names"]]
        flags = flags_ds[()]
        if names != expect["order"]:
            errors.append(f"/_complete names {names} != {expect['order']}")
        if len(flags) != len(names):
            errors.append(f"/_complete has {len(flags)} flags for {len(names)} names")
        done = dict(zip(names, (int(x) for x in flags)))
        if set(f.keys()) != set(expect["datasets"]) | {"_complete"}:
            errors.append(f"datasets {sorted(f.keys())} != {sorted(expect['datasets'])} + _complete")
        for name, want in expect["datasets"].items():
            if name not in f:
                continue
            ds = f[name]
            where = f"dataset {name!r}"
            if ds.dtype != np.dtype("<f4"):
                errors.append(f"{where}: dtype {ds.dtype}")
            if ds.shape != tuple(want["shape"]):
                errors.append(f"{where}: shape {ds.shape} != {tuple(want['shape'])}")
            if ds.chunks is not None or ds.compression is not None:
                errors.append(f"{where}: not contiguous and unfiltered")
            attrs = {k: ds.attrs[k] for k in ds.attrs}
            want_attrs = dict(want["attrs"], fingerprint=want["fingerprint"])
            if attrs != want_attrs:
                errors.append(f"{where}: attributes {attrs!r} != {want_attrs!r}")
            if done.get(name) != (1 if want["complete"] else 0):
                errors.append(f"{where}: flag {done.get(name)} != complete={want['complete']}")
            if want["complete"] and ds.shape == tuple(want["shape"]):
                got = ds[()]
                ref = expected_values(want["index"], want["gen"], want["shape"])
                if not np.array_equal(got, ref):
                    bad = int(np.sum(got != ref))
                    errors.append(f"{where}: {bad} of {ref.size} values differ from (index {want['index']}, gen {want['gen']})")
    return errors


def crash(mpiexec, binary, np_, parent):
    """What a batch killed mid-way leaves, then a resumed run (in a fresh folder under parent)."""
    folder = tempfile.mkdtemp(prefix="dlo-h5-crash-", dir=parent)
    try:
        return crash_in(mpiexec, binary, np_, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def crash_in(mpiexec, binary, np_, folder):
    path = os.path.join(folder, "crash.h5")
    env = dict(os.environ)
    run = lambda mode: subprocess.run([mpiexec, "-np", str(np_), binary, path, mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    # The entries of latents_h5_crash.cpp: 8 entries "e<i>", shape [1, 4, 3, 8, 8], gen 0.
    def expect(complete):
        return {"path": path, "order": [f"e{i}" for i in range(8)],
                "datasets": {f"e{i}": {"shape": [1, 4, 3, 8, 8], "attrs": {"parameters_json": json.dumps({"i": i})},
                                       "fingerprint": f"fp{i}", "complete": i in complete, "index": i, "gen": 0}
                             for i in range(8)}}
    errors = []
    r = run("crash")
    if r.returncode == 0:
        errors.append("the crash run exited 0 (a rank was meant to kill itself)")
    if not os.path.exists(path):
        return errors + [f"the crash run left no {path}:\n{r.stdout}"]
    left = [x for x in os.listdir(folder) if x != "crash.h5"]
    if left:
        errors.append(f"stray files after the crash: {left}")
    # Entries 0-3 were written before a barrier, entry 5 by the rank that then killed itself.
    errors += ["after the crash: " + e for e in check(expect({0, 1, 2, 3, 5}))]
    r = run("resume")
    if r.returncode != 0:
        errors.append(f"the resumed run failed (rc {r.returncode}):\n{r.stdout}")
    errors += ["after the resume: " + e for e in check(expect(set(range(8))))]
    return errors


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        with open(sys.argv[2]) as fh:
            errors = check(json.load(fh))
    elif len(sys.argv) == 6 and sys.argv[1] == "crash":
        errors = crash(*sys.argv[2:6])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print("MISMATCH:", e)
    if not errors:
        print("ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
