"""Synthetic verifiable tasks (SWE-smith style), their oracle trajectories and fast-apply examples.

    names.py       name pools: modules, helpers, classes, verbs and nouns
    templates.py   the eight project templates
    projects.py    a template made concrete: module, helper module, passing test file
    task.py        the Task record, its split, verification by running its tests
    edit.py        edit families (instruction-explicit changes) and bodies to write
    bugfix.py      bug-fix families (one-token mutations the tests catch)
    generation.py  projects -> verified tasks, in worker processes
    oracle.py      correct trajectories in the harness's chat format, and recovery ones
    fast_apply.py  original file + edit sketch -> updated file examples
    dataset.py     export to and load from tasks.jsonl and its companions

Vocabulary used throughout:

    project    a small Python package made from a template with random names and constants:
               a module, a helper module that calls it, and a test file (unittest or pytest)
               whose expected values were computed by running the module itself
    task       an instruction, the workspace files before, the reference solution (the files
               that change, with their new text) and the verifying command; a task is kept only
               if its verifying command FAILS on the workspace and PASSES on the solution, both
               checked by running it in a subprocess at generation time
    family     how a task was made: `edit/...` (instruction-explicit edits; the tests describe
               the target), `rewrite/body` (a function's body replaced by `raise
               NotImplementedError`, to be written from its docstring or its tests) or
               `bugfix/...` (working code mutated; the tests are the original, passing ones)
    oracle     writes a correct trajectory for a task in the harness's chat format (OpenAI-shaped
               messages: assistant `tool_calls`, tool results as role "tool"), running every
               tool call for real on a scratch copy of the workspace
    fast-apply an original file plus an edit sketch (changed lines with `... existing code ...`
               markers) -> the whole updated file

What it does not do: languages other than Python, multi-package repositories, tasks needing the
network.

    flywheel train tasks --out runs/starter/tasks --projects 200
"""

from training.tasks.bugfix import Mutation, bugfix_tasks, mutations
from training.tasks.dataset import export, load_tasks, stable_sha256, stable_text
from training.tasks.edit import edit_tasks
from training.tasks.fast_apply import edit_sketch, fast_apply_example
from training.tasks.generation import default_workers, generate_tasks, in_order
from training.tasks.oracle import (
    MISTAKES,
    HarnessScratch,
    apply_hunks,
    hunks_for,
    oracle_trajectory,
    task_tools_config,
)
from training.tasks.projects import (
    PYTEST_COMMAND,
    TEST_COMMAND,
    TEST_STYLES,
    Project,
    make_project,
    project_files,
    verify_command,
    write_tests,
)
from training.tasks.task import TEST_TIMEOUT_S, Task, TaskRejected, run_tests, verify
from training.tasks.templates import TEMPLATES

__all__ = [
    "MISTAKES",
    "PYTEST_COMMAND",
    "TEMPLATES",
    "TEST_COMMAND",
    "TEST_STYLES",
    "TEST_TIMEOUT_S",
    "HarnessScratch",
    "Mutation",
    "Project",
    "Task",
    "TaskRejected",
    "apply_hunks",
    "bugfix_tasks",
    "default_workers",
    "edit_sketch",
    "edit_tasks",
    "export",
    "fast_apply_example",
    "generate_tasks",
    "hunks_for",
    "in_order",
    "load_tasks",
    "make_project",
    "mutations",
    "oracle_trajectory",
    "project_files",
    "run_tests",
    "stable_sha256",
    "stable_text",
    "task_tools_config",
    "verify_command",
    "verify",
    "write_tests",
]
