"""Repository pretraining (`flywheel train repo`): a LoRA adapter that learns one workspace's code.

    flywheel train repo --workspace ~/src/shop --model default [--recipe training/recipes/repo.toml]

Steps: read the workspace (training/repo_files.py: privacy, .gitignore, size limits, redaction,
the split by path) into RUN/data/ (`files.json` plus `split.json`, the split as recorded), run
the `repo` stage of the one training loop (training/trainer.py) from `--model`, score the result on
the held-out files (training/repo_eval.py), and add it to the model registry as a candidate with
its split, recipe and scores, so `--model registry:vN` and a running language server can use it.
Started from a registry version (`--model registry:REF`), the result names it as its parent and
the parent's score on the same held-out files is attached to it, so `flywheel models promote vN`
can gate the new version against it.

A sample is one training row of at most `seq_len + 1` tokens, in the inline-completion prompt's
own format, `chat_format.render_repo_fim` (the repository's name, a few other train files as
`<|file_sep|>PATH` context, then the current file):

    plain  (1 - fim_fraction)  the prompt is the header and the file's text before a line;
                               the model learns the next lines (left to right)
    fim    fim_fraction        a span of 1-8 lines is cut out of the file, starting at its first
                               line's start, after its indentation or after a word inside it
                               (where the editor asks for completions); the prompt is prefix
                               and suffix in fill-in-the-middle form; the model learns the span
                               and then `<|endoftext|>` (it must learn to stop)

Both are token-healed as the language server's prompts are (`chat_format.heal`): a prefix that
ends at a line start or in its indentation ends before that line break instead, and the trained
tokens begin with the break and the indentation, which is what the model writes when it is asked.

The result serves inline completions (the registry's completion lane, agent/registry.py), not
the agent: an adapter trained on code alone calls the agent's tools worse.

Loss is computed on the trained tokens: the continuation, or the middle and its end token; with
`train_context` also every code token of the prompt (the context files, the prefix and the
suffix, all train files), which gives a step several times more of the repository to learn from
at the same cost. Special tokens and the repository's name are never targets. Context files are
other *train* files (same folder first), never held-out ones, so the evaluation never sees its
answer.
`repo_context` is the share of `seq_len` those files may take; a row that still does not fit is
built again with smaller pieces. A sample is a pure function of (seed, rank, index), so a resumed
run sees the data it would have seen without the kill.

Resume and restarts: the run folder's data/ is written once (atomically) and reused by a resumed
run, so the split cannot change under a run; `--no-resume` reads the workspace again. Nothing
reaches the registry until the loop has finished and the final model is complete.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from agent.chat_format import EOS, PAD, SPECIAL_TOKENS, heal, render_repo_fim
from agent.files import atomic_write_text
from training.line_completion import WORD_BOUNDARY
from training.recipe import Recipe
from training.repo_files import RepoConfig, RepoError, RepoFile, RepoFiles, read_repo

CHARS_PER_TOKEN = 3.0  # a first guess for sizing pieces; rows are measured after tokenizing
MAX_FIM_LINES = 8


# --- the data folder -------------------------------------------------------------------------


def write_repo_data(files: RepoFiles, folder: Path) -> dict:
    """files.json (every kept file's text and side) and split.json (the manifest), atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"path": f.path, "split": "train", "text": f.text} for f in files.train]
    rows += [{"path": f.path, "split": "heldout", "text": f.text} for f in files.heldout]
    name = Path(files.root).name
    atomic_write_text(folder / "files.json", json.dumps({"repo": name, "files": rows}))
    manifest = {"repo": name, **files.manifest()}
    atomic_write_text(folder / "split.json", json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_repo_data(folder: str | Path) -> tuple[str, list[RepoFile], list[RepoFile]]:
    """(repository name, train files, held-out files) of a data folder from `write_repo_data`."""
    path = Path(folder, "files.json")
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RepoError(
            f"{path} cannot be read ({exc}): run `flywheel train repo` again with --no-resume"
        ) from exc
    train = [RepoFile(r["path"], r["text"]) for r in data["files"] if r["split"] == "train"]
    held = [RepoFile(r["path"], r["text"]) for r in data["files"] if r["split"] == "heldout"]
    return data["repo"], train, held


# --- samples ---------------------------------------------------------------------------------


def context_files(
    files: list[RepoFile], path: str, budget_chars: int, rng: np.random.Generator | None = None
) -> list[tuple[str, str]]:
    """Other train files as (path, text) within `budget_chars`: the current file's folder first,
    then the rest (in `rng`'s order, or by path); each cut to what is left of the budget."""
    folder = path.rpartition("/")[0]
    others = [f for f in files if f.path != path]
    order = list(rng.permutation(len(others))) if rng is not None else range(len(others))
    others = [others[i] for i in order]
    others.sort(key=lambda f: f.path.rpartition("/")[0] != folder)  # stable: same folder first
    out, left = [], budget_chars
    for f in others:
        if left < 64:
            break
        text = f.text[:left]
        out.append((f.path, text))
        left -= len(text) + len(f.path) + 2
    return out


def encode_sample(
    tokenizer, prompt: str, target: str, train_prompt: bool = False
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + target, and 1 on the trained positions: the target's tokens, and
    with `train_prompt` the prompt's code too (after its first line, the repository's name; no
    special token)."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    t = tokenizer(target, add_special_tokens=False)["input_ids"]
    keep = [0] * len(p)
    if train_prompt:
        special = set(tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS))
        head = len(
            tokenizer(prompt.split("\n", 1)[0] + "\n", add_special_tokens=False)["input_ids"]
        )
        keep = [int(i >= head and token not in special) for i, token in enumerate(p)]
    return p + t, keep + [1] * len(t)


def make_sample(
    tokenizer,
    repo: str,
    files: list[RepoFile],
    rng: np.random.Generator,
    seq_len: int,
    fim_fraction: float,
    context_share: float,
    train_prompt: bool = False,
) -> tuple[list[int], list[int]]:
    """One row (ids, trained mask) of at most seq_len + 1 tokens (see the module docstring)."""
    weights = np.array([len(f.text) for f in files], dtype=np.float64)
    file = files[int(rng.choice(len(files), p=weights / weights.sum()))]
    lines = file.text.splitlines(keepends=True)
    fim = rng.random() < fim_fraction and len(lines) >= 2
    at = int(rng.integers(0, len(lines)))
    span = int(rng.integers(1, MAX_FIM_LINES + 1))
    line = lines[at].rstrip("\n")
    indent = len(line) - len(line.lstrip(" \t"))
    stops = [0, indent] + [m.end() for m in WORD_BOUNDARY.finditer(line, indent)]
    cut = stops[int(rng.integers(0, len(stops)))] if fim else 0  # where the middle starts
    order_seed = int(rng.integers(0, 2**31))
    scale = 1.0
    for _ in range(6):
        budget = int(seq_len * CHARS_PER_TOKEN * scale)
        context = context_files(
            files, file.path, int(budget * context_share), np.random.default_rng(order_seed)
        )
        own = budget - sum(len(t) + len(p) for p, t in context)
        start = sum(len(x) for x in lines[:at]) + cut
        if fim:
            middle = "".join(lines[at : at + span])[cut:][: own // 2]
            prefix, healed = heal(file.text[max(0, start - own // 3) : start])
            suffix = file.text[start + len(middle) :][: own // 6]
            prompt = render_repo_fim(repo, context, file.path, prefix, suffix)
            ids, mask = encode_sample(tokenizer, prompt, healed + middle + EOS, train_prompt)
        else:
            prefix, healed = heal(file.text[max(0, start - own // 3) : start])
            target = healed + file.text[start : start + own - len(prefix) - len(healed)]
            prompt = render_repo_fim(repo, context, file.path, prefix, None)
            ids, mask = encode_sample(tokenizer, prompt, target, train_prompt)
        if len(ids) <= seq_len + 1:
            break
        scale *= 0.7 * (seq_len + 1) / len(ids)
    ids, mask = ids[: seq_len + 1], mask[: seq_len + 1]
    return ids, mask


def collate(rows: list[tuple[list[int], list[int]]], pad: int, device) -> dict:
    length = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)  # [batch, seq+1]
    mask = torch.zeros((len(rows), length), dtype=torch.bool)  # [batch, seq+1]
    for row, (tokens, keep) in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(keep)] = torch.tensor(keep, dtype=torch.bool)
    return {"ids": ids.to(device), "mask": mask.to(device), "tokens": int(mask.sum())}


def masked_loss(trunk, b: dict) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over the trained positions of a `collate` batch; the output layer
    runs only there."""
    ids = b["ids"]
    hidden = trunk.get_decoder()(input_ids=ids[:, :-1]).last_hidden_state  # [batch, seq, dim]
    trained = b["mask"][:, 1:]  # [batch, seq]
    if not bool(trained.any()):
        return hidden.sum() * 0.0, {"trained_tokens": 0}
    from training.stages import token_cross_entropy

    head = trunk.get_output_embeddings()
    loss = token_cross_entropy(head, hidden[trained], ids[:, 1:][trained])
    return loss, {"trained_tokens": int(trained.sum()), "tokens": int(ids[:, :-1].numel())}


class CodeRows:
    """Code rows of a repository data folder for the SFT stage's mix (`code_data`, `code_share`):
    `sample(rng)` gives the rows of one micro-batch from the train files, `heldout` a fixed set
    from the held-out files, for the held-out code loss beside the conversations' loss."""

    def __init__(self, recipe: Recipe, tokenizer):
        self.repo, self.train, heldout = read_repo_data(recipe.code_data)
        if not self.train or not heldout:
            raise RepoError(f"{recipe.code_data} needs train and held-out files")
        self.tokenizer = tokenizer
        self.seq_len = recipe.code_seq_len
        self.rows = max(1, recipe.batch_size * recipe.seq_len // recipe.code_seq_len)
        self.fim_fraction = recipe.fim_fraction
        self.context = recipe.repo_context
        rng = np.random.default_rng(recipe.seed)
        self.heldout = [self._row(heldout, rng) for _ in range(recipe.eval_batches * self.rows)]

    def _row(self, files: list[RepoFile], rng: np.random.Generator):
        return make_sample(
            self.tokenizer, self.repo, files, rng, self.seq_len, self.fim_fraction, self.context
        )

    def sample(self, rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
        return [self._row(self.train, rng) for _ in range(self.rows)]


def build_job(recipe: Recipe, device: torch.device, rank: int):
    """The `repo` stage for training/trainer.py: micro-batches of code rows."""
    from training.repo_eval import heldout_perplexity
    from training.stages import Job, _load_init, _rng

    repo, train, heldout = read_repo_data(recipe.data)
    if not train:
        raise RepoError(f"{recipe.data} has no train files: run `flywheel train repo` again")
    ckpt = _load_init(recipe, device)
    trunk, tokenizer = ckpt.trunk, ckpt.tokenizer
    pad = tokenizer.convert_tokens_to_ids(PAD)
    pad = pad if isinstance(pad, int) and pad >= 0 else 0

    def batch(index: int) -> dict:
        rng = _rng(recipe, rank, index)
        rows = [
            make_sample(
                tokenizer,
                repo,
                train,
                rng,
                recipe.seq_len,
                recipe.fim_fraction,
                recipe.repo_context,
                recipe.train_context,
            )
            for _ in range(recipe.batch_size)
        ]
        return collate(rows, pad, device)

    def evaluate() -> dict:
        trunk.eval()
        try:
            scores = heldout_perplexity(
                trunk,
                tokenizer,
                repo,
                train,
                heldout,
                recipe.seq_len,
                max_windows=recipe.eval_batches * recipe.batch_size,
                device=device,
            )
        finally:
            trunk.train()
        return {"eval_loss": scores["nll"], "eval_ppl": scores["ppl"]}

    job = Job(
        trunk,
        trunk,
        tokenizer,
        None,
        batch,
        lambda b: masked_loss(trunk, b),
        evaluate,
        ckpt.version,
    )
    job.summary = {
        "repo": repo,
        "train_files": len(train),
        "heldout_files": len(heldout),
        "split": str(Path(recipe.data, "split.json")),
    }
    return job


# --- the command ------------------------------------------------------------------------------


def prepare(recipe: Recipe, repo: RepoConfig, resume: bool, log: Callable[[str], None]) -> dict:
    """RUN/data for the run: reused when resuming a run that has checkpoints, else read anew."""
    data = Path(recipe.data)
    has_checkpoint = (Path(recipe.out) / "checkpoints" / "latest").exists()
    if resume and has_checkpoint and (data / "split.json").exists():
        manifest = json.loads((data / "split.json").read_text())
        log(f"resuming on the recorded split ({len(manifest['train'])} train files)")
        return manifest
    if data.exists():
        shutil.rmtree(data)
    files = read_repo(repo)
    manifest = write_repo_data(files, data)
    skipped = ", ".join(f"{k} {len(v)}" for k, v in manifest["skipped"].items()) or "none"
    log(
        f"{manifest['repo']}: {len(files.train)} train and {len(files.heldout)} held-out files; "
        f"skipped: {skipped}; secrets redacted in {files.redacted}"
    )
    return manifest


def train_repo(
    recipe: Recipe,
    repo: RepoConfig,
    registry_root: str | Path | None,
    *,
    resume: bool = True,
    progress: bool = False,
    log: Callable[[str], None] = print,
    evaluation=None,
    parent: str | None = None,
) -> dict:
    """Prepare, train, evaluate the parent and the result (`evaluation`, a RepoEvalConfig),
    register (with `parent`, the registry version `recipe.init` is, as its lineage); returns
    the summary."""
    from agent.registry import Registry
    from training.repo_eval import RepoEvalConfig, evaluate_repo
    from training.trainer import train

    manifest = prepare(recipe, repo, resume, log)
    model = train(recipe, resume=resume, progress=progress)
    ev = evaluation or RepoEvalConfig(seq_len=recipe.seq_len, device=recipe.device)
    before = evaluate_repo(recipe.init, recipe.data, ev)
    after = evaluate_repo(str(model), recipe.data, ev)
    summary = {
        "model": str(model),
        "split": manifest,
        "before": before,  # the parent's repo_eval result (a benchmark result)
        "after": after,
    }
    atomic_write_text(Path(recipe.out, "repo_eval.json"), json.dumps(after, indent=2) + "\n")
    if registry_root is not None:
        registry = Registry(registry_root)
        split = {k: v for k, v in manifest.items() if k not in ("train", "heldout")}
        vid = registry.add(
            model,
            parent=parent,
            data={"repo": split, "split_file": str(Path(recipe.data, "split.json"))},
            recipe=recipe.to_dict(),
            note=f"repository pretraining on {manifest['repo']}",
        )
        registry.attach_benchmark(vid, after)
        if parent is not None:  # the gate (`flywheel models promote`) compares the two on it
            registry.attach_benchmark(parent, before)
        summary["version"] = vid
    return summary
