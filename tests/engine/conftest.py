"""Engine fixtures: `engine` runs the behavioural tests on every backend, plus livelier tiny models.

`engine` is parametrized over backends. Each param yields an object implementing
`agent.engine.Engine` over the `tiny_checkpoint` weights; tests in test_engine_behaviour.py use
only the Protocol, so a backend joins by adding its name to `params` and a branch below.

A randomly initialised tiny model with the usual 0.02 init repeats its last token forever (tied
embeddings dominate the residual stream), which makes greedy-equivalence tests weak: the
`lively_*` checkpoints re-initialise the weights with a larger spread so greedy output varies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import make_checkpoint

# local-thread: the local engine on its own thread (EngineConfig.own_thread, as servers run it);
# openai: OpenAIEngine over a real `flywheel serve` subprocess
BACKENDS = ["local", "local-thread", "openai"]


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread():
    """Tiny models run fastest on one thread, and the test machine's cores are shared: several
    threads per process oversubscribe them and make every forward call many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=BACKENDS)
def engine(request, tiny_checkpoint):
    from agent.engine import EngineConfig, open_engine

    if request.param in ("local", "local-thread"):
        own = request.param == "local-thread"
        eng = open_engine(EngineConfig(model=str(tiny_checkpoint), backend="local", own_thread=own))
    elif request.param == "openai":
        url = request.getfixturevalue("tiny_checkpoint_server")  # started only when needed
        eng = open_engine(EngineConfig(model=url, backend="openai"))
    else:  # pragma: no cover - a new backend must add its branch
        raise AssertionError(f"no set-up for backend {request.param!r}")
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def tiny_checkpoint_server(tiny_checkpoint):
    """`flywheel serve` over `tiny_checkpoint` on a free 127.0.0.1 port, once per session."""
    from tests.flywheel_server import running_server

    with running_server(tiny_checkpoint) as url:
        yield url


def make_lively_checkpoint(folder: Path, tokenizer, seed: int, std: float = 0.15) -> Path:
    """A tiny checkpoint (with MTP heads) whose matrices are drawn with standard deviation `std`."""
    from agent.model import load_checkpoint, save_checkpoint

    make_checkpoint(folder, tokenizer, seed=seed)
    checkpoint = load_checkpoint(folder)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in (checkpoint.trunk, checkpoint.heads):
            for param in module.parameters():
                if param.ndim == 2:
                    param.normal_(0.0, std, generator=generator)
    return save_checkpoint(
        folder, checkpoint.trunk, tokenizer, checkpoint.heads, meta={"version": f"lively{seed}"}
    )


@pytest.fixture(scope="session")
def lively_checkpoint(tmp_path_factory, tokenizer) -> Path:
    return make_lively_checkpoint(tmp_path_factory.mktemp("lively0"), tokenizer, seed=0)


@pytest.fixture(scope="session")
def lively_checkpoint_b(tmp_path_factory, tokenizer) -> Path:
    return make_lively_checkpoint(tmp_path_factory.mktemp("lively1"), tokenizer, seed=1)
