"""Run by test_resume.py in a fresh process: one phase of a task that waits for approval.

    python -m tests.harness.resume_worker start|resume WORKSPACE CHECKPOINT_DB TELEMETRY_DB THREAD
Prints the outcome as one JSON line.
"""

from __future__ import annotations

import json
import sys

from agent.harness import Harness, HarnessConfig, Workspace
from telemetry.recorder import Recorder
from tests.harness.replay import ReplayEngine, call


def main(phase: str, ws: str, ckpt: str, tel: str, thread: str) -> None:
    # The replay engine holds what the model says in each phase of the task.
    turns = [call("delete_file", path="calc.py")] if phase == "start" else ["Deleted calc.py."]
    recorder = Recorder(tel)
    harness = Harness(
        ReplayEngine(turns),
        Workspace(ws),
        HarnessConfig(map_tokens=0),
        recorder=recorder,
        checkpoint_db=ckpt,
    )
    if phase == "start":
        out = harness.start("delete calc.py", thread_id=thread)
    else:
        out = harness.resume(thread, True)
    harness.close()
    recorder.close()
    print(
        json.dumps(
            {
                "stop_reason": out.stop_reason,
                "approval": out.approval,
                "final": out.final,
                "diff": out.diff,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
