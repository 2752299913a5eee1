#!/usr/bin/env bash
# Mutation check: does the suite fail when the code is wrong? Injects small, plausible bugs into
# the library one at a time (mutants in every layer: io, models, offload, dist, mpi, media,
# diffusion, config, pipeline, render, app), rebuilds, runs the CTest labels given (default:
# cpu|mpi, not parity: the cpu label alone must guard the arithmetic), and reports each mutant
# caught or missed.
#
#   tools/mutation_check.sh [--labels 'cpu|mpi'] [--tests REGEX] [--only 1,5,9] [--list] [--keep]
#   tools/mutation_check.sh --verify     # only check that every mutant's text occurs once (seconds; CI)
#
# Works on a copy of the committed tree (git archive HEAD) under $DLO_MUTATION_DIR (default: a
# fresh /tmp/dlo-mutation.XXXXXX), built with tools/setup.sh there (ccache makes that quick), so
# the worktree is never touched and no mutant can be committed. Each mutant is one exact string
# replacement that must match once (the script stops if the code has moved on: update the table
# below; `--verify`, a CTest test, says so in seconds). Fields are split at '|': write a '|' inside
# a string as \x7c. Prints a Markdown table; exit 0 when every mutant was caught, 1 otherwise.
# Time: ~1-2 min per mutant on 2 cores (one library file recompiled, tests relinked, ~60 s of tests).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LABELS='cpu|mpi'
TESTS=""   # --tests: only the tests whose names match (ctest -R), for a quick look at a few mutants
ONLY=""
LIST=0
KEEP=0
VERIFY=0
while (($#)); do
  case "$1" in
    --labels) LABELS=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --list) LIST=1; shift ;;
    --keep) KEEP=1; shift ;;
    --verify) VERIFY=1; shift ;;
    *) echo "usage: tools/mutation_check.sh [--labels 'cpu|mpi'] [--tests REGEX] [--only 1,5,9] [--list] [--keep] [--verify]" >&2; exit 2 ;;
  esac
done

# The mutants: id | file | what | old text | new text (Python string literals, evaluated).
MUTANTS=$(cat <<'EOF'
1|lib/dlo/offload/runner.cpp|guidance streams the weights once per branch (twice per step)|"    for (auto& s : states) {\n      s.h = wan_block_forward(bw, s, s.h, c);\n      token_rows_ += s.h.size(1);\n    }\n  }, pass);"|"    states[0].h = wan_block_forward(bw, states[0], states[0].h, c);\n  }, pass);\n  for (std::size_t k = 1; k < states.size(); ++k) traverse([&](std::int64_t, const std::vector<at::Tensor>& w) { states[k].h = wan_block_forward(WanBlockWeights::bind(w, c), states[k], states[k].h, c); }, pass);"
2|lib/dlo/offload/stack_plan.cpp|shard size: block bytes / N rounded down before the 256-byte round-up|"return round_up((block(i).bytes + n - 1) / n, kShardAlign);"|"return round_up(block(i).bytes / n, kShardAlign);"
3|lib/dlo/offload/engine.cpp|dlo: each rank's own shard placed at offset 0 instead of rank * shard|"p.slot_offset = sharded ? shard * static_cast<std::uint64_t>(rank) : 0;"|"p.slot_offset = 0;"
4|lib/dlo/offload/engine.cpp|layerwise: host copy of a block rounded down to 256 bytes|"total += sharded ? shard : align_up(bytes, kShardAlign);"|"total += sharded ? shard : bytes / kShardAlign * kShardAlign;"
5|lib/dlo/models/wan_transformer.cpp|RoPE: positions counted from 1 instead of 0|"freqs = at::outer(at::arange(max_len, f64), freqs);"|"freqs = at::outer(at::arange(1, max_len + 1, f64), freqs);"
6|lib/dlo/models/wan_transformer.cpp|RoPE: sign of the rotation's second component|"copy_(x1 * s + x2 * c);"|"copy_(x2 * c - x1 * s);"
7|lib/dlo/models/wan_transformer.cpp|block: feed-forward shift and scale swapped|"return {m[0], m[1], m[2], m[3], m[4], m[5]};"|"return {m[0], m[1], m[2], m[4], m[3], m[5]};"
8|lib/dlo/models/umt5.cpp|UMT5 relative position bucket: distance 0 counted as positive|"(relative_position > 0).to(at::kLong) * num_buckets;"|"(relative_position >= 0).to(at::kLong) * num_buckets;"
9|lib/dlo/models/wan_vae.cpp|VAE causal cache: a 1-frame chunk keeps the cache's first frame, not its last|"if (cache_x.size(2) < 2 && cache.frames.defined())\n    cache_x = at::cat({cache.frames.select(2, -1)"|"if (cache_x.size(2) < 2 && cache.frames.defined())\n    cache_x = at::cat({cache.frames.select(2, 0)"
10|lib/dlo/models/wan_vae.cpp|VAE temporal upsampler: no zero frame in the cache after the first chunk (Rep; equivalent: the conv pads that zero frame itself)|"if (cache_x.size(2) < 2 && cache.rep) cache_x = at::cat({at::zeros_like(cache_x), cache_x}, 2);"|""
11|lib/dlo/io/safetensors.cpp|safetensors: end offset checked against the file size, not the data section|"DLO_CHECK(end <= data_size, where,"|"DLO_CHECK(end <= data_start + data_size, where,"
12|lib/dlo/io/safetensors.cpp|safetensors: header length off by one|"DLO_CHECK(n <= size - 8, \"header length \""|"DLO_CHECK(n <= size - 7, \"header length \""
13|lib/dlo/models/wan_vae.cpp|VAE temporal upsampler: the two new frames of each input frame interleaved in the wrong order|"x = at::stack({x.select(1, 0), x.select(1, 1)}, 3);"|"x = at::stack({x.select(1, 1), x.select(1, 0)}, 3);"
14|lib/dlo/render/stages.cpp|guidance combined on the wrong base (cond + g (cond - uncond))|"noise = out[1] + guidance * (out[0] - out[1]);"|"noise = out[0] + guidance * (out[0] - out[1]);"
15|lib/dlo/render/stages.cpp|the transformer given another step's timestep (always the first step's)|"run.scheduler->timesteps()[i].to(x.device())"|"run.scheduler->timesteps()[0].to(x.device())"
16|lib/dlo/render/stages.cpp|the negative branch's context encoded from the positive prompt|"run.negative_context = text.encode(job.negative_prompt)"|"run.negative_context = text.encode(job.prompt)"
17|lib/dlo/pipeline/batch_plan.cpp|resume skips a job recorded ok whatever became of its output (gone, emptied, cut)|"if (ok_here && output_intact(j.output, it->second.output_bytes)) {"|"if (ok_here) {"
18|lib/dlo/config/job.cpp|a frame-deciding field (steps) left out of the fingerprint|"add({\"steps\", \"steps\", JobFieldType::kInteger, JobFieldEffect::kFrames,"|"add({\"steps\", \"steps\", JobFieldType::kInteger, JobFieldEffect::kNone,"
19|lib/dlo/config/job.cpp|frames checked as 4k instead of 4k+1|"if ((n - 1) % tf != 0) {"|"if (n % tf != 0) {"
20|lib/dlo/pipeline/manifest.cpp|precedence: defaults win over the command line|"for (const Fields* layer : {static_cast<const Fields*>(&raw[i].fields), &flags, &defaults,"|"for (const Fields* layer : {static_cast<const Fields*>(&raw[i].fields), &defaults, &flags,"
21|lib/dlo/pipeline/job_scheduler.cpp|scheduler: every job handed to rank 0, whoever asked|"if (reports[static_cast<std::size_t>(r)].wants_job) assign_next(r, d.assignments);"|"if (reports[static_cast<std::size_t>(r)].wants_job) assign_next(0, d.assignments);"
22|lib/dlo/pipeline/job_scheduler.cpp|scheduler: a rank asks for a job while a prepared one still waits|"  if (in.has_next) return false;\n"|""
23|lib/dlo/diffusion/flow_euler.cpp|flow-match Euler: the step taken backwards|"at::Tensor prev = x + dt * model_output;"|"at::Tensor prev = x - dt * model_output;"
24|lib/dlo/media/video_writer.cpp|FFV1: red and blue swapped in bgr0 (the lossless output no longer decodes to the frames)|"            d[4 * x] = s[3 * x + 2];\n            d[4 * x + 1] = s[3 * x + 1];\n            d[4 * x + 2] = s[3 * x];"|"            d[4 * x] = s[3 * x];\n            d[4 * x + 1] = s[3 * x + 1];\n            d[4 * x + 2] = s[3 * x + 2];"
25|lib/dlo/media/latents_h5.cpp|latents HDF5: after a flush a rank keeps the least complete view of each entry|"complete_[i] = std::max<unsigned char>(complete_[i],"|"complete_[i] = std::min<unsigned char>(complete_[i],"
26|lib/dlo/dist/nccl_comm.cpp|NCCL: a call still in progress taken for done|"  if (first != NcclResult::kInProgress) {\n    w.kind = NcclWait::kFailed;"|"  if (first == NcclResult::kInProgress) return w;\n  {\n    w.kind = NcclWait::kFailed;"
27|lib/dlo/dist/collective_mpi.cpp|MPI gather: shards laid out contiguously instead of every shard_bytes|"MPI_Type_create_resized(chunk, 0, static_cast<MPI_Aint>(shard_bytes), &strided);"|"MPI_Type_create_resized(chunk, 0, static_cast<MPI_Aint>(n), &strided);"
28|lib/dlo/mpi/mpi_world.cpp|check_all: an error on some ranks only is not seen|"if (allreduce_max(my_error.empty() ? 0 : 1, phase) == 0) return;"|"if (allreduce_min(my_error.empty() ? 0 : 1, phase) == 0) return;"
29|lib/dlo/common/checked.h|checked arithmetic wraps around instead of saturating|"return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;"|"__builtin_mul_overflow(a, b, &r);\n  return r;"
30|lib/dlo/app/tool.cpp|run_tool: one rank's error leaves the others waiting (no abort)|"  if (world.size() <= 1 \x7c\x7c shared_by_every_rank(e)) return;"|"  return;"
31|lib/dlo/render/generate.cpp|a transfer failure taken for the job's own failure (the job is failed, the rank goes on)|"    } catch (const BlockComputeError& e) {"|"    } catch (const std::exception& e) {"
32|lib/dlo/pipeline/batch_plan.cpp|resume skips a job whose output moved (the recorded place not compared)|"canonical_path(it->second.output) == canonical_path(j.output);"|"true;"
33|lib/dlo/common/folder_lock.cpp|a live holder of the output folder on this host taken for gone|"if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return true;"|"return true;"
34|lib/dlo/render/generate.cpp|the decode queue unbounded (a rank behind on its VAE still takes jobs)|"r.wants_job = asks && vae_keeps_up;"|"r.wants_job = asks;"
35|lib/dlo/pipeline/results.cpp|the fingerprint names where the video is (moved folders count as changed; MP4 bytes depend on the folder)|"  fields.erase(\"output\");\n"|""
36|lib/dlo/pipeline/manifest.cpp|a batch ignores the model folder's dlo_defaults.json (the demo model rendered at 480x832)|"&flags, &defaults,\n                                   static_cast<const Fields*>(&model_defaults)})"|"&flags, &defaults})"
37|lib/dlo/pipeline/job_scheduler.cpp|expert alignment off: every rank steps its current job whatever the other ranks' experts|"    if (pick >= 0)\n      chosen ="|"    if (false)\n      chosen ="
38|lib/dlo/render/held_jobs.cpp|a job started early replaces the current one instead of parking it (the current job lost)|"  parked_.push_back(std::move(current_));\n  current_ = std::move(next_);"|"  current_ = std::move(next_);"
39|lib/dlo/render/phase_groups.cpp|a group's decodes all on its first rank (the turns lost)|"ranks_[static_cast<std::size_t>(position % topo_.group_size)]"|"ranks_.front()"
40|lib/dlo/render/generate.cpp|a group's members do not prepare the jobs handed to the group|"        if (groups_.ours(a)) assign(a.job);"|"        if (groups_.ours(a) && groups_.leader()) assign(a.job);"
41|lib/dlo/pipeline/topology.cpp|the SP degree not checked against the attention heads|"    if (sp > l.heads)\n"|"    if (false)\n"
42|lib/dlo/render/stages.cpp|a CFG group computes both branches on every rank along the sequence (no CFG split; the frames stay right)|"  else if (job.guided() && groups.partners != nullptr)"|"  else if (false)"
43|lib/dlo/render/generate.cpp|a tail phase scheduled over the first phase's job positions (it renders the batch's first jobs again)|"    runnable_.assign(all_runnable_.begin() + ph.first, all_runnable_.begin() + ph.first + ph.count);"|"    runnable_.assign(all_runnable_.begin(), all_runnable_.begin() + ph.count);"
44|lib/dlo/pipeline/topology.cpp|a tail phase taken for any predicted gain, however small|"  double best = whole.predicted * (1 - kTailGain);"|"  double best = whole.predicted;"
45|lib/dlo/models/wan_transformer.cpp|sequence parallelism: RoPE from a shard's local positions instead of its tokens' global ones|"  r.rope_cos = s.rope_cos.narrow(1, offset, length);\n  r.rope_sin = s.rope_sin.narrow(1, offset, length);"|"  r.rope_cos = s.rope_cos.narrow(1, 0, length);\n  r.rope_sin = s.rope_sin.narrow(1, 0, length);"
46|lib/dlo/dist/sequence_exchange.cpp|sequence parallelism: the head groups put back in the wrong order after attention|"  return at::cat(from, 2);"|"  return at::cat(std::vector<at::Tensor>(from.rbegin(), from.rend()), 2);"
47|lib/dlo/offload/runner.cpp|CFG parallelism: the partners' exchange dropped (each partner takes its own prediction for both branches)|"  return gather_all(partners, out.at(0));"|"  return {out.at(0), out.at(0)};"
48|lib/dlo/render/phase_groups.cpp|the topology agreement compares nothing (ranks that disagree go on into the groups' collectives)|"std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n))"|"true"
49|lib/dlo/dist/collective_mpi.cpp|two-level gathers: the shards gathered across nodes put at the node's first rank's places (every rank with local index > 0 gets wrong bytes; nodes label)|"across_places_.push_back(n * k + rank_ % k);"|"across_places_.push_back(n * k);"
50|lib/dlo/dist/collective_mpi.cpp|two-level gathers never used across nodes (the flat gather sends each shard once per rank of a node; nodes label)|"    nodes_ = count;\n"|"    return;\n"
51|lib/dlo/render/generate.cpp|a failed job stays its rank's current job (the rank is out of the batch: it takes no other job)|"      held_.drop(slot, groups_.leader());\n      return;\n    }"|"      return;\n    }"
52|lib/dlo/render/held_jobs.cpp|a parked job reported on expert 0 whatever its step (resumed in a pass of the wrong expert)|"r.parked_expert[i] = parked_[i].run->expert();"|"r.parked_expert[i] = 0;"
53|tools/demo_world.py|N4: the demo's judge gives a still video a direction (no minimum travel: a still square counts as moving left)|"    if distance < MIN_TRAVEL:\n        direction = None\n"|""
54|lib/dlo/render/stages.cpp|two experts: a job without guidance_2 leaves the low-noise expert unguided (WanPipeline: guidance_2 = guidance)|"run.guidance_2 = job.guidance_2.value_or(job.guidance);"|"run.guidance_2 = job.guidance_2.value_or(1.0);"
55|lib/dlo/render/stages.cpp|two experts: a job's boundary_ratio ignored for the folder's|"const double ratio = job.boundary_ratio.value_or(model.boundary_ratio.value_or(0));"|"const double ratio = model.boundary_ratio.value_or(0);"
56|lib/dlo/pipeline/batch_plan.cpp|V1: a batch's impossible topology found only after its output folder and results.jsonl exist|"  if (problems.empty() && o.ranks > 0) {"|"  if (problems.empty() && o.ranks > 1 << 30) {"
57|lib/dlo/pipeline/batch_plan.cpp|V6: a recovered job's results line without its frames' hash|"  r.frames_sha256 = frames_sha256;\n"|""
58|lib/dlo/media/video_writer.cpp|V6: an MP4 loses the tags finish() adds (the frames' hash recovery reads)|"      for (const auto& [k, v] : late_tags) av_dict_set(&fmt->metadata, k.c_str(), v.c_str(), 0);"|"      for (const auto& [k, v] : late_tags) (void)k, (void)v;"
59|lib/dlo/app/generate_cli.cpp|N5: a second name (hard link) of a latents file in use gets round its lock|"st.st_nlink == 1, \"--save-latents: '\""|"st.st_nlink >= 1, \"--save-latents: '\""
60|lib/dlo/common/folder_lock.cpp|N1: the lock file read as a stream whatever it is (a FIFO blocks the open for ever, /dev/zero is read until memory runs out)|"const std::string held = read_lock(path_, &exists);"|"std::ifstream held_in(path_, std::ios::binary);\n    exists = static_cast<bool>(held_in);\n    const std::string held((std::istreambuf_iterator<char>(held_in)), std::istreambuf_iterator<char>());"
61|lib/dlo/common/folder_lock.cpp|V8: a holder in another PID namespace of this host judged by its pid here (its live lock taken over)|"  if (!h.pid_ns.empty() && !me.pid_ns.empty() && h.pid_ns != me.pid_ns) return age_s > kStaleAfterS;\n"|""
62|lib/dlo/app/generate_cli.cpp|N2: the latents file not locked (two batches write one file; one's flags are lost; mpi label)|"    latents_lock.emplace(path_folder(file)"|"    if (false) latents_lock.emplace(path_folder(file)"
63|lib/dlo/pipeline/batch_plan.cpp|N2: resume skips a done job whose latents entry is missing or unflagged|"      if (!latents_kept) return r.render.push_back(ji);"|""
64|lib/dlo/pipeline/batch_plan.cpp|V11: a job whose id names another job's complete latents renders and replaces them|"const bool latents_other = saved && saved->complete && saved->fingerprint != fingerprints[i];"|"const bool latents_other = false;"
65|lib/dlo/common/folder_lock.cpp|V16: a held lock never notices its folder removed (the batch denoises every remaining job)|"if (holds_text(path_.c_str(), text_.data(), text_.size())) return;"|"return;"
70|lib/dlo/text/tokenizer.cpp|with both spiece.model and tokenizer.json, spiece.model read again (WanPipeline reads tokenizer.json: other ids, other frames)|"const bool has_json = fs::exists(fs::symlink_status(json_path));"|"const bool has_json = fs::exists(fs::symlink_status(json_path)) && !fs::exists(model_path);"
71|lib/dlo/text/tokenizer.cpp|the unknown piece's score min_score - 11 instead of tokenizers' min_score - 10 (pieces holding characters that are not pieces segment otherwise)|"const double unk_score = min_score - 10.0;"|"const double unk_score = min_score - 11.0;"
72|lib/dlo/text/tokenizer.cpp|a tokenizer with one id more than the text encoder's embedding rows accepted|"DLO_CHECK(n <= encoder_vocab_size, impl_->source,"|"DLO_CHECK(n <= encoder_vocab_size + 1, impl_->source,"
73|lib/dlo/config/job.cpp|a key given twice in dlo_defaults.json accepted (the last value wins)|"if (!o.keys.insert(o.last).second && twice.insert(where).second)"|"if (false)"
74|lib/dlo/pipeline/manifest.cpp|guidance_2 beside guidance 1, both from dlo_defaults.json, blamed on the manifest's jobs|"const bool model_pair = s.kind == ManifestFieldSource::kModel && source(fe.beside).kind == ManifestFieldSource::kModel;"|"const bool model_pair = false;"
80|lib/dlo/models/wan_transformer.cpp|sequence parallelism: a share's cross-attention on its own queries (SDPA's query blocks follow the share: SP 3 on 105 tokens rounds differently from one rank)|"const bool whole = s.is_share();"|"const bool whole = false;"
81|lib/dlo/models/wan_transformer.cpp|sequence parallelism: a share's GELU on its own rows (ATen's scalar remainder falls elsewhere than in one rank's tensor)|"if (!s.is_share() \x7c\x7c !x.is_cpu()) return at::gelu(x, \"tanh\");"|"return at::gelu(x, \"tanh\");"
82|lib/dlo/pipeline/topology.h|topology: no floor on a rank's share of a job's tokens (shares of a few rows take another GEMM path)|"kMinShareTokens = 16;"|"kMinShareTokens = 1;"
90|lib/dlo/media/latents_h5.cpp|latents HDF5: a rewrite leaves the entry's flag up while its data change (a cut-off rewrite reads as complete)|"    set_flag(0);\n"|""
91|lib/dlo/media/latents_h5.cpp|latents HDF5: an entry's flag set before its data are written (a cut-off first write reads as complete)|"    set_flag(0);\n"|"    set_flag(1);\n"
92|lib/dlo/media/latents_h5.cpp|latents HDF5: converting a version-1 file drops its table's flags of the data kept|"if (version == 1) step[\"flag\"] = table.count(e.name) ? table[e.name] : 0;"|""
93|lib/dlo/media/latents_h5.cpp|latents HDF5: an open re-creates (clears) the flags of entries whose data it keeps|"if (flag >= 0) step[\"flag\"] = flag, step[\"renew\"] = false, step[\"drop\"] = false;"|""
95|lib/dlo/models/wan_vae.cpp|Wan2.2 residual decoder: DupUp3D's 2x2 pixels regrouped transposed (height and width of each pixel block swapped)|"permute({0, 1, 5, 2, 6, 3, 7, 4})"|"permute({0, 1, 5, 2, 6, 4, 7, 3})"
96|lib/dlo/models/wan_vae.cpp|Wan2.2 residual decoder: DupUp3D's channels tiled (repeat) instead of interleaved (repeat_interleave)|"at::Tensor x = in.repeat_interleave(w.shortcut_repeats, 1);"|"at::Tensor x = in.repeat({1, w.shortcut_repeats, 1, 1, 1});"
97|lib/dlo/models/wan_vae.cpp|Wan2.2 VAE: the 2x2 unpatchify with the patch's rows and columns swapped|"permute({0, 1, 4, 5, 3, 6, 2})"|"permute({0, 1, 4, 5, 2, 6, 3})"
98|tools/demo_world.py|the demo's judge takes a frame far from the background everywhere (all black) for an object: its shape counts|"        if m.sum() < 4 or m.sum() > MAX_OBJECT_AREA * height * width:\n"|"        if m.sum() < 4:\n"
100|lib/dlo/config/wan_tensor_names.cpp|tensor names: the original norm3 (the cross-attention's pre-norm) read as diffusers' norm2 kept as norm2|"{\"norm3\", \"norm2\"},"|"{\"norm2\", \"norm2\"},"
101|lib/dlo/config/wan_tensor_names.cpp|tensor names: a wrong row (self-attention's output projection mapped to the cross-attention's)|"{\"self_attn.o\", \"attn1.to_out.0\", true},"|"{\"self_attn.o\", \"attn2.to_out.0\", true},"
102|lib/dlo/config/wan_tensor_names.cpp|tensor names: ComfyUI's 'model.diffusion_model.' prefix not stripped|"const std::string_view bare = std::string_view(n).substr(l.prefix.size());"|"const std::string_view bare = std::string_view(n);"
103|lib/dlo/config/wan_tensor_names.cpp|a single file's names left as stored (the table never applied)|"  ck.rename_tensors([&](const std::string& n) { return renamed.at(n); });\n"|""
104|lib/dlo/config/wan_transformer_config.cpp|config from shapes: out_channels taken as proj_out's rows (not divided by the patch)|"c.out_channels = out / per_token;"|"c.out_channels = out;"
105|lib/dlo/config/wan_transformer_config.cpp|config from shapes: num_layers one short (the highest block index, not + 1)|"std::atoll(name.c_str() + 7) + 1);"|"std::atoll(name.c_str() + 7));"
106|lib/dlo/config/wan_transformer_config.cpp|config from shapes: in_channels not compared with the folder's (a file of another expert or model accepted)|"DLO_CHECK(shown[k].second == theirs[k].second,"|"DLO_CHECK(k == 0 \x7c\x7c shown[k].second == theirs[k].second,"
107|lib/dlo/config/wan_transformer_config.cpp|config from shapes: in_channels read from the width|"c.in_channels = patch[1];"|"c.in_channels = patch[0];"
108|lib/dlo/config/model_info.cpp|the model identity (so the fingerprint) ignores a transformer given as a file (the folder's transformer/ counted instead)|"      if (!given.empty()) {\n        add_given(part, given);"|"      if (false) {\n        add_given(part, given);"
109|lib/dlo/config/model_info.h|--transformer-2 ignored (the folder's transformer_2/ rendered instead)|"return transformer_2.empty() ? folder(\"transformer_2\") : transformer_2;"|"return folder(\"transformer_2\");"
110|lib/dlo/models/wan_transformer.cpp|fp8 storage: the second FFN layer left out of the layerwise-cast set|"\"attn2.add_k_proj\", \"attn2.add_v_proj\", \"ffn.net.0.proj\", \"ffn.net.2\"};"|"\"attn2.add_k_proj\", \"attn2.add_v_proj\", \"ffn.net.0.proj\"};"
111|lib/dlo/models/wan_transformer.cpp|fp8 storage: kept weights rounded straight to fp8, not through the compute dtype as diffusers loads them|"return as_dtype(as_dtype(t, via(name)), to);"|"return as_dtype(t, to);"
112|lib/dlo/offload/stack_plan.cpp|fp8 storage: packed blocks rounded straight to fp8 (the via dtype ignored)|"return (from.scalar_type() == via \x7c\x7c via == to ? from : from.to(via)).to(to);"|"return from.to(to);"
113|lib/dlo/models/wan_transformer.cpp|fp8 storage: auto picks fp8 for a bf16/fp32 file (changes the frames unasked)|"case LinearStorage::kAuto: return file ? *file : compute;"|"case LinearStorage::kAuto: return file ? *file : at::kFloat8_e4m3fn;"
114|lib/dlo/models/wan_transformer.cpp|fp8 storage: an e5m2 file re-rounded to e4m3fn (rounded twice)|"case LinearStorage::kFp8: return file ? *file : at::kFloat8_e4m3fn;"|"case LinearStorage::kFp8: return at::kFloat8_e4m3fn;"
115|lib/dlo/models/wan_transformer.cpp|fp8 storage: a storage wider than the compute dtype accepted|"DLO_CHECK(bytes <= c10::elementSize(compute), what"|"DLO_CHECK(true, what"
116|lib/dlo/offload/memory_model.cpp|fp8 storage: the memory model counts the Linears at the compute dtype|"return sat_mul(numel, c10::elementSize(dtypes.stored(spec.name)));"|"return sat_mul(numel, c10::elementSize(wan_weight_dtype(spec.name, dtypes.compute)));"
117|lib/dlo/render/generate.cpp|fp8 storage: the job fingerprint ignores the storage (a batch rendered at fp8 resumed as done at bf16)|"return str(compute_dtype_name(o.dtype), storage, \"/\""|"return str(compute_dtype_name(o.dtype), \"/\""
118|lib/dlo/models/wan_transformer.cpp|scaled fp8: the block Linears' scale not applied|"scale.defined() ? as_dtype(w, dt) * scale.to(dt) : as_dtype(w, dt);"|"as_dtype(w, dt);"
119|lib/dlo/models/wan_transformer.cpp|scaled fp8: the Linears outside the blocks not dequantised at load|"t = t * m.store_.get(scale).to(t.scalar_type());"|"t = t;"
120|lib/dlo/models/wan_transformer.cpp|scaled fp8: a block Linear without its scale accepted|"DLO_CHECK(unscaled.empty(), \"'\""|"DLO_CHECK(true, \"'\""
121|lib/dlo/pipeline/batch_plan.cpp|storage_dtype: the manifest's key left out of the fingerprint|"dtypes = o.dtypes_with(m.storage_dtype);"|"dtypes = o.dtypes_with(\"\");"
122|lib/dlo/models/wan_convert.cpp|convert: tensors written as read (no storage applied)|"specs.push_back({t.name, from_scalar_type(r.dtypes.stored(t.name)), t.shape});"|"specs.push_back({t.name, t.dtype, t.shape});"
130|lib/dlo/config/wan_vae_names.cpp|vae names: a residual block's first norm and conv swapped|"kResnet[] = {{\"residual.0\", \"norm1\"}, {\"residual.2\", \"conv1\"},"|"kResnet[] = {{\"residual.0\", \"conv1\"}, {\"residual.2\", \"norm1\"},"
131|lib/dlo/config/wan_vae_names.cpp|vae names: the Wan2.1 decoder's flat list read as num_res_blocks + 1 per stage (the upsampler forgotten)|"j = *i % (nrb + 2);\n      i = *i / (nrb + 2);"|"j = *i % (nrb + 1);\n      i = *i / (nrb + 1);"
132|lib/dlo/config/wan_vae_names.cpp|vae names: the Wan2.2 encoder's resampler looked for one slot late|"if (*j == nrb) return joined(stage + \"downsampler.\""|"if (*j == nrb + 1) return joined(stage + \"downsampler.\""
133|lib/dlo/config/wan_vae_names.cpp|vae names: the original conv1 / conv2 read as post_quant_conv / quant_conv|"{\"conv1\", \"quant_conv\", {}},\n    {\"conv2\", \"post_quant_conv\", {}},"|"{\"conv1\", \"post_quant_conv\", {}},\n    {\"conv2\", \"quant_conv\", {}},"
134|lib/dlo/config/wan_vae_names.cpp|vae layout: an original Wan2.2 VAE detected as Wan2.1's|"holds_prefix(names, \"encoder.downsamples.0.downsamples.0.\")"|"holds_prefix(names, \"decoder.upsamples.0.downsamples.0.\")"
135|lib/dlo/config/wan_vae_names.cpp|vae layout: num_res_blocks one too many (the decoder's first stage counted whole)|"l.num_res_blocks = n - 1;"|"l.num_res_blocks = n;"
136|lib/dlo/config/wan_vae_names.cpp|a VAE file's names left as stored (the table never applied)|"  ck.rename_tensors([&](const std::string& n) { return renamed.at(n); });\n"|""
137|lib/dlo/config/wan_vae_config.cpp|vae config from shapes: z_dim not compared with the folder's (a Wan2.1 VAE for a Wan2.2 model passes this check)|"DLO_CHECK(shown[k].second == theirs[k].second,"|"DLO_CHECK(k == 0 \x7c\x7c shown[k].second == theirs[k].second,"
138|lib/dlo/config/model_info.h|--vae ignored (the folder's vae/ decodes instead)|"return vae_file.empty() ? vae() : vae_file;"|"return vae();"
139|lib/dlo/config/model_info.cpp|the model identity (so the fingerprint) ignores a VAE given as a file|"std::strcmp(part, \"vae\") == 0           ? parts.vae_file"|"std::strcmp(part, \"vae\") == 1           ? parts.vae_file"
170|lib/dlo/models/wan_lora.cpp|LoRA alpha: the power-of-two split stops one step late (down and up no longer diffusers')|"while (down * 2 < up) {"|"while (down < up) {"
171|lib/dlo/models/wan_lora.cpp|LoRA alpha: baked into down only (up left as stored)|"mod.up = up * su;"|"mod.up = up.clone();"
172|lib/dlo/config/wan_tensor_names.cpp|LoRA names: the image key projection not a Linear (an I2V LoRA's k_img refused)|"{\"cross_attn.k_img\", \"attn2.add_k_proj\", true},"|"{\"cross_attn.k_img\", \"attn2.add_k_proj\"},"
173|lib/dlo/config/wan_tensor_names.cpp|LoRA names: musubi modules read as the original names, not diffusers'|"return \"blocks.\" + std::string(index) + \".\" + r.diffusers;"|"return \"blocks.\" + std::string(index) + \".\" + r.original;"
174|lib/dlo/models/wan_lora.cpp|LoRA refusal: down and up of different ranks accepted|"down.dim() == 2 && up.dim() == 2 && down.size(0) == up.size(1)"|"down.dim() == 2 && up.dim() == 2"
175|lib/dlo/models/wan_lora.cpp|LoRA refusal: an alpha outside the blocks' Linears accepted (diffusers raises)|"DLO_CHECK(block \x7c\x7c x.alpha.empty(),"|"DLO_CHECK(true,"
176|lib/dlo/models/wan_lora.cpp|LoRA refusal: a DoRA file's dora_scale not refused as DoRA|"DLO_CHECK(!has(k, \"dora_scale\") && !has(k, \"lora_magnitude_vector\"),"|"DLO_CHECK(!has(k, \"lora_magnitude_vector\"),"
177|lib/dlo/models/wan_lora.cpp|LoRA scaling: metadata's use_rslora ignored (alpha / r instead of alpha / sqrt(r))|"mod.scaling = rslora ? am / std::sqrt(rm) : am / rm;"|"mod.scaling = am / rm;"
178|lib/dlo/models/wan_lora.cpp|check_wan_lora: a down of another in-features accepted|"mod.down.size(1) == in && mod.up.size(0) == out"|"mod.up.size(0) == out"
179|lib/dlo/models/wan_lora.cpp|LoRA metadata without lora_bias: the biases kept (PEFT does not load them)|"if (!flag(\"lora_bias\"))"|"if (false)"
180|lib/dlo/models/wan_lora_fuse.cpp|fused LoRA: up x down multiplied in the bf16 base dtype (PEFT's CPU merge computes it in fp32)|"const bool in_fp32 = base == at::kBFloat16 \x7c\x7c base == at::kHalf;"|"const bool in_fp32 = false;"
181|lib/dlo/models/wan_lora_fuse.cpp|fused LoRA: every rank merges the first rows of up, not its own|"up = p.module->up.narrow(0, first_row, n)"|"up = p.module->up.narrow(0, 0, n)"
182|lib/dlo/models/wan_lora_fuse.cpp|fused LoRA: the strength and scaling not applied to the weight|"at::mm(up, down).mul(p.scaling)"|"at::mm(up, down)"
183|lib/dlo/models/wan_lora_fuse.cpp|fused LoRA: a diff_b not merged into the bias|"if (m.bias.defined()) by_tensor_"|"if (false) by_tensor_"
184|lib/dlo/offload/stack_plan.cpp|fused LoRA: a rank's packed range skips the merge (only the resident path merges)|"    if (t.edits) {"|"    if (false) {"
185|lib/dlo/config/model_info.cpp|fused LoRA: the model identity (so the fingerprint) ignores the fused LoRAs|"add_named(lora_spec_text(tag), l.path);"|"(void)tag;"
186|lib/dlo/config/model_info.cpp|fused LoRA: high=/low= on a one-transformer model accepted (the LoRA then fuses nowhere)|"DLO_CHECK(l.expert < 0 \x7c\x7c index.transformer_2,"|"DLO_CHECK(true,"
187|lib/dlo/models/wan_transformer.cpp|fused LoRA: the non-block Linears (proj_out, time_proj, ...) loaded without the merge|"m.dtypes_.keep(name, m.store_.get(name, shape), m.edits_.get())"|"m.dtypes_.keep(name, m.store_.get(name, shape))"
188|lib/dlo/offload/runner.cpp|fused LoRA: the streamed blocks packed without the merge|"from_scalar_type(d.via(full)), model.edits());"|"from_scalar_type(d.via(full)));"
189|lib/dlo/models/wan_transformer.cpp|per-job LoRA: the adapters never applied (the shared weights alone)|"  if (!adapters) return y;"|"  if (true) return y;"
200|lib/dlo/offload/runner.cpp|per-job LoRA: an SP group's forward drops the job's adapters|"full.push_back(model_.begin(b.hidden_states, b.timestep, b.encoder_hidden_states, b.adapters));"|"full.push_back(model_.begin(b.hidden_states, b.timestep, b.encoder_hidden_states));"
201|lib/dlo/pipeline/results.cpp|per-job LoRA: the fingerprint ignores the LoRA files' content|"  if (!job.loras.empty()) {\n    ojson files"|"  if (false) {\n    ojson files"
202|lib/dlo/config/job.cpp|per-job LoRA: a missing file not refused before the batch starts|"            check_regular_file(l.path);"|"            (void)l;"
203|lib/dlo/offload/memory_model.cpp|per-job LoRA: a held (prepared, parked) job's adapters not counted|"  m.held = sat_add(m.held, adapters);\n"|"\n"
204|lib/dlo/offload/memory_model.cpp|per-job LoRA: a job whose LoRAs do not fit the model not refused by the plan|"    if (!adapters.empty()) problems[i] = adapters[i].problem;"|"    (void)adapters;"
205|lib/dlo/models/wan_lora_fuse.cpp|per-job LoRA: the plan counts the fp32-kept modules' adapters at the compute dtype's size|"c10::elementSize(wan_weight_dtype(module + \".weight\", compute))"|"c10::elementSize(compute)"
206|lib/dlo/render/generate.cpp|per-job LoRA: the batch's memory plan made without the jobs' adapters|"o.vae_dtype, adapters);"|"o.vae_dtype);"
220|lib/dlo/common/rgb_image.cpp|image resize: always the horizontal pass first (Pillow 13 runs the vertical one first when the height shrinks much more)|"const bool vertical_first = height < image.height && image.height - height > 2 * (image.width - width);"|"const bool vertical_first = false;"
221|lib/dlo/common/rgb_image.cpp|image resize: the horizontal pass truncates instead of rounding|"        std::int64_t ss = std::int64_t{1} << (kPrecisionBits - 1);\n        for (int x = 0;"|"        std::int64_t ss = 0;\n        for (int x = 0;"
222|lib/dlo/common/rgb_image.cpp|EXIF orientation 6 turned anticlockwise|"case 6: sx = y, sy = H - 1 - x; break;"|"case 6: sx = W - 1 - y, sy = x; break;"
223|lib/dlo/media/image_reader.cpp|a JPEG's EXIF segment not found (APP2 looked for)|"if (marker == 0xE1 && body.substr(0, 6) == exif_header)"|"if (marker == 0xE2 && body.substr(0, 6) == exif_header)"
224|lib/dlo/common/rgb_image.cpp|image fit: crop fits inside like pad (bars instead of cutting)|"const bool match_width = fit == ImageFit::kCrop ? wider : !wider;"|"const bool match_width = !wider;"
190|lib/dlo/diffusion/flow_euler.cpp|schedule lightx2v: the sigmas not shifted|"sigmas = at::div(at::mul(s, shift), at::add(at::mul(s, shift - 1.0), 1));"|"sigmas = s;"
191|lib/dlo/diffusion/flow_euler.cpp|schedule lightx2v: the grid ends at 0 instead of 1/steps (linspace(N, 0, steps))|"numpy_linspace(nd, 0.0, steps + 1).slice(0, 0, steps)"|"numpy_linspace(nd, 0.0, steps)"
192|lib/dlo/config/noise_scheduler_config.cpp|schedule lightx2v leaves a UniPC folder on unipc|"&& !new_kind) new_kind = NoiseSchedulerKind::kFlowEuler;"|"&& false) new_kind = NoiseSchedulerKind::kFlowEuler;"
193|lib/dlo/config/noise_scheduler_config.cpp|a schedule beside unipc passes the scheduler's own check|"DLO_CHECK(schedule == NoiseSchedule::kDefault \x7c\x7c kind == NoiseSchedulerKind::kFlowEuler"|"DLO_CHECK(true"
194|lib/dlo/config/job.cpp|the schedule left out of the fingerprint and the metadata|"if (j.schedule.value_or(NoiseSchedule::kDefault) == NoiseSchedule::kDefault) return std::nullopt;"|"return std::nullopt;"
195|lib/dlo/config/job.cpp|schedule lightx2v beside scheduler unipc not refused at the job|"*job.schedule != NoiseSchedule::kDefault && job.scheduler == NoiseSchedulerKind::kUniPC"|"false"
196|lib/dlo/config/job.cpp|the job's schedule not passed to its noise scheduler|"with_overrides(job.scheduler, job.flow_shift, job.schedule)"|"with_overrides(job.scheduler, job.flow_shift)"
210|lib/dlo/models/wan_vae.cpp|VAE encode: frame 0 not split off (chunks of 4 from frame 0)|"i == 0 ? x.slice(2, 0, 1) : x.slice(2, 1 + 4 * (i - 1), 1 + 4 * i)"|"x.slice(2, 4 * i, 4 * i + 4)"
211|lib/dlo/models/wan_vae.cpp|VAE encode: a temporal downsampler's cache not carried on (chunk 0's frame kept)|"      x = at::conv3d(at::cat({cache.frames.slice(2, -1), x}, 2), w.time_conv.w, w.time_conv.b, {2, 1, 1});\n      cache.frames = cache_x;"|"      x = at::conv3d(at::cat({cache.frames.slice(2, -1), x}, 2), w.time_conv.w, w.time_conv.b, {2, 1, 1});"
212|lib/dlo/models/wan_vae.cpp|VAE encode: the posterior's logvar half returned instead of its mean|"return enc.narrow(1, 0, config_.z_dim).contiguous();"|"return enc.narrow(1, config_.z_dim, config_.z_dim).contiguous();"
213|lib/dlo/models/wan_vae.cpp|VAE encode (Wan2.2): patchify packs the row offset before the column offset|"permute({0, 1, 6, 4, 2, 3, 5})"|"permute({0, 1, 4, 6, 2, 3, 5})"
214|lib/dlo/models/wan_vae.cpp|VAE encode (Wan2.2): the last stage (no downsampler) adds no shortcut of its input|"          db.shortcut = true;\n          db.shortcut_out = c.base_dim"|"          db.shortcut = down;\n          db.shortcut_out = c.base_dim"
215|lib/dlo/models/wan_vae.cpp|VAE encode: the downsamplers zero-pad left and top instead of right and bottom|"at::conv2d(at::pad(x, {0, 1, 0, 1})"|"at::conv2d(at::pad(x, {1, 0, 1, 0})"
216|lib/dlo/models/wan_vae.cpp|VAE normalize: the mean subtracted after the scaling|"return (latents - m) * inv_std;"|"return latents * inv_std - m;"
217|lib/dlo/models/wan_vae.cpp|VAE encode: quant_conv left out|"const at::Tensor enc = wan_causal_conv3d(out.size() == 1 ? out[0] : at::cat(out, 2), enc_.quant_conv, {0, 0, 0});"|"const at::Tensor enc = out.size() == 1 ? out[0] : at::cat(out, 2);"
218|lib/dlo/config/wan_vae_config.cpp|VAE encode memory: the CPU conv3d's column buffer left out|"const std::int64_t columns = in * 27 * t * h * w;"|"const std::int64_t columns = 0;"
219|lib/dlo/models/wan_vae.h|VAE: a decoder-only load builds and runs the encoder too (text to video pays its memory)|"bool has_encoder() const { return parts_ != WanVaeParts::kDecoder; }"|"bool has_encoder() const { return true; }"
EOF
)

if ((LIST)); then
  echo "$MUTANTS" | cut -d'|' -f1-3 | tr '|' '\t'
  exit 0
fi

if ((VERIFY)); then
  # Every mutant must still name code that exists, once: a table that has drifted from the code
  # would silently test nothing.
  MUTANTS="$MUTANTS" python3 - "$ROOT" <<'PY'
import ast, os, sys
root, bad, n = sys.argv[1], 0, 0
for line in os.environ["MUTANTS"].splitlines():
    if not line.strip():
        continue
    mid, path, what, old, new = line.split("|", 4)
    n += 1
    old, new = ast.literal_eval(old), ast.literal_eval(new)
    try:
        count = open(os.path.join(root, path)).read().count(old)
    except OSError as e:
        count = f"unreadable ({e})"
    if count != 1 or old == new:
        bad += 1
        print(f"mutant {mid} ({path}: {what}): its text occurs {count} times (want exactly 1)")
print(f"{n} mutants, {n - bad} match the code exactly once")
sys.exit(1 if bad else 0)
PY
  exit $?
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
WORK=${DLO_MUTATION_DIR:-$(mktemp -d /tmp/dlo-mutation.XXXXXX)}
SRC=$WORK/src
LOGS=$WORK/logs
mkdir -p "$SRC" "$LOGS"
((KEEP)) || trap 'rm -rf "$SRC/build"' EXIT
echo "mutation check: copy of $(git -C "$ROOT" rev-parse --short HEAD) in $SRC, labels '$LABELS', logs in $LOGS"
git -C "$ROOT" archive HEAD | tar -x -C "$SRC"
(cd "$SRC" && tools/setup.sh --all >"$LOGS/setup.log" 2>&1) || { tail -30 "$LOGS/setup.log"; exit 1; }

run_tests() {  # $1: log file; returns ctest's status
  # Not the test of this table (every mutant changes its text, so it would "catch" every one).
  ctest --test-dir "$SRC/build" -L "$LABELS" ${TESTS:+-R "$TESTS"} -E '^mutation check: ' -j2 --timeout 240 >"$1" 2>&1 </dev/null  # mpirun reads stdin
}
echo "baseline (no mutant): building and running..."
if ! run_tests "$LOGS/baseline.log"; then
  echo "the unmutated tree fails its own tests; see $LOGS/baseline.log"; tail -20 "$LOGS/baseline.log"; exit 1
fi
echo "baseline: $(grep -E 'tests passed' "$LOGS/baseline.log")"

apply() {  # $1 file $2 old $3 new (Python literals); exits 3 unless old matches exactly once
  python3 - "$1" "$2" "$3" <<'PY'
import ast, sys
path, old, new = sys.argv[1], ast.literal_eval(sys.argv[2]), ast.literal_eval(sys.argv[3])
text = open(path).read()
n = text.count(old)
if n != 1:
    print(f"{path}: the mutant's text occurs {n} times (want 1); update tools/mutation_check.sh", file=sys.stderr)
    sys.exit(3)
open(path, "w").write(text.replace(old, new))
PY
}

echo
echo "| # | where | mutant | result | first failing tests |"
echo "|---|---|---|---|---|"
missed=0
while IFS='|' read -r -u 3 id file what old new; do
  [ -n "$id" ] || continue
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$id,"* ]]; then continue; fi
  cp "$SRC/$file" "$WORK/orig"
  apply "$SRC/$file" "$old" "$new" || exit 1
  log="$LOGS/mutant_$id.log"
  if ! cmake --build "$SRC/build" >"$log" 2>&1 </dev/null; then
    result="build fails (not a test result)"
    failing=""
  elif run_tests "$log.ctest"; then
    result="**MISSED**"
    failing=""
    missed=$((missed + 1))
  else
    result="caught"
    failing=$(grep -E '^\s+[0-9]+ - ' "$log.ctest" | sed -E 's/^\s+[0-9]+ - //; s/ \([^()]*\)$//' | head -3 | paste -sd';' -)
    failing="$failing ($(grep -cE '^\s+[0-9]+ - ' "$log.ctest") failed)"
  fi
  cp "$WORK/orig" "$SRC/$file"  # revert
  echo "| $id | \`$file\` | $what | $result | $failing |"
done 3<<<"$MUTANTS"
# Leave the copy's build matching its sources again (a --keep rerun starts clean).
cmake --build "$SRC/build" >/dev/null 2>&1 || true
echo
echo "missed: $missed"
((missed == 0))
