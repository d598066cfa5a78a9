"""Task generation: projects from the templates in turn, their edit and bug-fix tasks, verified.

Each project draws from its own seeded generator, so the tasks do not depend on how many worker
processes build them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from training.tasks.bugfix import bugfix_tasks
from training.tasks.edit import edit_tasks
from training.tasks.projects import make_project, project_files, verify_command
from training.tasks.task import Task, TaskRejected, run_tests, verify
from training.tasks.templates import TEMPLATES


def generate_tasks(
    projects: int,
    seed: int = 0,
    heldout_fraction: float = 0.1,
    bugs_per_project: int = 3,
    log: Callable[[str], None] | None = None,
    workers: int = 1,
    templates: list[str] | None = None,
    pytest_fraction: float = 0.0,
) -> list[Task]:
    """Tasks from `projects` projects (templates in turn), every one verified by running tests.

    `templates` picks which templates take turns (default: all). A `pytest_fraction` of the
    projects, drawn per project from the seed, have pytest test files instead of unittest ones.

    With `workers` > 1 the projects are built in that many processes; the tasks are the same
    (each project draws from its own seeded generator) and come back in project order.
    """
    names = sorted(templates or TEMPLATES)
    unknown = sorted(set(names) - set(TEMPLATES))
    if unknown:
        raise ValueError(f"unknown templates {unknown}; known: {sorted(TEMPLATES)}")
    jobs = []
    for i in range(projects):
        project_seed = seed * 100_000 + i
        draw = random.Random(f"style:{project_seed}").random()
        style = "pytest" if draw < pytest_fraction else "unittest"
        jobs.append(
            (names[i % len(names)], project_seed, style, heldout_fraction, bugs_per_project)
        )
    tasks: list[Task] = []
    rejected = 0
    for project_tasks, rejections in in_order(_project_tasks, jobs, workers):
        tasks += project_tasks
        rejected += len(rejections)
        for line in rejections if log else ():
            log(line)
    if log:
        log(f"{len(tasks)} tasks from {projects} projects ({rejected} edit candidates rejected)")
    return tasks


def _project_tasks(job: tuple[str, int, str, float, int]) -> tuple[list[Task], list[str]]:
    """One project's verified tasks and the rejected candidates' reasons (a worker's unit)."""
    template, project_seed, style, heldout_fraction, bugs_per_project = job
    project = make_project(template, project_seed, style)
    code, output = run_tests(project_files(project), verify_command(project))
    if code != 0:  # a template bug, not a task: say so loudly
        raise RuntimeError(f"project {project.key} does not pass its own tests:\n{output[-800:]}")
    rng = random.Random(f"tasks:{project.key}")
    tasks, rejections = [], []
    for task in edit_tasks(project, rng, heldout_fraction):
        try:
            tasks.append(verify(task))
        except TaskRejected as exc:
            rejections.append(f"rejected {project.key}: {exc}")
    tasks += bugfix_tasks(project, rng, heldout_fraction, bugs_per_project)
    return tasks, rejections


def in_order(fn: Callable, items: list, workers: int):
    """`map(fn, items)`, in `workers` processes when > 1; results in the order of `items`.

    Generating and exporting tasks waits mostly on the test subprocesses, not on the CPU, so
    several processes overlap those waits even on few cores.
    """
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
    with ProcessPoolExecutor(min(workers, len(items)), mp_context=context) as pool:
        yield from pool.map(fn, items)


def default_workers() -> int:
    """Processes for task generation: twice the cores (the work waits on subprocesses), <= 8."""
    return max(1, min(8, 2 * (os.cpu_count() or 1)))
