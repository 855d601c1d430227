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
from collections.abc import Mapping
from pathlib import Path

from .reporting.estimate import SAMPLE_SIZE

ESTIMATE_HELP = """\
MODULE:FUNC names a function that takes no arguments and returns a mapping with keys
"optimizer" (an AgentGrad), "program", "trainset" and optionally "valset": the same
objects you would pass to compile. It should configure the LMs (dspy.configure) too.
The estimate pays for one round in small on --sample-size training examples (their runs
and hinted runs, and one rewrite per blamed predictor run on its failures; it says what
that paid) and prints projected metric calls, LM calls and tokens, USD and wall time."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    report.add_argument("log_dir", type=Path, metavar="LOG_DIR", help="the log_dir the run was compiled with")
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
        type=int,
        default=SAMPLE_SIZE,
        help=f"training examples to sample (default {SAMPLE_SIZE}, as AgentGrad.estimate)",
    )
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    return parser


def load_job(spec: str) -> Mapping:
    """Import ``module:function``, call it, and check what it returned."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"agentgrad estimate: expected MODULE:FUNC, got {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        job = getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"agentgrad estimate: cannot load {spec!r}: {exc}") from None
    missing = [k for k in ("optimizer", "program", "trainset") if not isinstance(job, Mapping) or k not in job]
    if missing:
        raise SystemExit(f"agentgrad estimate: {spec} must return a mapping with keys {missing} (see --help)")
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
        except (FileNotFoundError, ImportError, ValueError) as exc:
            raise SystemExit(f"agentgrad report: {exc}") from None
        print(f"wrote {page}" + (f" and the PNG charts in {args.log_dir}" if args.png else ""))
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    job = load_job(args.job)
    estimate = job["optimizer"].estimate(
        job["program"], trainset=job["trainset"], valset=job.get("valset"), sample_size=args.sample_size
    )
    print(json.dumps(estimate.to_dict(), indent=2) if args.json else estimate.summary())


if __name__ == "__main__":
    main()
