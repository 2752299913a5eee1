#!/usr/bin/env python3
"""Benchmarks of the offload engine on the CPU (issue: offload engine). Not a test: prints numbers.

  overlap   per-pass time of layerwise and dlo vs resident, same threads, at 1 and 2 ranks
  guidance  bytes streamed and blocks acquired per denoising step with guidance vs without
  memory    peak memory (memory-cgroup peak, page cache included) of dlo vs the naive mode in
            which every rank reads the whole model into private memory (layerwise), at 4 ranks
  scale     a checkpoint larger than half of this machine's RAM, with dlo on 4 ranks
  storage   host bytes per rank, gathered bytes per pass and s/pass with the blocks' Linears stored
            in each --storage-dtype (bf16 compute), dlo at 2 ranks and resident at 1, as ratios to
            the first storage dtype, --repeats times (medians)
  lora      a LoRA of --lora-rank on every block Linear: s/pass with no LoRA, fused for the run
            (--fuse-lora) and unfused beside the shared weights (--lora), dlo at 2 ranks, bf16,
            --repeats times (medians, ratios to none within a repeat); the bytes gathered per pass
            (equal in all three), the adapters' bytes, and each rank's load and engine start (the
            fused LoRA's merge of its own rows happens while the engine packs the shards)

The engine's own cost per block transition is measured by build/bin/dlo-bench-engine.
Ratios are measured in one run of this script; the machine is shared and noisy.
  .venv/bin/python tools/bench/bench_offload.py --bin build/bin overlap guidance
  .venv/bin/python tools/bench/bench_offload.py --bin build/bin memory scale --work /var/tmp
  .venv/bin/python tools/bench/bench_offload.py --bin build/bin storage --layers 4 --storage-dtype bf16,fp8
  .venv/bin/python tools/bench/bench_offload.py --bin build/bin lora --layers 4 --lora-rank 32
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

import benchlib
import make_lora

# Not benchlib.env(): these figures were measured with shared memory's single copy (CMA) left on.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1", OMP_NUM_THREADS="1")
CGROUP_ROOT = "/sys/fs/cgroup/memory"


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, env=ENV, **kw)


def make(bin_dir, out, *flags):
    benchlib.make_model(bin_dir, out, "--components", "transformer", *flags)
    return benchlib.weight_bytes(os.path.join(out, "transformer"))


def inputs(path, frames, size, text_len, text_dim=4096, guidance=True):
    g = torch.Generator().manual_seed(0)
    t = {"hidden_states": torch.randn(1, 16, frames, size, size, generator=g), "timestep": torch.tensor([500]),
         "encoder_hidden_states": torch.randn(1, text_len, text_dim, generator=g)}
    if guidance:
        t["negative_encoder_hidden_states"] = torch.randn(1, text_len, text_dim, generator=g)
    save_file(t, path)


def evict(model_dir):
    """Drops the checkpoint's pages from the page cache, so each run starts cold and is charged fairly."""
    d = os.path.join(model_dir, "transformer")
    for f in os.listdir(d):
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def forward(bin_dir, np_, model, inp, offload, tmp, *extra, cgroup=False, dtype="fp32", inputs_flag=True):
    rep = os.path.join(tmp, f"r_{offload}_{np_}.json")
    cmd = ["mpirun", "-np", str(np_), os.path.join(bin_dir, "dlo-forward"), "--model", model, "--component",
           "transformer", *(["--inputs", inp] if inputs_flag else []), "--out", os.path.join(tmp, "o.safetensors"),
           "--offload", offload, "--threads", "1", "--dtype", dtype, "--report", rep, *extra]
    peak = None
    if cgroup:
        cg = os.path.join(CGROUP_ROOT, f"dlo-bench-{os.getpid()}")
        os.makedirs(cg, exist_ok=True)
        try:
            wrapped = ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *cmd]
            sh(wrapped, stderr=subprocess.DEVNULL)
            peak = int(open(os.path.join(cg, "memory.max_usage_in_bytes")).read())
        finally:
            try:
                open(os.path.join(cg, "memory.force_empty"), "w").write("0")
            except OSError:
                pass
            os.rmdir(cg)
    else:
        sh(cmd, stderr=subprocess.DEVNULL)
    return json.load(open(rep)), peak


def steady(report, rank=0):
    passes = [p for p in report["ranks"][rank]["per_pass"] if p["computed"]][1:]  # first pass warms up
    return statistics.median(p["wall_s"] for p in passes), statistics.median(p["exposed_transfer_s"] for p in passes)


def bench_overlap(a, tmp):
    model = os.path.join(tmp, "ov")
    size = make(a.bin, model, "--preset", "wan2.1-t2v-1.3b", "--layers", str(a.layers), "--dtype", "fp32")
    inp = os.path.join(tmp, "ov_in.safetensors")
    inputs(inp, a.frames, a.size, a.text_len, guidance=False)
    print(f"overlap: 1.3B shape cut to {a.layers} blocks, fp32 ({size / 2**30:.2f} GiB), latent 16x{a.frames}x{a.size}x{a.size}, "
          f"text {a.text_len}, 1 compute thread per rank, {a.passes} passes (first excluded)")
    for np_ in (1, 2):
        base = None
        for s in ("resident", "layerwise", "dlo"):
            r, _ = forward(a.bin, np_, model, inp, s, tmp, "--passes", str(a.passes))
            wall, exposed = steady(r)
            base = base or wall
            print(f"  {np_} rank(s) {s:9s}: {wall:.3f} s/pass, exposed transfer {exposed * 1e3:7.1f} ms/pass, "
                  f"ratio to resident {wall / base:.3f}")


def bench_guidance(a, tmp):
    """Bytes and blocks per denoising step (not per traversal: a runner that streamed the weights once
    per branch would double both), with guidance vs without."""
    model = os.path.join(tmp, "gd")
    make(a.bin, model, "--preset", "wan2.1-t2v-1.3b", "--layers", "4", "--dtype", "bf16")
    inp = os.path.join(tmp, "gd_in.safetensors")
    inputs(inp, 1, 4, 16)
    steps = 3
    out = {}
    for g in (False, True):
        r, _ = forward(a.bin, 2, model, inp, "dlo", tmp, "--passes", str(steps), *(["--guidance"] if g else []),
                       dtype="bf16")
        x = r["ranks"][0]
        out[g] = (x["bytes_streamed"] / steps, x["blocks_acquired"] / steps)  # per step (the cold start adds block 0 once)
    print(f"guidance: dlo, 2 ranks, 4 blocks, {steps} steps: per step {out[False][0]:.0f} bytes streamed and "
          f"{out[False][1]:.2f} blocks acquired without guidance, {out[True][0]:.0f} and {out[True][1]:.2f} with "
          f"(ratios {out[True][0] / out[False][0]:.3f}, {out[True][1] / out[False][1]:.3f})")


def bench_storage(a, tmp):
    """What fp8 storage saves in bytes and costs in time on the CPU (its cost there is the upcast at
    every block Linear's matmul). The model is bf16 on disk; compute is bf16."""
    model = os.path.join(tmp, "st")
    make(a.bin, model, "--preset", "wan2.1-t2v-1.3b", "--layers", str(a.layers), "--dtype", "bf16")
    inp = os.path.join(tmp, "st_in.safetensors")
    inputs(inp, a.frames, a.size, a.text_len, guidance=False)
    kinds = a.storage_dtype.split(",")
    runs = [(1, "resident"), (2, "dlo")]
    print(f"storage: 1.3B shape cut to {a.layers} blocks, bf16 on disk and in compute, latent 16x{a.frames}x{a.size}x{a.size}, "
          f"text {a.text_len}, 1 compute thread per rank, {a.passes} passes (first excluded), {a.repeats} repeats")
    seen = {}  # (ranks, offload, storage) -> [(host bytes per rank, gathered bytes per pass, s/pass)]
    for rep in range(a.repeats):
        for np_, offload in runs:
            for k in kinds:
                r, _ = forward(a.bin, np_, model, inp, offload, tmp, "--passes", str(a.passes), "--storage-dtype", k,
                               dtype="bf16")
                x = r["ranks"][0]
                seen.setdefault((np_, offload, k), []).append(
                    (x["host_bytes"], x["bytes_gathered"] / a.passes, steady(r)[0]))
    for np_, offload in runs:
        base = seen[(np_, offload, kinds[0])]
        for k in kinds:
            got = seen[(np_, offload, k)]
            med = [statistics.median(v[i] for v in got) for i in range(3)]
            ratio = [f"x{statistics.median(v[i] / b[i] for v, b in zip(got, base)):.3f}" if base[0][i] else "-"
                     for i in range(3)]
            extra = statistics.median(v[2] - b[2] for v, b in zip(got, base))
            print(f"  {np_} rank(s) {offload:8s} {k:4s}: host {med[0] / 2**20:8.1f} MiB/rank ({ratio[0]}), "
                  f"gathered {med[1] / 2**20:8.1f} MiB/pass ({ratio[1]}), {med[2]:.3f} s/pass ({ratio[2]}, "
                  f"{extra:+.3f} s; each repeat {', '.join(f'{v[2]:.3f}' for v in got)})")


def bench_lora(a, tmp):
    """What a LoRA costs per pass: fused for the run (nothing per pass; its merge at start) and unfused
    (x A^T B^T beside every adapted Linear, on every rank). The model is bf16 on disk and in compute."""
    model = os.path.join(tmp, "lo")
    make(a.bin, model, "--preset", "wan2.1-t2v-1.3b", "--layers", str(a.layers), "--dtype", "bf16")
    inp = os.path.join(tmp, "lo_in.safetensors")
    inputs(inp, a.frames, a.size, a.text_len, guidance=False)
    lora = os.path.join(tmp, "lo_lora.safetensors")
    make_lora.write_peft_lora(lora, model, a.lora_rank)
    cases = {"none": [], "fused": ["--fuse-lora", lora], "unfused": ["--lora", lora]}
    print(f"lora: 1.3B shape cut to {a.layers} blocks, bf16, a rank-{a.lora_rank} LoRA on the {len(make_lora.BLOCK_LINEARS)} "
          f"Linears of every block ({os.path.getsize(lora) / 2**20:.1f} MiB), dlo at 2 ranks, latent "
          f"16x{a.frames}x{a.size}x{a.size}, text {a.text_len}, 1 compute thread per rank, {a.passes} passes "
          f"(first excluded), {a.repeats} repeats")
    seen = {}
    for _ in range(a.repeats):
        for name, extra in cases.items():
            r, _ = forward(a.bin, 2, model, inp, "dlo", tmp, "--passes", str(a.passes), *extra, dtype="bf16")
            for x in r["ranks"]:
                seen.setdefault((name, x["rank"]), []).append(
                    (steady(r, x["rank"])[0], x["bytes_gathered"] / a.passes, x["adapter_bytes"], x["load_s"],
                     x["engine_start_s"]))
    for name in cases:
        for rank in (0, 1):
            got, base = seen[(name, rank)], seen[("none", rank)]
            med = [statistics.median(v[i] for v in got) for i in range(5)]
            ratio = statistics.median(v[0] / b[0] for v, b in zip(got, base))
            extra = statistics.median(v[0] - b[0] for v, b in zip(got, base))
            start = statistics.median(v[4] - b[4] for v, b in zip(got, base))
            print(f"  rank {rank} {name:8s}: {med[0]:.3f} s/pass (x{ratio:.3f}, {extra:+.3f} s; each repeat "
                  f"{', '.join(f'{v[0]:.3f}' for v in got)}), gathered {med[1] / 2**20:.1f} MiB/pass, adapters "
                  f"{med[2] / 2**20:.1f} MiB, load {med[3]:.3f} s, engine start {med[4]:.3f} s ({start:+.3f} s)")


def peak_rest(peak, x0, ranks):
    """The cgroup peak less each rank's constant part: two slots (host memory on the CPU) and the process."""
    slots, runtime = 2 * x0["slot_bytes"], x0["rss_kb_before_engine"] * 1024
    return slots, runtime, peak - ranks * (slots + runtime)


def bench_memory(a, tmp):
    # dlo: a >= 4 GB checkpoint (14B-shape blocks); naive: the same per-rank logic on a model small
    # enough that 4 private copies fit in this machine's RAM.
    runs = (("dlo", a.mem_layers, "dlo", ()), ("dlo --keep-page-cache", a.mem_layers, "dlo", ("--keep-page-cache",)),
            ("naive (layerwise: each rank holds the whole model)", 2, "layerwise", ()))
    for name, layers, offload, extra in runs:
        model = os.path.join(tmp, f"mem_{layers}")
        size = make(a.bin, model, "--preset", "wan2.1-t2v-14b", "--layers", str(layers), "--dtype", "bf16")
        inp = os.path.join(tmp, "mem_in.safetensors")
        inputs(inp, 1, 4, 8, guidance=False)
        evict(model)
        r, peak = forward(a.bin, 4, model, inp, offload, tmp, *extra, cgroup=True, dtype="bf16")
        pss = sum(x["pss_kb"] for x in r["ranks"]) * 1024
        x0 = r["ranks"][0]
        slots, runtime, rest = peak_rest(peak, x0, 4)
        print(f"memory: {name}: checkpoint {size / 2**30:.2f} GiB, 4 ranks: cgroup peak {peak / 2**30:.2f} GiB "
              f"= {peak / size:.2f} x model; minus 4 x (2 slots {slots / 2**30:.2f} GiB + process "
              f"{runtime / 2**30:.2f} GiB) = {rest / 2**30:.2f} GiB = {rest / size:.2f} x model; "
              f"sum of PSS at end {pss / 2**30:.2f} GiB; host bytes per rank {x0['host_bytes'] / 2**30:.2f} GiB")



def bench_pack(a, tmp):
    """An fp32 checkpoint (as diffusers publishes Wan2.2's) packed into bf16 shards: each rank reads
    and converts only its 1/N byte range and gives the pages back, so the peak stays near the bf16
    shards, not the fp32 file."""
    model = os.path.join(tmp, "pack")
    size = make(a.bin, model, "--preset", "wan2.1-t2v-14b", "--layers", str(a.pack_layers), "--dtype", "fp32")
    inp = os.path.join(tmp, "pk_in.safetensors")
    inputs(inp, 1, 4, 8, guidance=False)
    evict(model)
    r, peak = forward(a.bin, 2, model, inp, "dlo", tmp, cgroup=True, dtype="bf16")
    x0 = r["ranks"][0]
    shards = sum(x["host_bytes"] for x in r["ranks"])
    slots, runtime, rest = peak_rest(peak, x0, 2)
    print(f"pack: fp32 checkpoint {size / 2**30:.2f} GiB ({a.pack_layers} blocks of the 14B shape) into bf16 shards, "
          f"2 ranks, dlo: shards {shards / 2**30:.2f} GiB in all ({x0['host_bytes'] / 2**30:.2f} GiB per rank), "
          f"cgroup peak {peak / 2**30:.2f} GiB; minus 2 x (2 slots {slots / 2**30:.2f} GiB + process "
          f"{runtime / 2**30:.2f} GiB) = {rest / 2**30:.2f} GiB = {rest / shards:.2f} x the shards, "
          f"{rest / size:.2f} x the fp32 file; pack {x0['pack_s']:.1f} s")
    sh(["rm", "-rf", model])


def bench_scale(a, tmp):
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    model = os.path.join(tmp, "scale")
    size = make(a.bin, model, "--preset", "wan2.1-t2v-14b", "--layers", str(a.scale_layers), "--dtype", "bf16")
    inp = os.path.join(tmp, "sc_in.safetensors")
    inputs(inp, 1, 4, 8, guidance=False)
    evict(model)
    t0 = time.time()
    r, peak = forward(a.bin, 4, model, inp, "dlo", tmp, cgroup=True, dtype="bf16")
    print(f"scale: checkpoint {size / 2**30:.2f} GiB = {size / total:.2f} x RAM ({total / 2**30:.1f} GiB); dlo on 4 ranks "
          f"ran in {time.time() - t0:.0f} s, cgroup peak {peak / 2**30:.2f} GiB")
    sh(["rm", "-rf", model])


def main():
    ap = benchlib.parser(__doc__, json_out=False)
    ap.add_argument("what", nargs="+", choices=["overlap", "guidance", "memory", "scale", "pack", "storage", "lora"])
    ap.add_argument("--work", default=None)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--mem-layers", type=int, default=6, help="14B-shape blocks for the dlo memory run (6: 4.4 GiB)")
    ap.add_argument("--pack-layers", type=int, default=4, help="14B-shape blocks stored in fp32 for the pack run (4: 5.2 GiB)")
    ap.add_argument("--scale-layers", type=int, default=18, help="14B-shape blocks for the scale run (18: 12.2 GiB, just over half of 23.5 GiB)")
    ap.add_argument("--storage-dtype", default="bf16,fp8", help="storage: comma-separated --storage-dtype values, the first the baseline")
    ap.add_argument("--repeats", type=int, default=3, help="storage, lora: runs of each case (medians reported)")
    ap.add_argument("--lora-rank", type=int, default=32, help="lora: the LoRA's rank")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.work) as tmp:
        for w in a.what:
            globals()[f"bench_{w}"](a, tmp)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
