"""The sample journal: a long benchmark run resumes where it stopped, or grows to more tasks.

With `--out`, every finished sample is appended to `samples.jsonl` in that folder:

    line 1   {"format": "flywheel-benchmark-samples/1", "model_version": ..., "settings": {...}}
    then     one SampleResult per line, in the order they finished

`--resume PATH` reads such a journal (a killed run leaves one) or a finished run's result JSON.
Its samples are reused, keyed by task id and sample index, when the model version and every
setting that changes a sample (seed, temperature, limits, lint) are the same; otherwise the run
stops and names the setting that differs. A last line cut short by a kill is ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.benchmark.result import FORMAT
from training.benchmark.sample import BenchConfig, SampleResult
from training.benchmark.sources import BenchmarkError

JOURNAL_FORMAT = "flywheel-benchmark-samples/1"
# BenchConfig fields that change what a sample does; the others only change the scoring.
SAMPLE_SETTINGS = (
    "seed",
    "temperature",
    "max_steps",
    "max_wall_s",
    "turn_max_tokens",
    "verify_timeout_s",
    "lint",
)


def sample_settings(config: BenchConfig | dict[str, Any]) -> dict[str, Any]:
    values = asdict(config) if isinstance(config, BenchConfig) else config
    return {k: values.get(k) for k in SAMPLE_SETTINGS}


@dataclass
class Previous:
    """Samples of an earlier run, with what they were run on."""

    path: str
    model_version: str
    settings: dict[str, Any]
    samples: list[SampleResult]

    def reusable(self, model_version: str, config: BenchConfig) -> dict[tuple[str, int], Any]:
        """(task id, sample index) -> sample, after checking that they were run the same way."""
        if self.model_version != model_version:
            raise BenchmarkError(
                f"{self.path} was run on model version {self.model_version}, this run is on "
                f"{model_version}; resume with the same model or drop --resume"
            )
        now = sample_settings(config)
        for key in SAMPLE_SETTINGS:
            if self.settings.get(key) != now[key]:
                raise BenchmarkError(
                    f"{self.path} was run with {key}={self.settings.get(key)}, this run has "
                    f"{key}={now[key]}; resume with the same settings or drop --resume"
                )
        return {(s.task_id, s.sample): s for s in self.samples}


def _sample(data: dict[str, Any]) -> SampleResult:
    return SampleResult(**{k: v for k, v in data.items() if k != "lint_delta"})


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def read_previous(path: str | Path) -> Previous:
    """A journal or a result JSON as `Previous`; BenchmarkError with one line when it is neither."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchmarkError(
            f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    lines = text.splitlines()
    data, header = _json(text), _json(lines[0]) if lines else None
    try:
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return Previous(
                str(path),
                str(data["model_version"]),
                sample_settings(data["config"]),
                [_sample(s) for s in data["samples"]],
            )
        if isinstance(header, dict) and header.get("format") == JOURNAL_FORMAT:
            samples = []
            for i, line in enumerate(lines[1:], 2):
                try:
                    samples.append(_sample(json.loads(line)))
                except (json.JSONDecodeError, TypeError):
                    if i == len(lines):  # the line a kill cut short
                        break
                    raise
            return Previous(str(path), str(header["model_version"]), header["settings"], samples)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise BenchmarkError(f"{path}: damaged benchmark samples ({exc})") from None
    raise BenchmarkError(f"{path} is neither a benchmark result JSON nor a samples.jsonl journal")


class Journal:
    """Appends each finished sample to `path`, flushed, so a kill loses at most the running one."""

    def __init__(
        self, path: str | Path, model_version: str, config: BenchConfig, reused: list[SampleResult]
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = {
            "format": JOURNAL_FORMAT,
            "model_version": model_version,
            "settings": sample_settings(config),
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        lines = [json.dumps(header)] + [json.dumps(asdict(s)) for s in reused]
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, self.path)  # a resume from this very file has read it already

    def add(self, sample: SampleResult) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(sample)) + "\n")
            f.flush()
            os.fsync(f.fileno())
