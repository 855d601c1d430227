"""The ``agentgrad`` console command (also ``python -m dspy_agentgrad``).

agentgrad demo [options]           run the main job (see ``agentgrad demo --help``)
agentgrad report LOG_DIR [--png]   rebuild report.html (and the PNG charts) from LOG_DIR/result.json
agentgrad estimate MODULE:FUNC     project a run's cost before paying for it
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from .arguments import ArgumentParser, at_least, folder
from .reporting.estimate import SAMPLE_SIZE

ESTIMATE_HELP = """\
MODULE:FUNC names a function that takes no arguments and returns a mapping with keys
"optimizer" (an AgentGrad), "program", "trainset" and optionally "valset": the same
objects you would pass to compile. It should configure the LMs (dspy.configure) too.
The estimate pays for one round in small on --sample-size training examples (their runs
and hinted runs, and one rewrite per blamed predictor run on its failures; it says what
that paid) and prints projected metric calls, LM calls and tokens, USD and wall time."""


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="agentgrad",
        description="AgentGrad, a DSPy prompt optimizer for multi-module programs: demo, reports, cost estimates.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "demo",
        add_help=False,
        help="run AgentGrad on the demo task, offline with the embedded LM (options: agentgrad demo --help)",
    )
    report = sub.add_parser(
        "report",
        help="write LOG_DIR/report.html (and with --png the PNG charts) from a run's LOG_DIR/result.json",
        description="Rebuild the HTML report of a finished run from LOG_DIR/result.json, and with --png its charts "
        "as validation_curve.png and attributions.png (needs matplotlib).",
    )
    report.add_argument("log_dir", type=folder, metavar="LOG_DIR", help="the log_dir the run was compiled with")
    report.add_argument("--png", action="store_true", help="also draw the two charts as PNG files (matplotlib)")
    estimate = sub.add_parser(
        "estimate",
        help="project metric calls, LM calls, tokens, USD and wall time of a run before it starts",
        description=ESTIMATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    estimate.add_argument("job", metavar="MODULE:FUNC", help="e.g. my_project.optimize:job")
    estimate.add_argument(
        "--sample-size",
        type=at_least(1),
        default=SAMPLE_SIZE,
        help=f"training examples to sample (default {SAMPLE_SIZE}, as AgentGrad.estimate)",
    )
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    return parser


def _job_function(spec: str) -> Callable[[], object]:
    """The function ``module:function`` names, imported from the current folder (or an argument error)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNC (e.g. my_project.optimize:job), got {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise argparse.ArgumentTypeError(f"cannot import {module_name!r} from {Path.cwd()}: {exc}") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise argparse.ArgumentTypeError(f"{module_name} has no function {attr!r}")
    return function


def _job_problems(job: object) -> str | None:
    """What is wrong with what a job function returned, or None."""
    import dspy

    from .teleprompter import AgentGrad

    if not isinstance(job, Mapping):
        return f"returned a {type(job).__name__}, not a mapping"
    missing = [k for k in ("optimizer", "program", "trainset") if k not in job]
    if missing:
        return f"returned no {', '.join(map(repr, missing))}"
    wrong = [
        f"{k!r} is a {type(job[k]).__name__}, not a {t.__name__}"
        for k, t in (("optimizer", AgentGrad), ("program", dspy.Module))
        if not isinstance(job[k], t)
    ]
    for key in ("trainset", "valset"):
        value = job.get(key)
        if value is not None and (isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable)):
            wrong.append(f"{key!r} is a {type(value).__name__}, not a list of dspy.Example")
    return "; ".join(wrong) or None


def load_job(spec: str, parser: argparse.ArgumentParser | None = None) -> Mapping:
    """Import ``module:function``, call it, and check what it returned; a wrong ``spec`` or a return value of the
    wrong shape is an argument error (exit status 2, before anything is paid)."""
    parser = parser or _parser()
    try:
        function = _job_function(spec)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"argument MODULE:FUNC: {exc}")
    job = function()
    problem = _job_problems(job)
    if problem:
        parser.error(f"argument MODULE:FUNC: {spec} {problem} (see agentgrad estimate --help)")
    return job


def main(argv: list[str] | None = None) -> None:
    """The `agentgrad` command (and `python -m dspy_agentgrad`): parse ``argv`` and run the subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo.supervisor import run_supervised

        code = run_supervised(rest)
        if code:
            raise SystemExit(code)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "report":
        from .reporting.report import write_report

        try:
            page = write_report(args.log_dir, pngs=args.png)
        except FileNotFoundError as exc:
            parser.error(f"argument LOG_DIR: {exc}")
        except (ImportError, ValueError) as exc:
            raise SystemExit(f"agentgrad report: {exc}") from None
        print(f"wrote {page}" + (f" and the PNG charts in {args.log_dir}" if args.png else ""))
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    job = load_job(args.job, parser)
    estimate = job["optimizer"].estimate(
        job["program"], trainset=job["trainset"], valset=job.get("valset"), sample_size=args.sample_size
    )
    print(json.dumps(estimate.to_dict(), indent=2) if args.json else estimate.summary())


if __name__ == "__main__":
    main()
