"""Completion RL from accepted and rejected suggestions (`flywheel train tab`), Cursor Tab's method.

    flywheel train tab --data runs/repo/data --model registry:v3 [--recipe training/recipes/tab.toml]
    flywheel train tab --telemetry-db ~/.local/share/flywheel/telemetry.db --model registry:v3

A policy gradient (Dr. GRPO, training/rl/grpo.py, and the RL trainer's `Policy` update,
training/rl/policy.py) on suggestion outcomes, rewarded by the versioned `tab` reward
(telemetry/rewards.py `tab@2`: accepted or kept -> its share, up to +1; shown and rejected ->
-0.25; declined -> 0; an output that cannot be shown at the cursor -> -0.25), weighted by the
recipe's `[rewards]` table like every RL stage.

Two sources of outcomes, one scoring path (telemetry/acceptance.py):

    simulated  the simulated user (training/simulated_user.py) on the *train* files of a repository
               split (`--data`, RUN/data of `flywheel train repo`): per step `tasks_per_step`
               cursors, at each `group_size` completions sampled at `temperature`, each judged
               against what the author wrote. The group's mean reward is the baseline (group
               advantages); a group whose rewards are all equal carries no signal and is skipped.
    logged     real suggestions from a telemetry database (`--telemetry-db`): each with a known
               outcome is one sample, its prompt rebuilt from the stored context in the
               repository-level FIM format. A logged suggestion has no siblings at its cursor, so
               the baseline is the mean reward of the step's logged samples (a batch baseline),
               and since the sampling log-probabilities were not stored, each is treated as
               on-policy (importance weight 1): REINFORCE with a batch baseline.

Given both, each update holds both kinds; a database without such suggestions leaves the
simulated user alone (the cycle's completion lane passes its database every time).

The update is the agent RL stage's own (full-parameter, AdamW, clipped), on prompts of at most
`--seq-len` tokens (the simulated user's `UserConfig.seq_len`) plus `max_tokens` sampled ones.
The simulated user replays the train files, never the held-out ones, so the repository's held-out
evaluation (training/repo_eval.py) still judges code no stage saw.

Declining: a sampled completion whose first token is `<|endoftext|>` shows nothing and earns 0.
Where the other samples at a cursor are mostly rejected (-0.25), silence is above the group's
mean and gets more likely; where they are accepted, it falls below and gets less likely. An
output that does not continue the cursor's line (it skips the line break a healed prompt leaves
to the model) is not silence: the editor cannot show it, and it costs what a rejection does.

Keeping quiet is learnt apart: the gradient above would have to make end-of-text the most likely
first token where the model is unsure, and the model almost never samples it. So after the
updates, with the recipe's `show_fit`, the trained model answers that many train-file requests
greedily, and the confidence below which not showing earned more under the same rewards becomes
its threshold (agent/confidence.py), kept in the model's flywheel.json: the language server and
the evaluation withhold what falls under it.

What a run writes: OUT/metrics.jsonl (one line per update), OUT/model (the updated checkpoint
with its threshold, written beside and renamed into place), and, unless `--no-register`, a registry candidate whose
lineage names the reward (`tab@2`) and the source. A killed run starts over cleanly: nothing is
written to OUT/model or the registry before the last update.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path

import torch

from telemetry.acceptance import Outcome, signals
from training.rl.grpo import group_advantages, group_rows, turn_row, zero_variance
from training.rl.recipe import RLRecipe
from training.rl.reward import RewardSpec
from training.rl.trajectory import Trajectory, Turn
from training.simulated_user import UserConfig, judge, prompt_for, requests


class TabError(ValueError):
    """The tab stage cannot run; the message says what to give it."""


def logged_outcomes(
    db_path: str, since: float = 0.0, workspace: str = ""
) -> list[tuple[Outcome, dict]]:
    """(outcome, its stored context) for each inline suggestion logged after `since` that can be
    learnt from: shown, with an outcome, and its code kept (consent `code`; metrics-only consent
    stores no context). With `workspace`, only those made in a file under that folder: one
    database holds every workspace the editor opened, and a repository learns its own."""
    from telemetry import open_db
    from telemetry.acceptance import outcomes_from_db

    if not Path(db_path).exists():
        raise TabError(f"no telemetry database at {db_path}: pass --telemetry-db or use --data")
    db = open_db(db_path, create=False)
    try:
        outcomes = outcomes_from_db(db.conn, since=since)
    finally:
        db.conn.close()
    inside = _under(workspace) if workspace else None
    out = []
    for o in outcomes:
        try:
            context = json.loads(o.extra.get("context") or "{}")
        except json.JSONDecodeError:
            continue
        if inside is not None and not inside(o.extra.get("document_uri") or ""):
            continue
        if o.shown and isinstance(context, dict) and "prefix" in context:
            out.append((o, context))
    return out


def _under(folder: str) -> Callable[[str], bool]:
    """Whether a document URI (or path) names a file inside `folder`."""
    from telemetry.privacy import uri_path

    root = Path(folder).expanduser().resolve()

    def inside(uri: str) -> bool:
        return bool(uri) and Path(uri_path(uri)).resolve().is_relative_to(root)

    return inside


def logged_samples(
    db_path: str, tokenizer, user: UserConfig, workspace: str = ""
) -> list[tuple[list[int], list[int], Outcome]]:
    """(prompt ids, output ids, outcome) for each logged inline suggestion with an outcome (under
    `workspace`, if given)."""
    from agent.chat_format import heal, render_repo_fim

    out = []
    room = user.seq_len - user.max_new_tokens
    for o, context in logged_outcomes(db_path, workspace=workspace):
        uri = context.get("path") or o.extra.get("document_uri") or "file.py"
        path = str(uri).rsplit("/", 1)[-1]
        prefix, healed = heal(str(context["prefix"]))  # as the server asked; it stored the rest
        prompt = render_repo_fim(
            str(context.get("repo", "")),
            [],
            path,
            prefix[-room * 2 :],
            str(context.get("suffix", ""))[:room],
        )
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"][-room:]
        said = healed + o.output + ("" if "\n" in o.output else "\n")
        output = tokenizer(said, add_special_tokens=False)
        out.append((ids, output["input_ids"][: user.max_new_tokens], o))
    return out


def _scored(
    spec: RewardSpec, task: str, i: int, turn: Turn, outcome: Outcome, unfit: bool = False
) -> Trajectory:
    """The sample scored by the recipe's rewards; `unfit`: its output could not be shown at the
    cursor (see tab@2)."""
    s = signals(outcome) | ({"unfit": True} if unfit else {})
    return spec.score(Trajectory(task, i, [turn], signals=s))


def simulated_group(policy, spec, cursor, context, repo, user, step, generator, tally) -> list:
    """Rows of one cursor's group (`group_size` sampled completions judged by the simulated
    user), or [] when every sample earned the same reward (no signal)."""
    from training.line_completion import complete_many

    recipe, tokenizer = policy.recipe, policy.tokenizer
    ids = prompt_for(tokenizer, repo, context, cursor, user)
    group = []
    samples = complete_many(
        policy.trunk,
        tokenizer,
        ids,
        recipe.group_size,
        recipe.max_tokens,
        recipe.temperature,
        generator,
        cursor.healed,
    )
    for i, done in enumerate(samples):
        outcome = judge(cursor, done.text, user)
        fate = "accepted" if outcome.accepted else "rejected" if outcome.shown else "declined"
        fate = fate if done.fits else "unfit"
        tally[fate] += 1
        turn = Turn(ids, done.ids, done.logprobs, step)
        task = f"{cursor.path}:{len(cursor.prefix)}"
        group.append(_scored(spec, task, i, turn, outcome, unfit=not done.fits))
    if zero_variance([t.reward for t in group]):
        return []
    return group_rows(group, step)[0]


def logged_batch(policy, spec, batch: list, step: int) -> list:
    """Rows of a batch of logged suggestions against the batch's mean reward (see the module
    docstring), or [] when their rewards are all equal."""
    scored = [
        _scored(spec, o.request_id, i, Turn(p, y, [0.0] * len(y), step), o)
        for i, (p, y, o) in enumerate(batch)
    ]
    rewards = [float(t.reward) for t in scored]
    if zero_variance(rewards):
        return []
    rows = []
    for t, adv in zip(scored, group_advantages(rewards), strict=True):
        turn = t.turns[0]
        row = turn_row(turn.prompt_ids, turn.output_ids, turn.logprobs, adv, 0)
        rows.append(_on_policy(policy.trunk, policy.recipe.temperature, row))
    return rows


def _simulated_source(data: str, user: UserConfig) -> tuple[str, list, list]:
    """(repository name, train files, the cursors the simulated user asks at) of `data`; empty
    without it."""
    from training.repo_pretrain import read_repo_data

    if not data:
        return "", [], []
    repo, train, _ = read_repo_data(data)
    cursors = requests(train, dataclasses.replace(user, max_requests=100_000))
    if not cursors:
        raise TabError(f"the train files of {data} offer no cursor to complete")
    return repo, train, cursors


def _logged_source(
    telemetry_db: str, workspace: str, tokenizer, user: UserConfig, simulated: bool, log
) -> list:
    """The logged samples of `telemetry_db` (none without it), under `workspace` if given; a
    database without any is an error unless the simulated user trains beside it."""
    logged = logged_samples(telemetry_db, tokenizer, user, workspace) if telemetry_db else []
    if telemetry_db and not logged:
        where = f" made under {workspace}" if workspace else ""
        none = (
            f"{telemetry_db} holds no inline suggestion{where} with code and an outcome (shown, "
            "then accepted or rejected, under consent 'code')"
        )
        if not simulated:
            raise TabError(f"{none}: use Flywheel in the editor, or train from --data")
        log(f"{none}: the simulated user alone")
    return logged


def train_tab(
    recipe: RLRecipe,
    *,
    data: str = "",
    telemetry_db: str = "",
    workspace: str = "",
    user: UserConfig | None = None,
    registry_root: str | Path | None = None,
    parent: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run `recipe.steps` updates (see the module docstring); returns the run's summary.
    `parent`: the registry version `recipe.init` is, recorded as the candidate's lineage;
    `workspace`: learn only from the suggestions logged in files under it."""
    from training.rl.policy import Policy

    if not data and not telemetry_db:
        raise TabError(
            "give --data (a repository split from `flywheel train repo`) or --telemetry-db"
        )
    user = user or UserConfig(seq_len=1024, max_new_tokens=recipe.max_tokens)
    spec = RewardSpec(recipe.rewards, recipe.effort_penalty, recipe.reward_version)
    policy = Policy.load(recipe.init, recipe)
    repo, train, cursors = _simulated_source(data, user)
    logged = _logged_source(telemetry_db, workspace, policy.tokenizer, user, bool(cursors), log)
    rng = random.Random(recipe.seed)
    generator = torch.Generator().manual_seed(recipe.seed)
    out = Path(recipe.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    metrics.write_text("")

    updates, tally = 0, {"accepted": 0, "rejected": 0, "declined": 0, "unfit": 0}
    for step in range(recipe.steps):
        rows, samples = [], 0
        policy.trunk.eval()
        for _ in range(recipe.tasks_per_step if cursors else 0):
            made = simulated_group(
                policy, spec, rng.choice(cursors), train, repo, user, step, generator, tally
            )
            rows, samples = rows + made, samples + (recipe.group_size if made else 0)
        if logged:
            batch = [logged[rng.randrange(len(logged))] for _ in range(recipe.tasks_per_step)]
            made = logged_batch(policy, spec, batch, step)
            rows, samples = rows + made, samples + len(made)
        policy.trunk.train()
        result = (
            policy.update(rows, samples)
            if rows
            else {"skipped": 1.0, "skip_reason": "no group with a learning signal"}
        )
        updates += not result.get("skipped")
        with metrics.open("a") as handle:
            handle.write(json.dumps({"step": step + 1, "rows": len(rows), **tally, **result}))
            handle.write("\n")
        if (step + 1) % recipe.log_every == 0:
            said = (
                f"skipped: {result.get('skip_reason')}"
                if result.get("skipped")
                else f"loss {result['loss']:.4f}"
            )
            log(f"tab step {step + 1}/{recipe.steps}: {len(rows)} rows, {tally}, {said}")
    summary = {
        "updates": updates,
        "steps": recipe.steps,
        "outcomes": tally,
        "reward": list(recipe.rewards),
        "reward_version": recipe.reward_version,
        "source": "+".join(
            n for n, used in (("simulated", cursors), ("telemetry", logged)) if used
        ),
        "workspace": workspace or None,  # the logged suggestions' folder (None: all of them)
        "model": None,
    }
    if not updates:
        log("no update was made (no group had a learning signal): nothing written or registered")
        return summary
    if cursors and recipe.show_fit:
        summary["show_threshold"] = fit_show_threshold(
            policy.trunk, policy.tokenizer, spec, repo, train, user, recipe
        )
        log(f"tab: suggestions show from confidence {summary['show_threshold']} up")
    return _finish(policy, recipe, summary, out, registry_root, parent, data, telemetry_db)


def fit_show_threshold(
    trunk, tokenizer, spec, repo, train, user: UserConfig, recipe
) -> float | None:
    """The trained model's threshold (agent/confidence.py): its greedy suggestions at
    `recipe.show_fit` requests of the simulated user on the train files (other cursors than the
    updates drew: another seed), each scored shown and not shown by the rewards of `spec`; None
    when showing every one earns the most."""
    from agent.confidence import fit_threshold
    from training.simulated_user import session

    user = dataclasses.replace(user, max_requests=recipe.show_fit, seed=recipe.seed + 1)
    outcomes = session(trunk, tokenizer, repo, train, train, user)
    none = Turn([], [], [], 0)
    quiet = Outcome("", "", False)
    scored = [
        (
            o.extra["confidence"],
            _scored(spec, o.request_id, 0, none, o).reward,
            _scored(spec, o.request_id, 0, none, quiet).reward,
        )
        for o in outcomes
    ]
    return fit_threshold(scored)


def _finish(policy, recipe, summary, out: Path, registry_root, parent, data, telemetry_db) -> dict:
    """OUT/model (written beside and renamed into place), then the registry candidate."""
    from agent.confidence import KEY

    meta = {
        "version": f"{recipe.name}-step{recipe.steps}",
        "stage": "tab",
        "recipe": recipe.name,
        "parent": policy.checkpoint.version,
        **summary,
    }
    if summary.get("show_threshold") is not None:
        meta[KEY] = summary["show_threshold"]
    summary["model"] = str(policy.export(out / "model", meta))
    if registry_root is not None:
        from agent.registry import Registry

        summary["version"] = Registry(registry_root).add(
            summary["model"],
            parent=parent,
            data={
                "source": summary["source"],
                "data": data,
                "telemetry_db": telemetry_db,
                "workspace": summary["workspace"],
            },
            recipe=recipe.to_dict(),
            reward=", ".join(f"{k} x {w:g}" for k, w in recipe.rewards.items()),
            note="completion RL from suggestion outcomes",
        )
    return summary


@torch.no_grad()
def _on_policy(trunk, temperature: float, row):
    """A logged row's sampling log-probabilities, taken as the current policy's (see above)."""
    device = next(trunk.parameters()).device
    logits = trunk(input_ids=torch.tensor([row.input_ids], device=device)).logits[0].float()
    logp = (
        (logits / temperature)
        .log_softmax(-1)
        .gather(-1, torch.tensor(row.targets, device=device)[:, None])
    )
    row.old_logprobs = [
        float(x) if m else 0.0 for x, m in zip(logp[:, 0].tolist(), row.mask, strict=True)
    ]
    return row
