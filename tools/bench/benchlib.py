"""What the benchmarks in this folder share: the tools run as on this project's machines (mpirun
as root, more ranks than cores), a random-weight model folder made by dlo-checkpoint, a run timed
and stopped with its message when it fails, the medians and ranges quoted in docs/benchmarks.md,
and the result printed as JSON and written to --json. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

# mpirun as root on one node with more ranks than cores; shared memory without CMA (containers).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def parser(doc, json_out=True):
    """An argument parser with what every benchmark takes: --bin (the built tools' folder) and,
    with json_out, --json (a file the result is written to as well)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the built tools' folder, e.g. build/bin")
    if json_out:
        ap.add_argument("--json", help="write the result here too")
    return ap


def env(**extra):
    """This process's environment with MPI_ENV and `extra` (e.g. OMP_NUM_THREADS="1")."""
    return dict(os.environ, **MPI_ENV, **extra)


def run(cmd, ranks=None, mpirun_flags=(), environ=None, capture=False, timeout=None):
    """Runs cmd, under `mpirun -np ranks` when ranks is given, with env() unless `environ`; its
    output is discarded (returned with capture). A failure ends the benchmark with the command's
    exit code and the end of its stderr. Returns (wall seconds, stdout or None)."""
    full = (["mpirun", "-np", str(ranks), *mpirun_flags] if ranks else []) + [str(c) for c in cmd]
    t0 = time.perf_counter()
    p = subprocess.run(full, env=environ or env(), stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(full)}\nexit {p.returncode}: {p.stderr[-2000:]}")
    return wall, p.stdout if capture else None


def make_model(bin_dir, out, *flags):
    """A random-weight model folder `out` by `dlo-checkpoint make out FLAGS`, unless it is there."""
    if not os.path.exists(out):
        run([os.path.join(bin_dir, "dlo-checkpoint"), "make", out, *flags])
    return out


def weight_bytes(folder):
    """Bytes of the .safetensors files below a folder (a model or one of its components)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".safetensors"))


def load_json(path):
    with open(path) as f:
        return json.load(f)


def spread(values):
    """The median of several runs, their range and the runs, as docs/benchmarks.md quotes them."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def emit(result, path=None):
    """Prints the result as JSON and writes it to `path` (--json) when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
