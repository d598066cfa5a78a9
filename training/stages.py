"""What each stage trains and on what: a `Job` per stage, run by the one loop in `loop.py`.

    pretrain      next-token loss on packed corpus windows of `seq_len`; a fresh trunk of
                  `model_size` (tokenizer from the corpus) or `init`. `lm_acc` and
                  `copy_acc` are the greedy accuracy on held-out text and on the same text
                  repeated 512 tokens later: a model that copies from its context (induction
                  heads) gets the repeat right far more often. An optional copy curriculum,
                  off in the starter's recipes: the first `copy_warmup_steps` run short rows
                  of random tokens that repeat their opening span, and a `copy_fraction` of
                  later rows repeat theirs (what it did: benchmarks/HISTORY.md).
    long_context  the same loss at a longer `seq_len`, after RoPE scaling (`rope_type`,
                  `rope_factor`, written into the trunk's config so `transformers` and vLLM load
                  it); held-out loss at `eval_seq_len` (default 4x the init model's context) is
                  measured before the change and after training (`long_loss_before/after`);
                  optionally on short windows with far-apart positions (`skip_positions`,
                  PoSE) and with facts to retrieve (`retrieval_fraction`, training/retrieval.py)
    sft           next-token loss on assistant tokens only: conversations rendered with the
                  tokenizer's chat template (`chat_format.render_chat`); a token counts when it
                  lies inside an assistant turn's body or is its closing `<|im_end|>` (the model
                  must learn to stop). Conversations longer than `seq_len` are cut at the end.
    mtp           self-distillation of the MTP heads: trunk frozen; head k at position i learns
                  the trunk's own distribution for token i+k+2, i.e. the trunk's logits at
                  position i+k+1, with KL(trunk || head); reports top-1 agreement per head (an
                  upper-bound proxy for speculative acceptance); with `draft_vocab` > 0, the
                  heads are saved with the most frequent corpus tokens as their draft
                  vocabulary (FR-Spec: drafting scores only those rows of the output layer)

A job's `batch(index)` is a pure function of (seed, rank, index), so a resumed run sees the
same data it would have seen without the interruption.

What it does not do: sequence packing for SFT (each conversation is one padded row), document-
masked attention, mixing datasets by weight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agent.chat_format import PAD, assistant_spans, render_chat
from training.data import PackedTokens
from training.recipe import Recipe
from training.retrieval import add_retrieval_rows


class StageError(ValueError):
    """A stage cannot start (missing data, wrong checkpoint); the message says what to do."""


@dataclass
class Job:
    model: nn.Module  # the module whose trainable parameters the optimizer updates
    trunk: nn.Module
    tokenizer: object
    heads: nn.Module | None
    batch: Callable[[int], dict]  # micro-batch index -> tensors on the device
    loss: Callable[[dict], tuple[torch.Tensor, dict]]  # batch -> (scalar loss, extra metrics)
    evaluate: Callable[[], dict]  # held-out metrics
    parent: str = ""  # version of the checkpoint this run started from
    summary: dict = field(default_factory=dict)  # stage facts for flywheel.json (before/after)


def build(recipe: Recipe, device: torch.device, rank: int = 0) -> Job:
    if recipe.stage == "repo":  # repository pretraining: training/repo_pretrain.py
        from training.repo_pretrain import build_job

        return build_job(recipe, device, rank)
    return {"pretrain": _pretrain, "long_context": _long_context, "sft": _sft, "mtp": _mtp}[
        recipe.stage
    ](recipe, device, rank)


def _rng(recipe: Recipe, rank: int, index: int) -> np.random.Generator:
    return np.random.default_rng([recipe.seed, rank, index])


def _load_init(recipe: Recipe, device: torch.device):
    """The init checkpoint, ready to train: with `lora_rank`, wrapped in a LoRA adapter (a new
    one on a whole checkpoint; the same one, trainable, when `init` is an adapter folder)."""
    from agent.model import Checkpoint, checkpoint_folder, is_adapter, load_checkpoint
    from training.adapters import attach_lora, load_adapter_for_training

    try:
        if recipe.lora_rank and is_adapter(checkpoint_folder(recipe.init)):
            folder = checkpoint_folder(recipe.init)
            trunk, tokenizer = load_adapter_for_training(folder, str(device))
            ckpt = Checkpoint(trunk, tokenizer, None, _version(folder), str(folder))
        else:
            ckpt = load_checkpoint(recipe.init, device=str(device))
            ckpt.trunk.requires_grad_(True)  # an adapter merged in by peft comes back frozen
            if recipe.lora_rank:
                ckpt.trunk = attach_lora(
                    ckpt.trunk,
                    ckpt.tokenizer,
                    recipe.lora_rank,
                    recipe.lora_alpha,
                    recipe.lora_dropout,
                    recipe.lora_targets,
                )
    except Exception as exc:
        raise StageError(f"cannot start {recipe.stage} from {recipe.init!r}: {exc}") from exc
    if recipe.activation_checkpointing:
        ckpt.trunk.gradient_checkpointing_enable({"use_reentrant": False})
    ckpt.trunk.train()
    return ckpt


def _version(folder: Path) -> str:
    from agent.model import checkpoint_version

    return checkpoint_version(folder)


# --- pretrain and long context ---------------------------------------------------------------


def lm_loss(
    trunk: nn.Module, window: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean next-token cross-entropy over a [batch, seq+1] window (at `positions` [batch, seq],
    default 0..seq-1)."""
    logits = trunk(input_ids=window[:, :-1], position_ids=positions).logits  # [batch, seq, vocab]
    return F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())


def heldout_loss(
    trunk: nn.Module,
    heldout: PackedTokens,
    seq_len: int,
    batches: int,
    batch_size: int,
    device: torch.device,
) -> float:
    starts = heldout.spread_starts(batches * batch_size, seq_len + 1)
    was_training = trunk.training
    trunk.eval()
    losses = []
    with torch.no_grad():
        for i in range(0, len(starts), batch_size):
            window = heldout.windows(starts[i : i + batch_size], seq_len + 1).to(device)
            losses.append(lm_loss(trunk, window).item())
    trunk.train(was_training)
    return float(np.mean(losses))


WARMUP_ROW = 64  # tokens per row during `copy_warmup_steps`


def copy_warmup_rows(pool: np.ndarray, rng: np.random.Generator, recipe: Recipe) -> torch.Tensor:
    """Short rows of random tokens, each its opening span repeated: [rows, WARMUP_ROW].

    The tokens are drawn uniformly from `pool` (the corpus's distinct tokens), so only copying
    predicts a repeat (a span of code, full of spaces and brackets, is ambiguous to match). As
    many tokens per step as a normal batch.
    """
    length = min(WARMUP_ROW, recipe.seq_len + 1)
    rows = max(1, recipe.batch_size * (recipe.seq_len + 1) // length)
    window = torch.from_numpy(rng.choice(pool, size=(rows, length)).astype(np.int64))
    return repeat_rows(window, rng, 1.0)


def repeat_rows(
    window: torch.Tensor, rng: np.random.Generator, fraction: float, min_span: int = 8
) -> torch.Tensor:
    """Rows chosen with probability `fraction` become their first s tokens tiled over the row.

    s is log-uniform in [min_span, length // 2]: mostly short spans repeated a short way back,
    and some long ones (a whole function copied).
    """
    length = window.shape[1]
    if fraction <= 0 or length < 2 * min_span:
        return window
    out = window.clone()
    low, high = np.log(min_span), np.log(length // 2 + 1)
    for row in np.flatnonzero(rng.random(window.shape[0]) < fraction):
        span = min(int(np.exp(rng.uniform(low, high))), length // 2)
        out[row] = window[row, :span].repeat(length // span + 1)[:length]
    return out


def copy_accuracy(trunk: nn.Module, heldout: PackedTokens, seq_len: int, rows: int, device) -> dict:
    """Greedy accuracy on held-out text (`lm_acc`) and on the same text repeated (`copy_acc`).

    Each row is a held-out span followed by itself; a model that copies from its context gets
    the repeat right far more often than the first reading.
    """
    half = (seq_len + 1) // 2
    window = heldout.windows(heldout.spread_starts(rows, half), half).to(device)
    ids = torch.cat([window, window], 1)  # [rows, 2 * half]
    was_training = trunk.training
    trunk.eval()
    with torch.no_grad():
        right = trunk(input_ids=ids[:, :-1]).logits.argmax(-1) == ids[:, 1:]  # [rows, 2 half - 1]
    trunk.train(was_training)
    return {
        "lm_acc": float(right[:, : half - 1].float().mean()),
        "copy_acc": float(right[:, half:].float().mean()),
    }


def _corpus_job(
    recipe: Recipe, device: torch.device, rank: int, trunk, tokenizer, parent: str
) -> Job:
    train = PackedTokens(recipe.data, "train")
    heldout = PackedTokens(recipe.data, "heldout")
    train.check_length(recipe.seq_len + 1)
    if len(tokenizer) > trunk.config.vocab_size:
        raise StageError(
            f"the corpus in {recipe.data!r} was tokenized with {len(tokenizer)} "
            f"tokens but the model has {trunk.config.vocab_size}: rebuild the "
            "corpus with the model's tokenizer (flywheel train data --tokenizer)"
        )

    # the corpus's distinct tokens, for the copy warm-up's random rows (once, not per step)
    pool = np.unique(train.tokens) if recipe.copy_warmup_steps else None

    def batch(index: int) -> dict:
        rng = _rng(recipe, rank, index)
        if index < recipe.copy_warmup_steps * recipe.grad_accum:
            return {"window": copy_warmup_rows(pool, rng, recipe).to(device)}
        starts = train.random_starts(rng, recipe.batch_size, recipe.seq_len + 1)
        window = repeat_rows(train.windows(starts, recipe.seq_len + 1), rng, recipe.copy_fraction)
        return {"window": window.to(device)}

    def loss(b: dict) -> tuple[torch.Tensor, dict]:
        return lm_loss(trunk, b["window"]), {}

    def evaluate() -> dict:
        return {
            "eval_loss": heldout_loss(
                trunk, heldout, recipe.seq_len, recipe.eval_batches, recipe.batch_size, device
            ),
            **copy_accuracy(trunk, heldout, recipe.seq_len, recipe.batch_size, device),
        }

    return Job(trunk, trunk, tokenizer, None, batch, loss, evaluate, parent)


def _pretrain(recipe: Recipe, device: torch.device, rank: int) -> Job:
    from transformers import AutoTokenizer

    from agent.model import build_trunk

    if recipe.init:
        ckpt = _load_init(recipe, device)
        trunk, tokenizer, parent = ckpt.trunk, ckpt.tokenizer, ckpt.version
    else:
        folder = Path(recipe.data, "tokenizer")
        if not folder.is_dir():
            raise StageError(
                f"{recipe.data!r} has no tokenizer/: build the corpus with "
                "`flywheel train data` first"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        trunk = build_trunk(
            recipe.model_size, len(tokenizer), recipe.seq_len, recipe.seed, recipe.family
        ).to(device)
        trunk.train()
        parent = ""
    trunk.config.max_position_embeddings = max(trunk.config.max_position_embeddings, recipe.seq_len)
    return _corpus_job(recipe, device, rank, trunk, tokenizer, parent)


def set_rope_scaling(trunk: nn.Module, rope_type: str, factor: float, max_positions: int) -> None:
    """Scale RoPE positions by `factor` in the config and rebuild the rotary embedding."""
    config = trunk.config
    original = config.max_position_embeddings
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.update(rope_type=rope_type, factor=float(factor))
    if rope_type == "yarn":
        params["original_max_position_embeddings"] = original
    config.rope_parameters = params
    config.max_position_embeddings = max_positions
    rotary_cls = type(trunk.model.rotary_emb)
    device = next(trunk.parameters()).device
    trunk.model.rotary_emb = rotary_cls(config=config).to(device)


def skipped_positions(
    rng: np.random.Generator, rows: int, seq_len: int, context: int
) -> torch.Tensor:
    """Position ids [rows, seq_len] that cover a longer context than the window (PoSE, Zhu et al.
    2023): each row is cut in two at a random point and its second chunk moved on by a random
    skip, so that windows of seq_len tokens teach the relative distances of up to `context`."""
    out = np.tile(np.arange(seq_len, dtype=np.int64), (rows, 1))
    for row in out:
        cut = int(rng.integers(1, seq_len))
        row[cut:] += int(rng.integers(0, context - seq_len + 1))
    return torch.from_numpy(out)


def _long_context(recipe: Recipe, device: torch.device, rank: int) -> Job:
    ckpt = _load_init(recipe, device)
    trunk = ckpt.trunk
    base = trunk.config.max_position_embeddings
    eval_len = recipe.eval_seq_len or 4 * base
    heldout = PackedTokens(recipe.data, "heldout")
    batch_size = max(1, recipe.batch_size * recipe.seq_len // eval_len)

    def long_loss() -> float:
        return heldout_loss(trunk, heldout, eval_len, recipe.eval_batches, batch_size, device)

    before = long_loss()
    context = recipe.context_length or max(recipe.seq_len, eval_len)
    set_rope_scaling(trunk, recipe.rope_type, recipe.rope_factor, context)
    job = _corpus_job(recipe, device, rank, trunk, ckpt.tokenizer, ckpt.version)
    skip = recipe.skip_positions and recipe.seq_len < context
    windows = job.batch

    def batch(index: int) -> dict:
        b = windows(index)
        rng = np.random.default_rng([recipe.seed, rank, index, 1])  # not the windows' own
        b["window"] = add_retrieval_rows(
            ckpt.tokenizer, b["window"], rng, recipe.retrieval_fraction
        )
        if skip:
            positions = skipped_positions(rng, len(b["window"]), recipe.seq_len, context)
            b["positions"] = positions.to(device)
        return b

    job.batch = batch
    job.loss = lambda b: (lm_loss(trunk, b["window"], b.get("positions")), {})
    short_eval = job.evaluate

    def evaluate() -> dict:
        return {**short_eval(), "eval_loss_long": long_loss()}

    job.evaluate = evaluate
    job.summary = {"base_context": base, "eval_seq_len": eval_len, "long_loss_before": before}
    return job


# --- SFT -------------------------------------------------------------------------------------


def encode_conversation(tokenizer, row: dict, max_len: int) -> tuple[list[int], list[int]]:
    """Token ids of a conversation, and 1 for each token the model must learn to write (what
    `chat_format.assistant_spans` marks: assistant turns and their closing `<|im_end|>`).

    An assistant message with `"weight": 0` (OpenAI's fine-tuning convention) is context only:
    a recovery trajectory's deliberate mistake is shown, never learned.
    """
    text = render_chat(tokenizer, row["messages"], row.get("tools"))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    weights = [m.get("weight", 1) for m in row["messages"] if m.get("role") == "assistant"]
    spans = assistant_spans(text)
    if not all(weights):
        if len(weights) != len(spans):
            raise StageError(
                f"conversation {row.get('task_id', '?')} weights its assistant turns, but the "
                "chat template does not render each as its own turn"
            )
        spans = [span for span, weight in zip(spans, weights, strict=True) if weight]
    mask, at = [], 0
    for start, end in enc["offset_mapping"]:
        while at < len(spans) and spans[at][1] <= start:
            at += 1
        inside = at < len(spans) and spans[at][0] <= start and end <= spans[at][1] and end > start
        mask.append(1 if inside else 0)
    return enc["input_ids"][:max_len], mask[:max_len]


def read_conversations(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        file = Path(path)
        if not file.exists():
            raise StageError(
                f"SFT data {path!r} does not exist; make it with `flywheel train "
                "tasks` or `flywheel telemetry export`"
            )
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise StageError(f"{path}:{number} is not JSON: {exc.msg}") from exc
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise StageError(f"{path}:{number} has no `messages` list")
            rows.append(row)
    if not rows:
        raise StageError(f"no conversations in {', '.join(paths)}")
    return rows


def shared_prefix_groups(
    encoded: list[tuple[list[int], list[int]]], key_len: int = 32, min_prefix: int = 64
) -> tuple[list[int], list[int]]:
    """Group conversations that open with the same tokens; returns (group of each, prefix of each group).

    Every agent trajectory starts with the same system prompt and tool schemas (~1,200 tokens);
    SFT runs that shared prefix once per micro-batch and lets every conversation of the batch
    attend to its cached keys and values, the same logits and gradients at about half the cost
    (tests/training/test_sft_prefix.py checks the equality). A group's prefix is the longest
    common prefix of its members that holds no trained token and leaves each member at least
    two tokens; below `min_prefix` tokens it is 0 (plain batches).
    """
    groups: dict[tuple[int, ...], int] = {}
    members: list[list[int]] = []
    group_of = []
    for index, (ids, _) in enumerate(encoded):
        key = tuple(ids[:key_len])
        if key not in groups:
            groups[key] = len(members)
            members.append([])
        members[groups[key]].append(index)
        group_of.append(groups[key])
    prefixes = []
    for indices in members:
        first_ids, _ = encoded[indices[0]]
        length = min(len(encoded[i][0]) for i in indices) - 2
        for i in indices[1:]:
            ids = encoded[i][0]
            n = 0
            while n < length and ids[n] == first_ids[n]:
                n += 1
            length = n
        for i in indices:  # the prefix and the first token after it are never trained on
            mask = encoded[i][1]
            trained = next((t for t, m in enumerate(mask) if m), len(mask))
            length = min(length, trained - 1)
        prefixes.append(length if length >= min_prefix else 0)
    return group_of, prefixes


LOGIT_CHUNK = 1024  # trained positions whose logits exist at once in `token_cross_entropy`


def token_cross_entropy(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of `head(hidden)` [n, vocab] against `targets` [n], a chunk of
    LOGIT_CHUNK positions at a time, each recomputed in the backward pass: with Qwen's 152k
    vocabulary, the float logits of 4k positions and their gradient would be 7 GB."""
    from torch.utils.checkpoint import checkpoint

    def chunk_loss(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(h).float(), t, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for i in range(0, len(targets), LOGIT_CHUNK):
        h, t = hidden[i : i + LOGIT_CHUNK], targets[i : i + LOGIT_CHUNK]
        total = total + checkpoint(chunk_loss, h, t, use_reentrant=False)
    return total / max(len(targets), 1)


def sft_loss(trunk: nn.Module, b: dict) -> tuple[torch.Tensor, dict]:
    """Cross-entropy on the assistant tokens of a batch from `collate_sft` (shared prefix or not).

    The output layer runs only where a token is trained (about a tenth of an agent trajectory):
    with a small model and an 8k vocabulary it is half of the compute per position.
    """
    ids = b["ids"]  # [batch, seq+1]: each row's tokens after the shared prefix
    body = trunk.get_decoder()
    if b["prefix"].numel():
        out = body(input_ids=b["prefix"][None], use_cache=True)  # [1, prefix]
        cache = getattr(out, "cache", None) or out.past_key_values
        cache.batch_repeat_interleave(ids.shape[0])
        hidden = body(input_ids=ids[:, :-1], cache=cache).last_hidden_state  # [batch, seq, dim]
    else:
        hidden = body(input_ids=ids[:, :-1]).last_hidden_state  # [batch, seq, dim]
    trained = b["mask"][:, 1:]  # [batch, seq]
    head = trunk.get_output_embeddings()
    return token_cross_entropy(head, hidden[trained], ids[:, 1:][trained]), {
        "assistant_tokens": int(trained.sum()),
        "tokens": b["tokens"],
    }


def collate_sft(
    examples: list[tuple[list[int], list[int]]], prefix: int, pad: int, device: torch.device
) -> dict:
    """Right-padded rows of each example after its first `prefix` tokens (shared by all)."""
    start = max(prefix - 1, 0)  # the last prefix token is each row's first input
    shared = torch.tensor(examples[0][0][:start], dtype=torch.long)  # [prefix - 1], cached
    length = max(len(ids) for ids, _ in examples) - start
    ids = torch.full((len(examples), length), pad, dtype=torch.long)  # [batch, seq+1]
    mask = torch.zeros((len(examples), length), dtype=torch.bool)  # [batch, seq+1]
    for row, (tokens, keep) in enumerate(examples):
        ids[row, : len(tokens) - start] = torch.tensor(tokens[start:])
        mask[row, : len(keep) - start] = torch.tensor(keep[start:], dtype=torch.bool)
    tokens = len(shared) + sum(len(t) - start - 1 for t, _ in examples)  # inputs the model runs
    return {
        "prefix": shared.to(device),
        "ids": ids.to(device),
        "mask": mask.to(device),
        "tokens": tokens,
    }


def _sft(recipe: Recipe, device: torch.device, rank: int) -> Job:
    ckpt = _load_init(recipe, device)
    trunk, tokenizer = ckpt.trunk, ckpt.tokenizer
    rows = read_conversations(recipe.sft_data)
    train = [r for r in rows if r.get("split") != "heldout"]
    heldout = [r for r in rows if r.get("split") == "heldout"]
    if not heldout:  # no split in the data: hold out every 20th conversation
        heldout = train[::20]
        train = [r for i, r in enumerate(train) if i % 20] or heldout
    encode = [encode_conversation(tokenizer, r, recipe.seq_len + 1) for r in train]
    encode_eval = [encode_conversation(tokenizer, r, recipe.seq_len + 1) for r in heldout]
    encode = [e for e in encode if sum(e[1]) > 0]
    encode_eval = [e for e in encode_eval if sum(e[1]) > 0]
    if not encode:
        raise StageError("no conversation has an assistant turn within seq_len tokens")
    pad = tokenizer.convert_tokens_to_ids(PAD)
    group_of, prefixes = shared_prefix_groups(encode)
    if not recipe.shared_prefix:
        prefixes = [0] * len(prefixes)
    members: dict[int, list[int]] = {}  # group -> its conversations, shortest first
    for index in sorted(range(len(encode)), key=lambda i: len(encode[i][0])):
        members.setdefault(group_of[index], []).append(index)
    rank_in_group = {index: r for group in members.values() for r, index in enumerate(group)}
    code = None
    if recipe.code_share:
        from training.repo_pretrain import CodeRows

        if not Path(recipe.code_data, "files.json").is_file():
            raise StageError(
                f"code_data {recipe.code_data!r} has no files.json: `flywheel train starter` "
                "writes it (OUT/code), or point code_data at a `flywheel train repo` run's data/"
            )
        code = CodeRows(recipe, tokenizer)

    def batch(index: int) -> dict:
        """An anchor drawn uniformly, and batch-mates of about its length from its group; or,
        with `code_share`, that share of micro-batches made of code rows."""
        rng = _rng(recipe, rank, index)
        if code is not None and rng.random() < recipe.code_share:
            return collate_sft(code.sample(rng), 0, pad, device)
        anchor = int(rng.integers(0, len(encode)))
        group = members[group_of[anchor]]
        width = 2 * recipe.batch_size  # neighbours by length: little padding
        low = max(0, min(rank_in_group[anchor] - width // 2, len(group) - width))
        pick = rng.choice(group[low : low + width], size=recipe.batch_size - 1)
        rows = [encode[anchor]] + [encode[i] for i in pick]
        return collate_sft(rows, prefixes[group_of[anchor]], pad, device)

    def loss(b: dict) -> tuple[torch.Tensor, dict]:
        return sft_loss(trunk, b)

    def mean_loss(rows: list[tuple[list[int], list[int]]], size: int) -> float:
        """Cross-entropy per trained token over `rows`, `size` rows a batch."""
        total, count = 0.0, 0
        for i in range(0, len(rows), size):
            b = collate_sft(rows[i : i + size], 0, pad, device)
            n = int(b["mask"][:, 1:].sum())
            if n:
                total += loss(b)[0].item() * n
                count += n
        return total / max(count, 1)

    def evaluate() -> dict:
        trunk.eval()
        with torch.no_grad():
            size = recipe.batch_size
            scores = {"eval_loss": mean_loss(encode_eval[: recipe.eval_batches * size], size)}
            if code is not None:
                scores["eval_code_loss"] = mean_loss(code.heldout, code.rows)
        trunk.train()
        return scores

    job = Job(trunk, trunk, tokenizer, None, batch, loss, evaluate, ckpt.version)
    job.summary = {
        "train_conversations": len(encode),
        "heldout_conversations": len(encode_eval),
        "shared_prefix_tokens": max(prefixes),
    }
    return job


# --- MTP self-distillation -------------------------------------------------------------------


def mtp_distillation(trunk: nn.Module, heads, ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Mean over heads of KL(trunk || head), with per-head KL and top-1 agreement.

    ids: [batch, seq]. Head k (0-based) at position i sees h_{k-1}[i] and token i+k+1 and
    predicts token i+k+2, whose trunk distribution is the trunk's output at position i+k+1.
    With seq = 6 and k = 1: positions i = 0..3, next_ids = ids[:, 2:6], teacher = logits[:, 2:6].

    With a draft vocabulary (`heads.draft_vocab`) both distributions are taken over those rows
    only, renormalised: the heads only ever draft from them, and scoring d rows instead of the
    whole vocabulary is most of a small model's head cost (the trunk's own output layer is
    skipped too: its final hidden state times the same rows is the teacher).
    """
    rows = heads.draft_rows()
    with torch.no_grad():
        if rows is None:
            out = trunk(input_ids=ids, output_hidden_states=True)
            teacher = out.logits.float()  # [batch, seq, vocab]
            hidden = out.hidden_states[-1]  # [batch, seq, hidden], after the final norm
        else:
            hidden = trunk.get_decoder()(input_ids=ids).last_hidden_state  # after the final norm
            teacher = nn.functional.linear(hidden, rows).float()  # [batch, seq, d]
    seq = ids.shape[1]
    losses, info = [], {}
    for k in range(len(heads.heads)):
        length = seq - k - 1
        if length < 1:
            break
        hidden = hidden[:, :length]
        positions = torch.arange(length, device=ids.device)[None].expand(ids.shape[0], -1)
        hidden = heads.forward_head(k, hidden, ids[:, k + 1 : k + 1 + length], positions)
        student = heads.logits(k, hidden, rows).float()  # [batch, length, vocab or d]
        target = teacher[:, k + 1 : k + 1 + length]
        kl = F.kl_div(
            F.log_softmax(student, -1).flatten(0, 1),
            F.log_softmax(target, -1).flatten(0, 1),
            log_target=True,
            reduction="batchmean",
        )
        losses.append(kl)
        info[f"kl_head{k}"] = kl.item()
        info[f"top1_head{k}"] = (student.argmax(-1) == target.argmax(-1)).float().mean().item()
    return torch.stack(losses).mean(), info


def _mtp(recipe: Recipe, device: torch.device, rank: int) -> Job:
    from agent.mtp import MTPConfig, MTPHeads, frequent_tokens

    ckpt = _load_init(recipe, device)
    trunk = ckpt.trunk
    trunk.eval()
    for p in trunk.parameters():
        p.requires_grad_(False)
    heads = ckpt.heads
    if heads is None or len(heads.heads) != recipe.mtp_depth:
        torch.manual_seed(recipe.seed)
        heads = MTPHeads(trunk, MTPConfig(depth=recipe.mtp_depth, family=recipe.family))
    heads.to(device).train()
    train = PackedTokens(recipe.data, "train")
    heldout = PackedTokens(recipe.data, "heldout")
    if recipe.draft_vocab:  # saved with the heads: the engine drafts over these ids only
        ids = frequent_tokens(train.tokens, trunk.config.vocab_size, recipe.draft_vocab)
        heads.draft_vocab = torch.tensor(ids, dtype=torch.long, device=device)

    def batch(index: int) -> dict:
        starts = train.random_starts(_rng(recipe, rank, index), recipe.batch_size, recipe.seq_len)
        return {"ids": train.windows(starts, recipe.seq_len).to(device)}

    def loss(b: dict) -> tuple[torch.Tensor, dict]:
        return mtp_distillation(trunk, heads, b["ids"])

    def evaluate() -> dict:
        starts = heldout.spread_starts(recipe.eval_batches * recipe.batch_size, recipe.seq_len)
        sums: dict[str, list[float]] = {}
        heads.eval()
        with torch.no_grad():
            for i in range(0, len(starts), recipe.batch_size):
                value, info = mtp_distillation(
                    trunk,
                    heads,
                    heldout.windows(starts[i : i + recipe.batch_size], recipe.seq_len).to(device),
                )
                for key, v in {"eval_loss": value.item(), **info}.items():
                    sums.setdefault(key if key == "eval_loss" else f"eval_{key}", []).append(v)
        heads.train()
        return {k: float(np.mean(v)) for k, v in sums.items()}

    return Job(heads, trunk, ckpt.tokenizer, heads, batch, loss, evaluate, ckpt.version)
