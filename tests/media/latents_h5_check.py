#!/usr/bin/python3
"""Independent reader for dlo's latents HDF5 files (lib/dlo/media/latents_h5.h), with h5py.

Run with Debian's /usr/bin/python3 and its python3-h5py (the project venv has no h5py).

  latents_h5_check.py check EXPECT.json
      Checks the file named in EXPECT.json (version 2): its datasets (names, float32, shapes,
      contiguous), attributes, one flag /_complete/NAME per dataset (a uint8 scalar, contiguous)
      and no other, and every complete dataset's values, which are computed here from (index, gen)
      by the formula below (the C++ tests write the same).
  latents_h5_check.py offsets FILE
      Prints {NAME: {"data": [OFFSET, BYTES], "flag": [OFFSET, BYTES]}} for every dataset of FILE:
      where HDF5 put the raw bytes of its data and of its flag.
  latents_h5_check.py write-v1 V1.json
      Writes a version-1 file as dlo's version 1 did (one table /_complete of uint8 flags, their
      names in its attribute "names"): V1.json is {"path": FILE, "table": [[NAME, FLAG], ...],
      "datasets": {NAME: {"shape", "attrs", "fingerprint", "index", "gen"}}}, every dataset written
      with the values of (index, gen).
  latents_h5_check.py crash MPIEXEC BIN NP PARENT
      Runs BIN (tests/media/latents_h5_crash.cpp) under MPIEXEC -np NP: first a batch in which one
      rank kills itself (SIGKILL) after some writes, then checks with h5py what it left; then a
      resumed run that writes what is missing, and checks the whole file again.

EXPECT.json: {"path": FILE,
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
        if int(f.attrs.get("dlo_latents_version", -1)) != 2:
            errors.append("root attribute dlo_latents_version is not 2")
        if "/_complete/NAME" not in str(f.attrs.get("layout")):
            errors.append(f"root attribute layout does not describe the flags: {f.attrs.get('layout')!r}")
        if not isinstance(f.get("_complete"), h5py.Group):
            return errors + ["/_complete is not a group"]
        for name, flag in f["_complete"].items():
            if not isinstance(flag, h5py.Dataset) or flag.dtype != np.uint8 or flag.shape != () or flag.chunks:
                errors.append(f"/_complete/{name} is not a contiguous uint8 scalar")
        # What the header tells a reader to write.
        done = {n: int(d[()]) for n, d in f["_complete"].items()}
        if set(done) != set(expect["datasets"]):
            errors.append(f"flags {sorted(done)} != datasets {sorted(expect['datasets'])}")
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


def offsets(path):
    out = {}
    with h5py.File(path, "r") as f:
        for name, ds in f.items():
            if name != "_complete":
                flag = f["_complete"].get(name)
                out[name] = {"data": [ds.id.get_offset(), ds.id.get_storage_size()],
                             "flag": [flag.id.get_offset(), flag.id.get_storage_size()] if flag else None}
    return out


def write_v1(spec):
    """A version-1 file, as dlo's version 1 wrote it (contiguous float32 datasets, the table)."""
    with h5py.File(spec["path"], "w") as f:
        f.attrs.create("dlo_latents_version", 1, dtype="<i4")
        f.attrs["layout"] = "version 1: /_complete[i] == 1 where /_complete.attrs['names'][i] is complete"
        for name, d in spec["datasets"].items():
            ds = f.create_dataset(name, data=expected_values(d["index"], d["gen"], d["shape"]), dtype="<f4")
            for k, v in dict(d["attrs"], fingerprint=d["fingerprint"]).items():
                ds.attrs[k] = v
        names = [n for n, _ in spec["table"]]
        table = f.create_dataset("_complete", data=np.array([v for _, v in spec["table"]], dtype=np.uint8))
        table.attrs.create("names", names, dtype=h5py.string_dtype())


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
        return {"path": path,
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
    elif len(sys.argv) == 3 and sys.argv[1] == "offsets":
        print(json.dumps(offsets(sys.argv[2])))
        return 0
    elif len(sys.argv) == 3 and sys.argv[1] == "write-v1":
        with open(sys.argv[2]) as fh:
            write_v1(json.load(fh))
        return 0
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
