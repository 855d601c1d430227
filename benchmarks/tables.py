"""Assemble tables from several result files:
``python -m benchmarks.tables results/*/results.json --out tables.md [--plot curves.png]``.

Runs are grouped by (task LM, prompt LM), like the paper's per-model blocks; within a group the
benchmarks of all files are put side by side (a later file overrides an earlier one for the same
benchmark and optimizer). The average gain is over the benchmarks each optimizer has results for.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.report import markdown_report, plot_curves


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tables", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("files", nargs="+", help="results.json files written by benchmarks.run")
    p.add_argument("--out", required=True, help="Markdown file to write")
    p.add_argument("--plot", default=None, help="also write the validation curves to this PNG")
    args = p.parse_args(argv)
    results = []
    for name in args.files:
        path = Path(name)
        if path.is_dir():
            path = path / "results.json"
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown_report(results), encoding="utf-8")
    if args.plot:
        plot_curves(results, Path(args.plot))
    print(f"wrote {out}" + (f" and {args.plot}" if args.plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
